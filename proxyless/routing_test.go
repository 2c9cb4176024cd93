package proxyless

import (
	"testing"

	networkingapi "istio.io/api/networking/v1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
)

// TestProxylessClientRouting: grpc-go's xDS client, subscribed to
// canopy-controller as a proxyless gRPC application, reaches a Service's
// pods; a DestinationRule's subsets and a VirtualService's header match
// and weights then decide which pod answers.
func TestProxylessClientRouting(t *testing.T) {
	testenv.Need(t, env)
	if testing.Short() {
		t.Skip("builds and runs the controller")
	}
	ctx := t.Context()
	sys := env.Namespace(t, "canopy-system", nil)
	c := startController(t, sys)
	ns, ips := echoApp(t, 2)
	podAt(t, ns, "echo-v1", ips[0], map[string]string{"app": "echo", "version": "v1"})
	podAt(t, ns, "echo-v2", ips[1], map[string]string{"app": "echo", "version": "v2"})

	conn := xdsClient(t, c, ns, "client", "xds:///echo."+ns+".svc.cluster.local:7070")
	v1, v2 := ips[0], ips[1]

	eventually.Within(t, settle, "calls reach both pods", func() bool {
		got := calls(ctx, conn, 20)
		return got[v1] > 0 && got[v2] > 0
	})

	istio, err := istioclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := istio.NetworkingV1().DestinationRules(ns).Create(ctx, &networkingv1.DestinationRule{
		ObjectMeta: metav1.ObjectMeta{Name: "echo"},
		Spec: networkingapi.DestinationRule{Host: "echo", Subsets: []*networkingapi.Subset{
			{Name: "v1", Labels: map[string]string{"version": "v1"}},
			{Name: "v2", Labels: map[string]string{"version": "v2"}},
		}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dest := func(subset string, weight int32) *networkingapi.HTTPRouteDestination {
		return &networkingapi.HTTPRouteDestination{Destination: &networkingapi.Destination{Host: "echo", Subset: subset}, Weight: weight}
	}
	if _, err := istio.NetworkingV1().VirtualServices(ns).Create(ctx, &networkingv1.VirtualService{
		ObjectMeta: metav1.ObjectMeta{Name: "echo"},
		Spec: networkingapi.VirtualService{Hosts: []string{"echo"}, Http: []*networkingapi.HTTPRoute{
			{
				Name:  "canary",
				Match: []*networkingapi.HTTPMatchRequest{{Headers: map[string]*networkingapi.StringMatch{"x-canary": {MatchType: &networkingapi.StringMatch_Exact{Exact: "yes"}}}}},
				Route: []*networkingapi.HTTPRouteDestination{dest("v2", 0)},
			},
			{Name: "split", Route: []*networkingapi.HTTPRouteDestination{dest("v1", 90), dest("v2", 10)}},
		}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The header match sends every call to v2.
	eventually.Within(t, settle, "calls with x-canary: yes all reach v2", func() bool {
		got := calls(ctx, conn, 20, "x-canary", "yes")
		return got[v2] == 20
	})
	// The split: 90 to 10. Of 400 calls v2 takes 40 on average (standard
	// deviation 6); between 10 and 90 is far outside chance.
	got := calls(ctx, conn, 400)
	if got[v1]+got[v2] != 400 || got[v2] < 10 || got[v2] > 90 {
		t.Errorf("400 calls under a 90/10 split: %v; want all answered, v2 (%s) taking 10 to 90", got, v2)
	}
	if n := c.nacks(t); n != "" {
		t.Errorf("the client rejected responses: %s", n)
	}
}
