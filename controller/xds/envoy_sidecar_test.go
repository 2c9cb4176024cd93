package xds_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/canopy-mesh/canopy/controller/xds"
	"github.com/canopy-mesh/canopy/ctl/view"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// TestSidecarStateOfTheWorld: an Envoy sidecar over state-of-the-world
// ADS. Clusters and listeners are wildcard: no names is a subscription to
// all of them, and names are ignored (any change of them is answered
// with the same set). Endpoints are by name: an ACK dropping a name is not
// answered and the dropped name is not pushed again; no names
// unsubscribes.
func TestSidecarStateOfTheWorld(t *testing.T) {
	fake := newFakeMesh()
	for _, r := range [][3]string{{cds, "c1", "v1"}, {cds, "c2", "v1"}, {eds, "e1", "v1"}, {eds, "e2", "v1"}, {lds, "l1", "v1"}} {
		fake.set(r[0], r[1], r[2])
	}
	m := startFakeMesh(t, xds.Config{}, fake)
	s := m.sotwStream(t)
	const own = "sidecar 10.1.0.1 v1"
	expect := func(step string, want reply) *discoveryv3.DiscoveryResponse {
		t.Helper()
		r := s.recv()
		if diff := cmp.Diff(want, sotwReply(t, r)); diff != "" {
			t.Fatalf("%s (-want +got):\n%s", step, diff)
		}
		return r
	}

	s.send(&discoveryv3.DiscoveryRequest{Node: m.envoyNode(t, "sidecar", "app-1", "10.1.0.1", ""), TypeUrl: cds})
	c1 := expect("no names subscribes to every cluster", reply{Type: "CDS", Resources: res("c1", own, "c2", own)})
	s.send(&discoveryv3.DiscoveryRequest{TypeUrl: lds})
	l := expect("no names subscribes to every listener", reply{Type: "LDS", Resources: res("l1", own)})
	s.send(&discoveryv3.DiscoveryRequest{TypeUrl: cds, ResponseNonce: c1.GetNonce(), VersionInfo: c1.GetVersionInfo()})
	l = nothingForSotW(t, s, lds, l.GetNonce(), "an ACK of clusters")
	s.send(&discoveryv3.DiscoveryRequest{TypeUrl: cds, ResponseNonce: c1.GetNonce(), ResourceNames: []string{"c1"}})
	c2 := expect("names are ignored", reply{Type: "CDS", Resources: res("c1", own, "c2", own)})
	s.send(&discoveryv3.DiscoveryRequest{TypeUrl: cds, ResponseNonce: c2.GetNonce()})
	expect("a name dropped", reply{Type: "CDS", Resources: res("c1", own, "c2", own)})

	s.send(&discoveryv3.DiscoveryRequest{TypeUrl: eds, ResourceNames: []string{"e1", "e2"}})
	e := expect("endpoints by name", reply{Type: "EDS", Resources: res("e1", "sidecar v1", "e2", "sidecar v1")})
	s.send(&discoveryv3.DiscoveryRequest{TypeUrl: eds, ResponseNonce: e.GetNonce(), ResourceNames: []string{"e1"}})
	l = nothingForSotW(t, s, lds, l.GetNonce(), "an ACK dropping a name")
	fake.set(eds, "e2", "v2")
	fake.set(cds, "c3", "v1")
	m.meshChanged()
	expect("clusters pushed", reply{Type: "CDS", Resources: res("c1", own, "c2", own, "c3", own)})
	// A cluster Envoy replaces waits for its endpoints, which it does not
	// ask for again: they follow, unchanged.
	e = expect("endpoints follow clusters", reply{Type: "EDS", Resources: res("e1", "sidecar v1")})
	l = nothingForSotW(t, s, lds, l.GetNonce(), "a dropped endpoint name changed")

	s.send(&discoveryv3.DiscoveryRequest{TypeUrl: eds, ResponseNonce: e.GetNonce()})
	l = nothingForSotW(t, s, lds, l.GetNonce(), "no endpoint names")
	fake.set(eds, "e1", "v2")
	fake.set(cds, "c4", "v1")
	m.meshChanged()
	expect("clusters pushed", reply{Type: "CDS", Resources: res("c1", own, "c2", own, "c3", own, "c4", own)})
	nothingForSotW(t, s, lds, l.GetNonce(), "endpoints unsubscribed changed")
}

