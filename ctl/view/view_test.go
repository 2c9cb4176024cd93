package view

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	goldenpkg "github.com/canopy-mesh/canopy/internal/testing/golden"
	"github.com/canopy-mesh/canopy/node/configdump"
)

func golden(t *testing.T, name, got string) { t.Helper(); goldenpkg.Check(t, name, []byte(got)) }

func print(t *testing.T, tb Table) string {
	t.Helper()
	var b strings.Builder
	if err := tb.Print(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

var (
	services = []configdump.Service{
		{Name: "echo", Namespace: "demo", Hostname: "echo.demo.svc.cluster.local", VIPs: []string{"/10.96.0.20"},
			Endpoints: map[string]configdump.Endpoint{"a": {Status: "Healthy"}, "b": {Status: "Unhealthy"}}},
		{Name: "waypoint", Namespace: "demo", Hostname: "waypoint.demo.svc.cluster.local", VIPs: []string{"net1/10.96.0.30"},
			Endpoints: map[string]configdump.Endpoint{}},
	}
	workloads = []configdump.Workload{
		{UID: "u3", Name: "echo-b", Namespace: "demo", Node: "node-2", Protocol: "HBONE", WorkloadIPs: []string{"10.244.2.3"}, ServiceAccount: "echo", Status: "Healthy",
			Waypoint: &configdump.Gateway{Destination: "demo/waypoint.demo.svc.cluster.local"}},
		{UID: "u1", Name: "echo-a", Namespace: "demo", Node: "node-1", Protocol: "HBONE", WorkloadIPs: []string{"10.244.1.3", "fd00::3"}, ServiceAccount: "echo", Status: "Healthy"},
		{UID: "u2", Name: "legacy", Namespace: "apps", Node: "node-1", Protocol: "TCP", WorkloadIPs: []string{"10.244.1.9"}, Status: "Healthy",
			Waypoint: &configdump.Gateway{Destination: "net1/10.1.1.1"}},
		{UID: "u4", Name: "db", Namespace: "ext", Protocol: "TCP", Hostname: "db.example.com", Status: "Unhealthy"},
		{UID: "u5", Name: "grpc-client", Namespace: "grpc", Node: "node-2", Protocol: "TCP", WorkloadIPs: []string{"10.244.2.7"}, ServiceAccount: "client", Status: "Healthy"},
		{UID: "u6", Name: "reviews", Namespace: "apps", Node: "node-2", Protocol: "TCP", WorkloadIPs: []string{"10.244.2.8"}, ServiceAccount: "reviews", Status: "Healthy"},
	}
	dataplanes = map[string]string{"grpc/grpc-client": "proxyless", "apps/reviews": "sidecar"}
)

func TestWorkloads(t *testing.T) {
	for _, tt := range []struct {
		name   string
		filter WorkloadFilter
		wide   bool
	}{
		{"workloads.golden", WorkloadFilter{}, false},
		{"workloads-wide.golden", WorkloadFilter{}, true},
		{"workloads-ambient.golden", WorkloadFilter{AmbientOnly: true}, false},
		{"workloads-node.golden", WorkloadFilter{Node: "node-1", Namespace: "demo"}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			golden(t, tt.name, print(t, WorkloadsTable(FilterWorkloads(workloads, tt.filter), services, dataplanes, tt.wide)))
		})
	}
}

func TestDataplane(t *testing.T) {
	status := map[string]string{"sidecar.istio.io/status": `{"containers":["istio-proxy"]}`}
	proxy := func(env ...corev1.EnvVar) corev1.Container { return corev1.Container{Name: "istio-proxy", Env: env} }
	for _, tt := range []struct {
		name string
		pod  corev1.Pod
		want string
	}{
		{"not injected", corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{proxy()}}}, ""},
		{"sidecar", corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: status}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app"}, proxy()}}}, "sidecar"},
		{"native sidecar", corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: status}, Spec: corev1.PodSpec{InitContainers: []corev1.Container{proxy()}}}, "sidecar"},
		{"grpc-agent", corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: status}, Spec: corev1.PodSpec{Containers: []corev1.Container{
			{Name: "app", Env: []corev1.EnvVar{{Name: "DISABLE_ENVOY", Value: "true"}}}, proxy(corev1.EnvVar{Name: "DISABLE_ENVOY", Value: "true"})}}}, "proxyless"},
		{"only the proxy's variable counts", corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: status}, Spec: corev1.PodSpec{Containers: []corev1.Container{
			{Name: "app", Env: []corev1.EnvVar{{Name: "DISABLE_ENVOY", Value: "true"}}}, proxy()}}}, "sidecar"},
	} {
		if got := Dataplane(&tt.pod); got != tt.want {
			t.Errorf("%s: Dataplane = %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestWaypointName(t *testing.T) {
	for _, tt := range []struct {
		g    *configdump.Gateway
		want string
	}{
		{nil, "None"},
		{&configdump.Gateway{}, "None"},
		{&configdump.Gateway{Destination: "demo/waypoint.demo.svc.cluster.local"}, "waypoint"},
		{&configdump.Gateway{Destination: "net1/10.96.0.30"}, "waypoint"},
		{&configdump.Gateway{Destination: "net1/10.1.1.1"}, "NA"},
	} {
		if got := waypointName(tt.g, services); got != tt.want {
			t.Errorf("waypointName(%+v) = %q, want %q", tt.g, got, tt.want)
		}
	}
}

func TestServicesPoliciesGolden(t *testing.T) {
	golden(t, "services.golden", print(t, ServicesTable(services, "")))
	policies := []configdump.Policy{
		{Name: "strict", Namespace: "istio-system", Action: "Deny", Scope: "WorkloadSelector"},
		{Name: "allow-client", Namespace: "demo", Action: "Allow", Scope: "WorkloadSelector"},
		{Name: "trial", Namespace: "demo", Action: "Deny", Scope: "Namespace", DryRun: true},
	}
	golden(t, "policies.golden", print(t, PoliciesTable(policies, "")))
	if got := PoliciesTable(policies, "demo").Rows; len(got) != 2 {
		t.Errorf("namespace filter kept %d policies, want 2", len(got))
	}
}

func TestCertificates(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	nodes := []NodeCertificates{{Node: "node-1", Proxy: "canopy-node-x", Certs: []configdump.CertState{{
		Identity: "spiffe://cluster.local/ns/demo/sa/echo", State: "Available",
		CertChain: []configdump.Certificate{{SerialNumber: "255", ValidFrom: now.Add(-time.Hour), ExpirationTime: now.Add(23 * time.Hour)},
			{SerialNumber: "not-a-number", ValidFrom: now.Add(-48 * time.Hour), ExpirationTime: now.Add(-time.Hour)}},
		RootCerts: []configdump.Certificate{{SerialNumber: "4096", ValidFrom: now.Add(-time.Hour), ExpirationTime: now.Add(87600 * time.Hour)}},
	}}}}
	golden(t, "certificates.golden", print(t, CertificatesTable(nodes, now)))
}

func TestProxyStatus(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	cs := []ControllerStatus{{Controller: "canopy-controller-abc", Proxies: []ProxyStatus{
		{ProxyID: "canopy-node-b.istio-system", Cluster: "Kubernetes", Version: "1.2.3", Types: []TypeStatus{
			{Type: "WDS", Status: "SYNCED", LastAcked: now.Add(-75 * time.Second)},
			{Type: "WADS", Status: "ERROR", NACK: "bad policy"},
		}},
		{ProxyID: "canopy-node-a.istio-system", Cluster: "Kubernetes", Types: []TypeStatus{
			{Type: "WDS", Status: "STALE"},
		}},
	}}}
	golden(t, "proxy-status.golden", print(t, ProxyStatusTable(cs, false, now)))
	golden(t, "proxy-status-verbose.golden", print(t, ProxyStatusTable(cs, true, now)))
}

func TestAge(t *testing.T) {
	for d, want := range map[time.Duration]string{
		4 * time.Second: "4s", 75 * time.Second: "1m15s", 3*time.Hour + 5*time.Minute: "3h5m", 50 * time.Hour: "2d2h",
	} {
		if got := age(d); got != want {
			t.Errorf("age(%s) = %q, want %q", d, got, want)
		}
	}
}

// TestTraffic: a node proxy's metrics (testdata/<case>.prom) parsed into
// connections (<case>-parsed.golden, as -o json prints them) and shown
// as canopyctl traffic (<case>.golden) and traffic --denied
// (<case>-denied.golden). traffic-old is a node proxy from before
// response_flags: nothing is denied.
func TestTraffic(t *testing.T) {
	for _, name := range []string{"traffic", "traffic-old"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f, err := os.Open(filepath.Join("testdata", name+".prom"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			got, err := ParseConnections("node-1", f)
			if err != nil {
				t.Fatal(err)
			}
			parsed, err := json.MarshalIndent(got, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			golden(t, name+"-parsed.golden", string(parsed)+"\n")
			golden(t, name+".golden", print(t, TrafficTable(got)))
			golden(t, name+"-denied.golden", print(t, TrafficTable(Denied(got))))
		})
	}
}

func TestParseConnectionsErrors(t *testing.T) {
	if _, err := ParseConnections("node-1", strings.NewReader("not { metrics")); err == nil || !strings.Contains(err.Error(), "node-1") {
		t.Errorf("garbage metrics: err = %v, want an error naming the node", err)
	}
	got, err := ParseConnections("node-1", strings.NewReader("# TYPE other_total counter\nother_total 7\n"))
	if err != nil || len(got) != 0 {
		t.Errorf("metrics without connections: %v, %v; want none", got, err)
	}
}

// FuzzParseConnections: a node proxy's metrics come from the cluster;
// nothing in them may crash canopyctl.
func FuzzParseConnections(f *testing.F) {
	f.Add("istio_tcp_connections_opened_total{reporter=\"source\"} 1\n")
	f.Add("# TYPE istio_tcp_connections_opened_total gauge\nistio_tcp_connections_opened_total 1e400\n")
	f.Add("istio_tcp_connections_closed_total{response_flags=\"DENY\"} -1\nistio_tcp_connections_opened_total NaN\n")
	f.Fuzz(func(t *testing.T, s string) {
		cs, err := ParseConnections("n", strings.NewReader(s))
		if err == nil {
			_ = TrafficTable(Denied(cs))
		}
	})
}
