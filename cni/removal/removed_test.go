package removal

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestRemovedDecision: what a stopping agent concludes from the DaemonSet
// as the API server shows it, once Run has learned its owner. Run's watch
// needs a real API server (removal_test.go); here the owner is set as Run
// sets it.
func TestRemovedDecision(t *testing.T) {
	t.Parallel()
	const ns, name = "istio-system", "canopy-cni"
	owner := metav1.OwnerReference{APIVersion: "apps/v1", Kind: "DaemonSet", Name: name, UID: "uid-1", Controller: new(true)}
	ds := func(uid types.UID, deleting bool) *appsv1.DaemonSet {
		d := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: uid}}
		if deleting {
			d.DeletionTimestamp = &metav1.Time{}
			d.Finalizers = []string{"foregroundDeletion"}
		}
		return d
	}
	dsResource := schema.GroupResource{Group: "apps", Resource: "daemonsets"}
	for _, tt := range []struct {
		name    string
		objects []runtime.Object
		// getErr, if set, is what a get of the DaemonSet returns.
		getErr error
		// marked: the watch already saw the removal; markedLate: it sees
		// it while Removed waits.
		marked, markedLate bool
		noOwner            bool
		want               bool
		wantErr            bool
	}{
		{name: "unchanged (an upgrade replaces only the pod)", objects: []runtime.Object{ds("uid-1", false)}, want: false},
		{name: "being deleted", objects: []runtime.Object{ds("uid-1", true)}, want: true},
		{name: "gone", want: true},
		{name: "replaced by another of the same name", objects: []runtime.Object{ds("uid-2", false)}, want: true},
		{name: "RBAC already deleted", getErr: apierrors.NewForbidden(dsResource, name, errors.New("no role")), wantErr: true},
		{name: "service account already deleted", getErr: apierrors.NewUnauthorized("invalid token"), wantErr: true},
		{name: "API server unreachable", getErr: errors.New("dial tcp: connection refused"), wantErr: true},
		// The watch's answer stands even when nothing can be asked any more.
		{name: "RBAC deleted, the watch a moment late", markedLate: true, getErr: apierrors.NewForbidden(dsResource, name, errors.New("no role")), want: true},
		{name: "service account deleted, the watch a moment late", markedLate: true, getErr: apierrors.NewUnauthorized("invalid token"), want: true},
		{name: "seen by the watch, RBAC deleted since", marked: true, getErr: apierrors.NewForbidden(dsResource, name, errors.New("no role")), want: true},
		{name: "seen by the watch, recreated since", marked: true, objects: []runtime.Object{ds("uid-1", false)}, want: true},
		// Not run by a DaemonSet, or its pod never read: never uninstall.
		{name: "owner unknown", noOwner: true, objects: []runtime.Object{ds("uid-1", true)}, wantErr: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			kube := fake.NewClientset(tt.objects...)
			if tt.getErr != nil {
				kube.PrependReactor("get", "daemonsets", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, tt.getErr
				})
			}
			w := New(kube, ns, "canopy-cni-abcde", slog.New(slog.DiscardHandler))
			if !tt.noOwner {
				w.owner.Store(&owner)
			}
			if tt.marked {
				w.mark("test")
			}
			if tt.markedLate {
				time.AfterFunc(100*time.Millisecond, func() { w.mark("test") })
			}
			// Unanswered, Removed waits for the watch until its context
			// ends: as long as a stopping agent would.
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
			defer cancel()
			got, err := w.Removed(ctx)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("Removed() = %v, %v; want %v, error %v", got, err, tt.want, tt.wantErr)
			}
			if err != nil && got {
				t.Error("Removed() says removed together with an error")
			}
		})
	}
}