// TestEnvoyClientsKeptApart: sidecars and proxyless clients that see the
// mesh alike never get each other's resources, and sidecars of the same
// namespace and labels get clusters and listeners of their own
// addresses, whatever was generated first.
func TestEnvoyClientsKeptApart(t *testing.T) {
	fake := newFakeMesh()
	fake.set(eds, "e1", "v1")
	fake.set(lds, "l1", "v1")
	m := startFakeMesh(t, xds.Config{}, fake)
	type client struct{ pod, ip, generator string }
	// One row after the other, on streams that outlive a row.
	deltas := map[client]*deltaADS{}
	for _, tt := range []struct {
		client
		sotw bool
		typ  string
		want reply
	}{
		{client{"a", "10.1.0.1", ""}, false, lds, reply{Type: "LDS", Resources: res("l1", "sidecar 10.1.0.1 v1")}},
		{client{"b", "10.1.0.2", ""}, false, lds, reply{Type: "LDS", Resources: res("l1", "sidecar 10.1.0.2 v1")}},
		{client{"c", "10.1.0.3", ""}, true, lds, reply{Type: "LDS", Resources: res("l1", "sidecar 10.1.0.3 v1")}},
		{client{"a", "10.1.0.1", ""}, false, eds, reply{Type: "EDS", Resources: res("e1", "sidecar v1")}},
		{client{"p", "10.1.0.1", "grpc"}, false, eds, reply{Type: "EDS", Resources: res("e1", "proxyless v1")}},
		{client{"p", "10.1.0.1", "grpc"}, false, lds, reply{Type: "LDS", Resources: res("l1", "proxyless v1")}},
		{client{"b", "10.1.0.2", ""}, false, eds, reply{Type: "EDS", Resources: res("e1", "sidecar v1")}},
		{client{"q", "10.1.0.2", "grpc"}, true, eds, reply{Type: "EDS", Resources: res("e1", "proxyless v1")}},
	} {
		node := m.envoyNode(t, "sidecar", tt.pod, tt.ip, tt.generator)
		var names []string
		switch {
		case tt.typ == eds:
			names = []string{"e1"}
		case tt.generator == "grpc":
			names = []string{"l1"}
		}
		var got reply
		if tt.sotw {
			s := m.sotwStream(t)
			s.send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: tt.typ, ResourceNames: names})
			got = sotwReply(t, s.recv())
		} else {
			d := deltas[tt.client]
			req := &discoveryv3.DeltaDiscoveryRequest{TypeUrl: tt.typ, ResourceNamesSubscribe: names}
			if d == nil {
				d = m.deltaStream(t)
				deltas[tt.client] = d
				req.Node = node
			}
			d.send(req)
			got = deltaReply(t, d.recv())
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("%s (%s, GENERATOR %q) %s (-want +got):\n%s", tt.pod, tt.ip, tt.generator, short(tt.typ), diff)
		}
	}
}

