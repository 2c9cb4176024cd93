package authn

import (
	"context"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedauthv1 "k8s.io/client-go/kubernetes/typed/authentication/v1"
)

// Reviewer is a TokenReviewer over an API server's TokenReview API.
type Reviewer struct {
	Client typedauthv1.TokenReviewsGetter
}

// Review implements TokenReviewer.
func (r Reviewer) Review(ctx context.Context, token string, audiences []string) (authenticationv1.TokenReviewStatus, error) {
	tr, err := r.Client.TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: audiences},
	}, metav1.CreateOptions{})
	if err != nil {
		return authenticationv1.TokenReviewStatus{}, err
	}
	return tr.Status, nil
}
