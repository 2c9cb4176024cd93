package controlplane_test

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"golang.org/x/sync/errgroup"
	networkingapi "istio.io/api/networking/v1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// Names and ports every mesh uses.
const (
	// servicePort is every Service's port, named for gRPC; it targets
	// targetPort, the pods' container port.
	servicePort = 8080
	targetPort  = 9080
	// clientAccount is the service account of the client pods, which the
	// clients' tokens are minted for.
	clientAccount = "client"
	// podAccount is the service account of the Services' pods.
	podAccount = "default"
	// writers bounds the fixture's concurrent API requests: enough to keep
	// the API server busy, few enough that 2 cores still schedule the rest.
	writers = 32
)

// mesh is the cluster a scenario runs against, as both control planes see
// it through the API server: namespaces ns-0… with Services svc-<i> (in
// ns-<i mod Namespaces>), each selecting EndpointsPerService Ready pods
// svc-<i>-<j> (labels app=svc-<i>, version=v<j mod 2>) spread over Nodes
// nodes in as many zones; kube-controller-manager writes their
// EndpointSlices, as in a real cluster. Every VirtualServiceEvery-th
// Service has a DestinationRule with subsets v0 and v1 and a
// VirtualService splitting 90/10 between them. Clients client pods
// client-<k> (service account "client") stand for the proxies.
//
// What is read where: canopy-controller builds endpoints from the pods
// (IPs, readiness, labels) and the Services that select them
// (controller/kubeinput: namespaces, nodes, pods, Services,
// EndpointSlices and the Istio resources); istiod builds them from the
// EndpointSlices, with labels and locality from the pods and nodes. Both
// see the same endpoints only once the EndpointSlices are complete, which
// write waits for.
type mesh struct {
	Namespaces          int
	Services            int
	EndpointsPerService int
	VirtualServiceEvery int
	Nodes               int
	Clients             int
	// NamespaceLabels label every ns-<n>, e.g. for ambient enrollment.
	NamespaceLabels map[string]string
}

func (m mesh) namespace(i int) string { return fmt.Sprintf("ns-%d", i%m.Namespaces) }
func (m mesh) service(i int) string   { return fmt.Sprintf("svc-%d", i) }
func (m mesh) host(i int) string      { return m.service(i) + "." + m.namespace(i) + ".svc.cluster.local" }
func (m mesh) pod(i, j int) string    { return fmt.Sprintf("svc-%d-%d", i, j) }
func (m mesh) hasVirtualService(i int) bool {
	return m.VirtualServiceEvery > 0 && i%m.VirtualServiceEvery == 0
}
func (m mesh) podLabels(i, j int) map[string]string {
	return map[string]string{"app": m.service(i), "version": fmt.Sprintf("v%d", j%2)}
}
func (m mesh) node(j int) string            { return fmt.Sprintf("node-%d", j%m.Nodes) }
func (m mesh) client(k int) string          { return fmt.Sprintf("client-%d", k) }
func (m mesh) clientNamespace(k int) string { return m.namespace(k) }

// podIP is 10.<100+j>.<i/256>.<i%256>: unique up to 65,536 Services of 156
// endpoints.
func (m mesh) podIP(i, j int) string {
	return netip.AddrFrom4([4]byte{10, byte(100 + j), byte(i >> 8), byte(i)}).String()
}

// clientIP is 10.250.<k/256>.<k%256>.
func (m mesh) clientIP(k int) string {
	return netip.AddrFrom4([4]byte{10, 250, byte(k >> 8), byte(k)}).String()
}