// TestEnvoyLimits: what a stream may ask for is bounded: too many names
// (at once, in all, or held on reconnect) end it with ResourceExhausted,
// a name longer than any resource's with InvalidArgument, a panic in the
// generators with Internal (and the next stream is served); a gateway or
// waypoint is not served Envoy types, and a proxyless client only those.
func TestEnvoyLimits(t *testing.T) {
	fake := newFakeMesh()
	fake.set(eds, "e1", "v1")
	fake.panicOn = "boom"
	m := startFakeMesh(t, xds.Config{MaxSubscriptions: 10}, fake)
	names := func(n int, prefix string) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("%s%d", prefix, i))
		}
		return out
	}
	versions := func(n int) map[string]string {
		out := map[string]string{}
		for _, name := range names(n, "held-") {
			out[name] = "1"
		}
		return out
	}
	huge := strings.Repeat("x", 2000)
	sidecarNode := m.envoyNode(t, "sidecar", "app-1", "10.1.0.1", "")
	proxylessNode := m.envoyNode(t, "sidecar", "client", "10.1.0.2", "grpc")
	waypointNode := m.envoyNode(t, "router", "waypoint", "10.1.0.3", "")
	for _, tt := range []struct {
		name  string
		delta []*discoveryv3.DeltaDiscoveryRequest
		sotw  []*discoveryv3.DiscoveryRequest
		code  codes.Code
		msg   string
	}{
		{name: "Delta: too many names at once", delta: []*discoveryv3.DeltaDiscoveryRequest{
			{Node: sidecarNode, TypeUrl: eds, ResourceNamesSubscribe: names(11, "e")}}, code: codes.ResourceExhausted, msg: "11 names, limit 10"},
		{name: "Delta: too many names in all", delta: []*discoveryv3.DeltaDiscoveryRequest{
			{Node: sidecarNode, TypeUrl: eds, ResourceNamesSubscribe: names(6, "a")},
			{TypeUrl: eds, ResourceNamesSubscribe: names(6, "b")}}, code: codes.ResourceExhausted, msg: "12 subscribed names, limit 10"},
		{name: "Delta: too many names held and subscribed to", delta: []*discoveryv3.DeltaDiscoveryRequest{
			{Node: sidecarNode, TypeUrl: eds, InitialResourceVersions: versions(6), ResourceNamesSubscribe: names(6, "e")}}, code: codes.ResourceExhausted, msg: "12 subscribed names, limit 10"},
		{name: "Delta: too many names on a wildcard type", delta: []*discoveryv3.DeltaDiscoveryRequest{
			{Node: sidecarNode, TypeUrl: cds, ResourceNamesSubscribe: names(6, "a")},
			{TypeUrl: cds, ResourceNamesSubscribe: names(6, "b")}}, code: codes.ResourceExhausted, msg: "12 subscribed names, limit 10"},
		{name: "Delta: too many held resources", delta: []*discoveryv3.DeltaDiscoveryRequest{
			{Node: sidecarNode, TypeUrl: cds, InitialResourceVersions: versions(11)}}, code: codes.ResourceExhausted, msg: "11 names, limit 10"},
		{name: "Delta: a huge name", delta: []*discoveryv3.DeltaDiscoveryRequest{
			{Node: sidecarNode, TypeUrl: eds, ResourceNamesSubscribe: []string{huge}}}, code: codes.InvalidArgument, msg: "2000 bytes, limit 1024"},
		{name: "Delta: a huge unsubscribed name", delta: []*discoveryv3.DeltaDiscoveryRequest{
			{Node: sidecarNode, TypeUrl: eds, ResourceNamesSubscribe: []string{"e1"}},
			{TypeUrl: eds, ResourceNamesUnsubscribe: []string{huge}}}, code: codes.InvalidArgument, msg: "2000 bytes, limit 1024"},
		{name: "Delta: a huge held name", delta: []*discoveryv3.DeltaDiscoveryRequest{
			{Node: sidecarNode, TypeUrl: cds, InitialResourceVersions: map[string]string{huge: "1"}}}, code: codes.InvalidArgument, msg: "2000 bytes, limit 1024"},
		{name: "Delta: a generator panics", delta: []*discoveryv3.DeltaDiscoveryRequest{
			{Node: sidecarNode, TypeUrl: eds, ResourceNamesSubscribe: []string{"boom"}}}, code: codes.Internal, msg: `generating EDS "boom" failed`},
		{name: "Delta: a proxyless client with too many names", delta: []*discoveryv3.DeltaDiscoveryRequest{
			{Node: proxylessNode, TypeUrl: cds, ResourceNamesSubscribe: names(11, "c")}}, code: codes.ResourceExhausted, msg: "11 names, limit 10"},
		{name: "Delta: a proxyless client asking for a workload type", delta: []*discoveryv3.DeltaDiscoveryRequest{
			{Node: proxylessNode, TypeUrl: cds}, {TypeUrl: workloadapi.AddressTypeURL}}, code: codes.InvalidArgument, msg: "unsupported type URL"},
		{name: "Delta: a waypoint", delta: []*discoveryv3.DeltaDiscoveryRequest{
			{Node: waypointNode, TypeUrl: cds}}, code: codes.Unimplemented, msg: "not to gateways, waypoints"},
		{name: "state of the world: too many names", sotw: []*discoveryv3.DiscoveryRequest{
			{Node: sidecarNode, TypeUrl: cds, ResourceNames: names(11, "c")}}, code: codes.ResourceExhausted, msg: "11 names, limit 10"},
		{name: "state of the world: a huge name", sotw: []*discoveryv3.DiscoveryRequest{
			{Node: sidecarNode, TypeUrl: eds, ResourceNames: []string{huge}}}, code: codes.InvalidArgument, msg: "2000 bytes, limit 1024"},
		{name: "state of the world: a generator panics", sotw: []*discoveryv3.DiscoveryRequest{
			{Node: sidecarNode, TypeUrl: eds, ResourceNames: []string{"boom"}}}, code: codes.Internal, msg: `generating EDS "boom" failed`},
		{name: "state of the world: a waypoint", sotw: []*discoveryv3.DiscoveryRequest{
			{Node: waypointNode, TypeUrl: lds}}, code: codes.Unimplemented, msg: "not to gateways, waypoints"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var err error
			if tt.delta != nil {
				d := m.deltaStream(t)
				for _, r := range tt.delta {
					_ = d.st.Send(r) // the server may have ended the stream
				}
				err = d.end()
			} else {
				s := m.sotwStream(t)
				for _, r := range tt.sotw {
					_ = s.st.Send(r)
				}
				err = s.end()
			}
			if status.Code(err) != tt.code || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("stream ended with %v, want %v containing %q", err, tt.code, tt.msg)
			}
		})
	}
	d := m.deltaStream(t)
	d.send(&discoveryv3.DeltaDiscoveryRequest{Node: sidecarNode, TypeUrl: eds, ResourceNamesSubscribe: []string{"e1"}})
	if diff := cmp.Diff(reply{Type: "EDS", Resources: res("e1", "sidecar v1")}, deltaReply(t, d.recv())); diff != "" {
		t.Errorf("a stream after the refused ones (-want +got):\n%s", diff)
	}
}

