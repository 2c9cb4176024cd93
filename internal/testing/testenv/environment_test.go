package testenv_test

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/canopy-mesh/canopy/internal/testing/testenv"
)

var env *testenv.Environment

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

func TestServerVersionParses(t *testing.T) {
	testenv.Need(t, env)
	t.Parallel()
	info, err := env.Client.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	v, err := version.ParseSemantic(info.GitVersion)
	if err != nil {
		t.Fatalf("server version %q does not parse: %v", info.GitVersion, err)
	}
	if v.Major() != 1 || v.Minor() < 34 {
		t.Errorf("server version %s, want 1.34 or later", v)
	}
}

func TestKubeconfigWorks(t *testing.T) {
	testenv.Need(t, env)
	t.Parallel()
	cfg, err := clientcmd.BuildConfigFromFlags("", env.KubeconfigPath)
	if err != nil {
		t.Fatal(err)
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().Namespaces().Get(t.Context(), "default", metav1.GetOptions{}); err != nil {
		t.Fatalf("get namespace default through the kubeconfig: %v", err)
	}
}

// TestPodServiceEndpointsAndTokens walks the path every later Canopy test
// relies on: objects created, a pod made Running and Ready through the status
// subresource, its EndpointSlice written by the controller manager, and a
// pod-bound token for the CA's audience that a TokenReview resolves to the
// pod.
func TestPodServiceEndpointsAndTokens(t *testing.T) {
	testenv.Need(t, env)
	t.Parallel()
	ctx := t.Context()
	c := env.Client
	ns := env.Namespace(t, "endpoints", nil)

	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: "node-",
			Labels:       map[string]string{"topology.kubernetes.io/zone": "zone-a"},
		},
	}
	node, err := c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create node: %v", err)
	}
	t.Cleanup(func() {
		_ = c.CoreV1().Nodes().Delete(context.Background(), node.Name, metav1.DeleteOptions{})
	})

	pod, err := c.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "echo-1", Labels: map[string]string{"app": "echo"}},
		Spec: corev1.PodSpec{
			NodeName:   node.Name,
			Containers: []corev1.Container{{Name: "echo", Image: "canopy/echo", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod: %v", err)
	}
	if _, err := c.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "echo"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create service: %v", err)
	}

	// What a kubelet would report: Running, an IP, Ready.
	status := map[string]any{"status": corev1.PodStatus{
		Phase:  corev1.PodRunning,
		PodIP:  "10.244.1.5",
		PodIPs: []corev1.PodIP{{IP: "10.244.1.5"}},
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()},
		},
	}}
	patch, err := json.Marshal(status)
	if err != nil {
		t.Fatal(err)
	}
	pod, err = c.CoreV1().Pods(ns).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	if err != nil {
		t.Fatalf("patch pod status: %v", err)
	}
	if pod.Status.PodIP != "10.244.1.5" || pod.Status.Phase != corev1.PodRunning {
		t.Fatalf("pod status after patch: %+v", pod.Status)
	}

	var endpoint discoveryv1.Endpoint
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		slices, err := c.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=echo"})
		if err != nil {
			return false, err
		}
		for _, s := range slices.Items {
			for _, ep := range s.Endpoints {
				if ep.TargetRef != nil && ep.TargetRef.UID == pod.UID {
					endpoint = ep
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("wait for the pod in the service's EndpointSlice: %v", err)
	}
	if !slices.Equal(endpoint.Addresses, []string{"10.244.1.5"}) || !ptr.Deref(endpoint.Conditions.Ready, false) ||
		ptr.Deref(endpoint.NodeName, "") != node.Name {
		t.Errorf("endpoint = %+v, want address 10.244.1.5, ready, on node %s", endpoint, node.Name)
	}

	token, err := env.Token(ctx, ns, "default", testenv.TokenOptions{Audiences: []string{"istio-ca"}, Pod: pod})
	if err != nil {
		t.Fatal(err)
	}
	review := func(audiences ...string) authenticationv1.TokenReviewStatus {
		t.Helper()
		r, err := c.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
			Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: audiences},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("token review: %v", err)
		}
		return r.Status
	}

	got := review("istio-ca")
	if !got.Authenticated {
		t.Fatalf("token review for audience istio-ca: not authenticated: %s", got.Error)
	}
	if want := "system:serviceaccount:" + ns + ":default"; got.User.Username != want {
		t.Errorf("username = %q, want %q", got.User.Username, want)
	}
	if podName := got.User.Extra["authentication.kubernetes.io/pod-name"]; !slices.Equal(podName, []string{pod.Name}) {
		t.Errorf("pod-name extra = %v, want [%s]", podName, pod.Name)
	}
	if podUID := got.User.Extra["authentication.kubernetes.io/pod-uid"]; !slices.Equal(podUID, []string{string(pod.UID)}) {
		t.Errorf("pod-uid extra = %v, want [%s]", podUID, pod.UID)
	}
	if !slices.Contains(got.Audiences, "istio-ca") {
		t.Errorf("audiences = %v, want istio-ca", got.Audiences)
	}
	if other := review("some-other-audience"); other.Authenticated {
		t.Error("token for audience istio-ca passed a review for another audience")
	}
}

// TestRBACIsEnforced shows that service-account credentials get only what
// RBAC grants, so later tests can prove components run with least privilege.
func TestRBACIsEnforced(t *testing.T) {
	testenv.Need(t, env)
	t.Parallel()
	ctx := t.Context()
	ns := env.Namespace(t, "rbac", nil)
	token, err := env.Token(ctx, ns, "default", testenv.TokenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := kubernetes.NewForConfig(env.ConfigWithToken(token))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("list secrets as %s/default: err = %v, want Forbidden", ns, err)
	}
}

// TestDeploymentControllersRun shows the deployment and replicaset
// controllers create pods, and the garbage collector removes them with
// their owner.
func TestDeploymentControllersRun(t *testing.T) {
	testenv.Need(t, env)
	t.Parallel()
	ctx := t.Context()
	c := env.Client
	ns := env.Namespace(t, "deploy", nil)
	labels := map[string]string{"app": "web"}
	d, err := c.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "canopy/echo"}}},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create deployment: %v", err)
	}
	podCount := func(want int) error {
		return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			pods, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
			if err != nil {
				return false, err
			}
			return len(pods.Items) == want, nil
		})
	}
	if err := podCount(2); err != nil {
		t.Fatalf("wait for 2 pods of the deployment: %v", err)
	}
	if err := c.AppsV1().Deployments(ns).Delete(ctx, d.Name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}); err != nil {
		t.Fatal(err)
	}
	if err := podCount(0); err != nil {
		t.Fatalf("wait for the garbage collector to delete the pods: %v", err)
	}
}