// write creates the mesh and returns once every Service's EndpointSlices
// list all its endpoints as ready. Pods are created before the Services
// that select them, so that the EndpointSlice controller writes each
// slice once, complete.
func (m mesh) write(ctx context.Context, kube kubernetes.Interface, istio istioclient.Interface) error {
	if err := forEach(ctx, m.Namespaces, func(ctx context.Context, n int) error {
		ns := m.namespace(n)
		if err := create(ctx, kube.CoreV1().Namespaces().Create, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: m.NamespaceLabels}}); err != nil {
			return err
		}
		// Pods are refused until the namespace's default service account
		// exists.
		if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			_, err := kube.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
			return err == nil, nil
		}); err != nil {
			return fmt.Errorf("wait for service account %s/default: %w", ns, err)
		}
		return create(ctx, kube.CoreV1().ServiceAccounts(ns).Create, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: clientAccount}})
	}); err != nil {
		return err
	}
	if err := forEach(ctx, m.Nodes, func(ctx context.Context, n int) error {
		return create(ctx, kube.CoreV1().Nodes().Create, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: m.node(n), Labels: map[string]string{
			corev1.LabelTopologyRegion: "region-1", corev1.LabelTopologyZone: fmt.Sprintf("zone-%d", n), corev1.LabelHostname: m.node(n),
		}}})
	}); err != nil {
		return err
	}
	if err := forEach(ctx, m.Services*m.EndpointsPerService, func(ctx context.Context, n int) error {
		i, j := n/m.EndpointsPerService, n%m.EndpointsPerService
		return m.createPod(ctx, kube, m.namespace(i), m.pod(i, j), m.podIP(i, j), m.node(j),
			m.podLabels(i, j), podAccount)
	}); err != nil {
		return err
	}
	if err := forEach(ctx, m.Clients, func(ctx context.Context, k int) error {
		return m.createPod(ctx, kube, m.clientNamespace(k), m.client(k), m.clientIP(k), m.node(k), map[string]string{"app": "client"}, clientAccount)
	}); err != nil {
		return err
	}
	if err := forEach(ctx, m.Services, func(ctx context.Context, i int) error {
		ns, name := m.namespace(i), m.service(i)
		if err := create(ctx, kube.CoreV1().Services(ns).Create, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": name}, Ports: []corev1.ServicePort{{
				Name: "grpc", Port: servicePort, TargetPort: intstr.FromInt32(targetPort), Protocol: corev1.ProtocolTCP,
			}}},
		}); err != nil {
			return err
		}
		if !m.hasVirtualService(i) {
			return nil
		}
		meta := metav1.ObjectMeta{Name: name}
		if err := create(ctx, istio.NetworkingV1().DestinationRules(ns).Create, &networkingv1.DestinationRule{ObjectMeta: meta, Spec: networkingapi.DestinationRule{
			Host: name, Subsets: []*networkingapi.Subset{{Name: "v0", Labels: map[string]string{"version": "v0"}}, {Name: "v1", Labels: map[string]string{"version": "v1"}}},
		}}); err != nil {
			return err
		}
		return create(ctx, istio.NetworkingV1().VirtualServices(ns).Create, &networkingv1.VirtualService{ObjectMeta: meta, Spec: networkingapi.VirtualService{
			Hosts: []string{name}, Http: []*networkingapi.HTTPRoute{{Route: split(name, 90)}},
		}})
	}); err != nil {
		return err
	}
	return m.waitEndpointSlices(ctx, kube)
}

// split routes weight percent of a Service's traffic to subset v0, the
// rest to v1.
func split(host string, weight int32) []*networkingapi.HTTPRouteDestination {
	return []*networkingapi.HTTPRouteDestination{
		{Destination: &networkingapi.Destination{Host: host, Subset: "v0"}, Weight: weight},
		{Destination: &networkingapi.Destination{Host: host, Subset: "v1"}, Weight: 100 - weight},
	}
}

// createPod creates a pod and writes its status as a kubelet would once
// it runs and is ready.
func (m mesh) createPod(ctx context.Context, kube kubernetes.Interface, ns, name, ip, node string, labels map[string]string, account string) error {
	pods := kube.CoreV1().Pods(ns)
	pod, err := pods.Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: account, Containers: []corev1.Container{{
			Name: "app", Image: "canopy/echo", Ports: []corev1.ContainerPort{{Name: "grpc", ContainerPort: targetPort, Protocol: corev1.ProtocolTCP}},
		}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create pod %s/%s: %w", ns, name, err)
	}
	now := metav1.Now()
	pod.Status = corev1.PodStatus{
		Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}, StartTime: &now,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		},
	}
	if _, err := pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("write status of pod %s/%s: %w", ns, name, err)
	}
	return nil
}

// setReady writes a pod's readiness (conditions Ready and ContainersReady)
// as a kubelet would after a probe changed.
func setReady(ctx context.Context, kube kubernetes.Interface, ns, name string, ready bool) error {
	pods := kube.CoreV1().Pods(ns)
	pod, err := pods.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get pod %s/%s: %w", ns, name, err)
	}
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	for i, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady || c.Type == corev1.ContainersReady {
			pod.Status.Conditions[i].Status, pod.Status.Conditions[i].LastTransitionTime = status, metav1.Now()
		}
	}
	if _, err := pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("write readiness of pod %s/%s: %w", ns, name, err)
	}
	return nil
}

// waitEndpointSlices waits until the EndpointSlices of every Service list
// all its endpoints as ready.
func (m mesh) waitEndpointSlices(ctx context.Context, kube kubernetes.Interface) error {
	want := m.Services * m.EndpointsPerService
	got := 0
	err := wait.PollUntilContextTimeout(ctx, time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		slices, err := kube.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName})
		if err != nil {
			return false, nil
		}
		got = 0
		for _, s := range slices.Items {
			for _, ep := range s.Endpoints {
				if ep.Conditions.Ready == nil || *ep.Conditions.Ready {
					got++
				}
			}
		}
		return got >= want, nil
	})
	if err != nil {
		return fmt.Errorf("wait for EndpointSlices (%d of %d endpoints ready): %w", got, want, err)
	}
	return nil
}

// forEach runs f for 0…n-1 with at most writers at once and returns the
// first error.
func forEach(ctx context.Context, n int, f func(ctx context.Context, i int) error) error {
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(writers)
	for i := range n {
		g.Go(func() error { return f(ctx, i) })
	}
	return g.Wait()
}

// create creates obj with a typed client's Create, accepting an object
// that already exists.
func create[T metav1.Object](ctx context.Context, f func(context.Context, T, metav1.CreateOptions) (T, error), obj T) error {
	if _, err := f(ctx, obj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create %T %s/%s: %w", obj, obj.GetNamespace(), obj.GetName(), err)
	}
	return nil
}