// TestSidecarProxyStatus: sidecars, over Delta and state of the world,
// count as connected proxies and show in proxy status (/debug/syncz, as canopyctl proxy-status prints
// it, and istio.io/debug/syncz, as istioctl proxy-status reads it) with
// their CDS, EDS, LDS and RDS SYNCED, and in /debug/config_dump.
func TestSidecarProxyStatus(t *testing.T) {
	fake := newFakeMesh()
	for _, r := range [][3]string{{cds, "c1", "v1"}, {cds, "c2", "v1"}, {eds, "e1", "v1"}, {lds, "l1", "v1"}, {rds, "r1", "v1"}} {
		fake.set(r[0], r[1], r[2])
	}
	m := startFakeMesh(t, xds.Config{ID: "canopy-controller-0"}, fake)
	subscriptions := []struct {
		typ   string
		names []string
	}{{cds, nil}, {lds, nil}, {eds, []string{"e1"}}, {rds, []string{"r1"}}}

	d := m.deltaStream(t)
	for i, sub := range subscriptions {
		req := &discoveryv3.DeltaDiscoveryRequest{TypeUrl: sub.typ, ResourceNamesSubscribe: sub.names}
		if i == 0 {
			req.Node = m.envoyNode(t, "sidecar", "app-delta", "10.1.0.1", "")
		}
		d.send(req)
		d.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: sub.typ, ResponseNonce: d.recv().GetNonce()})
	}
	s := m.sotwStream(t)
	for i, sub := range subscriptions {
		req := &discoveryv3.DiscoveryRequest{TypeUrl: sub.typ, ResourceNames: sub.names}
		if i == 0 {
			req.Node = m.envoyNode(t, "sidecar", "app-sotw", "10.1.0.2", "")
		}
		s.send(req)
		r := s.recv()
		s.send(&discoveryv3.DiscoveryRequest{TypeUrl: sub.typ, ResourceNames: sub.names, ResponseNonce: r.GetNonce(), VersionInfo: r.GetVersionInfo()})
	}
	ids := []string{"app-delta." + m.ns, "app-sotw." + m.ns}
	for _, id := range ids {
		eventuallySynced(t, m, id, 4)
	}
	if got := gauge(t, m, "canopy_xds_connected_proxies"); got != 2 {
		t.Errorf("canopy_xds_connected_proxies = %v, want 2", got)
	}

	type typeRow struct {
		Type, Status          string
		Wildcard              bool
		Subscribed, Resources int
	}
	wantTypes := []typeRow{
		{"CDS", xds.Synced, true, 0, 2}, {"EDS", xds.Synced, false, 1, 1},
		{"LDS", xds.Synced, true, 0, 1}, {"RDS", xds.Synced, false, 1, 1},
	}
	for _, ps := range m.server.Status() {
		var got []typeRow
		for _, ts := range ps.Types {
			got = append(got, typeRow{ts.Type, ts.Status, ts.Wildcard, ts.Subscribed, ts.Resources})
		}
		if diff := cmp.Diff(wantTypes, got); diff != "" || ps.ProxyType != "sidecar" {
			t.Errorf("%s (%s) status (-want +got):\n%s", ps.ProxyID, ps.ProxyType, diff)
		}
	}

	// canopyctl proxy-status -v: /debug/syncz as a table.
	rec := httptest.NewRecorder()
	m.server.DebugHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/syncz", nil))
	var proxies []view.ProxyStatus
	if err := json.Unmarshal(rec.Body.Bytes(), &proxies); err != nil {
		t.Fatalf("/debug/syncz: %v\n%s", err, rec.Body)
	}
	table := view.ProxyStatusTable([]view.ControllerStatus{{Controller: "canopy-controller-0", Proxies: proxies}}, true, time.Now())
	for _, row := range table.Rows {
		for i, cell := range row {
			row[i], _, _ = strings.Cut(cell, " (") // the ages
		}
	}
	wantTable := view.Table{
		Header: []string{"NAME", "CLUSTER", "CDS", "EDS", "LDS", "RDS", "ISTIOD", "VERSION"},
		Rows: [][]string{
			{ids[0], "Kubernetes", "SYNCED", "SYNCED", "SYNCED", "SYNCED", "canopy-controller-0", "test"},
			{ids[1], "Kubernetes", "SYNCED", "SYNCED", "SYNCED", "SYNCED", "canopy-controller-0", "test"},
		},
	}
	if diff := cmp.Diff(wantTable, table); diff != "" {
		t.Errorf("canopyctl proxy-status -v (-want +got):\n%s", diff)
	}

	// istioctl proxy-status: CSDS over state of the world.
	is := m.sotwStream(t)
	is.send(&discoveryv3.DiscoveryRequest{Node: istioctlNode(t, m.ns), TypeUrl: xds.SynczTypeURL, ResponseNonce: "1"})
	synced := map[string]string{cds: "SYNCED+age", eds: "SYNCED+age", lds: "SYNCED+age", rds: "SYNCED+age"}
	wantRows := []synczRow{
		{ID: ids[0], Cluster: "Kubernetes", Namespace: m.ns, Version: "test", Types: synced},
		{ID: ids[1], Cluster: "Kubernetes", Namespace: m.ns, Version: "test", Types: synced},
	}
	if diff := cmp.Diff(wantRows, synczRows(t, is.recv().GetResources())); diff != "" {
		t.Errorf("istio.io/debug/syncz (-want +got):\n%s", diff)
	}

	for _, id := range ids {
		rec := httptest.NewRecorder()
		m.server.DebugHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/config_dump?proxyID="+id, nil))
		var dumps []xds.ConfigDump
		if err := json.Unmarshal(rec.Body.Bytes(), &dumps); err != nil || len(dumps) != 1 {
			t.Fatalf("/debug/config_dump?proxyID=%s: %v\n%s", id, err, rec.Body)
		}
		got := map[string][]string{}
		for typ, rs := range dumps[0].Types {
			for _, r := range rs {
				got[typ] = append(got[typ], r.Name)
			}
		}
		want := map[string][]string{"CDS": {"c1", "c2"}, "EDS": {"e1"}, "LDS": {"l1"}, "RDS": {"r1"}}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("config dump of %s (-want +got):\n%s", id, diff)
		}
	}
}

