package index

import (
	"fmt"
	"testing"

	securityapi "istio.io/api/security/v1beta1"
	typeapi "istio.io/api/type/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/canopy-mesh/canopy/controller/ambient"
)

// A cluster of the benchmark's size: 100 namespaces, each with 10 Services
// of 10 pods and 5 selector-bound policies (10,000 pods, 1,000 Services,
// 500 policies), on 50 nodes.
const (
	benchNamespaces = 100
	servicesPerNs   = 10
	podsPerService  = 10
	policiesPerNs   = 5
	benchNodes      = 50
)

type benchCluster struct {
	nodes    []*corev1.Node
	pods     []*corev1.Pod
	services []*corev1.Service
	policies []*securityv1.AuthorizationPolicy
}

func newBenchCluster() benchCluster {
	var c benchCluster
	for n := range benchNodes {
		c.nodes = append(c.nodes, node(fmt.Sprintf("node-%d", n), fmt.Sprintf("zone-%d", n%3)))
	}
	i := 0
	for ns := range benchNamespaces {
		namespace := fmt.Sprintf("ns-%d", ns)
		for s := range servicesPerNs {
			app := fmt.Sprintf("app-%d", s)
			c.services = append(c.services, &corev1.Service{
				ObjectMeta: metav1.ObjectMeta{Name: app, Namespace: namespace},
				Spec: corev1.ServiceSpec{
					Selector:   map[string]string{"app": app},
					ClusterIPs: []string{fmt.Sprintf("10.96.%d.%d", ns, s+1)},
					Ports:      []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}},
				},
			})
			for p := range podsPerService {
				i++
				c.pods = append(c.pods, &corev1.Pod{
					ObjectMeta: metav1.ObjectMeta{
						Name: fmt.Sprintf("%s-%d", app, p), Namespace: namespace,
						Labels:      map[string]string{"app": app, "version": "v1"},
						Annotations: map[string]string{ambient.AnnotationRedirection: "enabled"},
					},
					Spec: corev1.PodSpec{
						NodeName:   fmt.Sprintf("node-%d", i%benchNodes),
						Containers: []corev1.Container{{Name: "app", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}},
					},
					Status: corev1.PodStatus{
						Phase:      corev1.PodRunning,
						PodIPs:     []corev1.PodIP{{IP: fmt.Sprintf("10.%d.%d.%d", 100+i/65536, (i/256)%256, i%256)}},
						Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
					},
				})
			}
		}
		for p := range policiesPerNs {
			pol := &securityv1.AuthorizationPolicy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("allow-%d", p), Namespace: namespace}}
			pol.Spec.Selector = &typeapi.WorkloadSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app-%d", p)}}
			pol.Spec.Rules = []*securityapi.Rule{{From: []*securityapi.Rule_From{{Source: &securityapi.Source{Namespaces: []string{namespace}}}}}}
			c.policies = append(c.policies, pol)
		}
	}
	return c
}

func (c benchCluster) load() *Index {
	x := New(ambient.Config{})
	for _, n := range c.nodes {
		x.UpsertNode(n)
	}
	for _, s := range c.services {
		x.UpsertService(s)
	}
	for _, p := range c.policies {
		x.UpsertAuthorizationPolicy(p)
	}
	for _, p := range c.pods {
		x.UpsertPod(p)
	}
	return x
}

// BenchmarkFullBuild builds every table from scratch.
func BenchmarkFullBuild(b *testing.B) {
	c := newBenchCluster()
	b.ReportAllocs()
	for b.Loop() {
		c.load()
	}
}

// BenchmarkPodUpdate applies one pod change (readiness flips) to tables of
// the full size.
func BenchmarkPodUpdate(b *testing.B) {
	c := newBenchCluster()
	x := c.load()
	ready, notReady := c.pods[4321], c.pods[4321].DeepCopy()
	notReady.Status.Conditions[0].Status = corev1.ConditionFalse
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		p := ready
		if i%2 == 0 {
			p = notReady
		}
		i++
		if cs := x.UpsertPod(p); cs.Empty() {
			b.Fatal("pod update changed nothing")
		}
	}
}

// BenchmarkServiceUpdate applies one Service change (a port added and
// removed) to tables of the full size: the Service and its 10 pods.
func BenchmarkServiceUpdate(b *testing.B) {
	c := newBenchCluster()
	x := c.load()
	orig, changed := c.services[432], c.services[432].DeepCopy()
	changed.Spec.Ports = append(changed.Spec.Ports, corev1.ServicePort{Name: "admin", Port: 9000, TargetPort: intstr.FromInt32(9000)})
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		s := orig
		if i%2 == 0 {
			s = changed
		}
		i++
		if cs := x.UpsertService(s); len(cs.Addresses.Updated) != 1+podsPerService {
			b.Fatalf("service update touched %v", cs.Addresses)
		}
	}
}