// TestSidecarEndpointsFromTheMesh: a sidecar, over Delta and state of the
// world, is sent a Service's cluster among its wildcard clusters, and
// the Service's endpoints from the workload tables and their removal, by
// the sidecar generators.
func TestSidecarEndpointsFromTheMesh(t *testing.T) {
	m := startMesh(t, xds.Config{})
	ns := env.Namespace(t, "apps", nil)
	for i, variant := range []string{"delta", "sotw"} {
		t.Run(variant, func(t *testing.T) {
			svc := "echo-" + variant
			if _, err := env.Client.CoreV1().Services(ns).Create(t.Context(), &corev1.Service{
				ObjectMeta: metav1.ObjectMeta{Name: svc},
				Spec: corev1.ServiceSpec{Selector: map[string]string{"app": svc},
					Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}},
			}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			podIP := fmt.Sprintf("10.244.20.%d", 10+i)
			ambientPod(t, ns, svc+"-pod", "node-1", podIP, map[string]string{"app": svc})
			cluster := "outbound|80||" + svc + "." + ns + ".svc.cluster.local"
			node := m.envoyNode(t, "sidecar", "app-"+variant, fmt.Sprintf("10.244.21.%d", 10+i), "")

			// next returns the next response.
			var next func() reply
			if variant == "delta" {
				d := m.deltaStream(t)
				d.send(&discoveryv3.DeltaDiscoveryRequest{Node: node, TypeUrl: cds})
				d.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: eds, ResourceNamesSubscribe: []string{cluster}})
				next = func() reply { return deltaReply(t, d.recv()) }
			} else {
				s := m.sotwStream(t)
				s.send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: cds})
				s.send(&discoveryv3.DiscoveryRequest{TypeUrl: eds, ResourceNames: []string{cluster}})
				next = func() reply { return sotwReply(t, s.recv()) }
			}
			// until reads responses until each of want (type: the
			// cluster's tag, or "*" for any) has been seen; other tests'
			// changes push other things meanwhile.
			until := func(what string, want map[string]string) {
				t.Helper()
				deadline := time.Now().Add(settle)
				for time.Now().Before(deadline) && len(want) > 0 {
					r := next()
					if tag, ok := r.Resources[cluster]; ok && (want[r.Type] == tag || want[r.Type] == "*") {
						delete(want, r.Type)
					}
				}
				if len(want) > 0 {
					t.Fatalf("%s: never seen %v within %s", what, want, settle)
				}
			}
			until("the Service and its pod", map[string]string{"CDS": "*", "EDS": podIP + ":8080"})
			deletePod(t, ns, svc+"-pod")
			until("the pod deleted", map[string]string{"EDS": ""})
		})
	}
}

// gauge is a gauge's value in the mesh's registry.
func gauge(t *testing.T, m *mesh, name string) float64 {
	t.Helper()
	mfs, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}

// TestSidecarEndpointPushCarriesOnlyChanges: a pushed endpoint response
// carries the assignments that changed, not every one the sidecar
// watches; one endpoint's change once resent all of them to every
// sidecar.
func TestSidecarEndpointPushCarriesOnlyChanges(t *testing.T) {
	fake := newFakeMesh()
	for _, n := range []string{"e1", "e2", "e3"} {
		fake.set(eds, n, "v1")
	}
	m := startFakeMesh(t, xds.Config{}, fake)
	s := m.sotwStream(t)
	s.send(&discoveryv3.DiscoveryRequest{Node: m.envoyNode(t, "sidecar", "app-1", "10.1.0.1", ""), TypeUrl: eds, ResourceNames: []string{"e1", "e2", "e3"}})
	first := s.recv()
	if diff := cmp.Diff(reply{Type: "EDS", Resources: res("e1", "sidecar v1", "e2", "sidecar v1", "e3", "sidecar v1")}, sotwReply(t, first)); diff != "" {
		t.Fatalf("first answer (-want +got):\n%s", diff)
	}
	s.send(&discoveryv3.DiscoveryRequest{TypeUrl: eds, ResourceNames: []string{"e1", "e2", "e3"}, ResponseNonce: first.GetNonce(), VersionInfo: first.GetVersionInfo()})
	fake.set(eds, "e2", "v2")
	m.meshChanged()
	if diff := cmp.Diff(reply{Type: "EDS", Resources: res("e2", "sidecar v2")}, sotwReply(t, s.recv())); diff != "" {
		t.Errorf("push after one assignment changed (-want +got):\n%s", diff)
	}
}
