package configdump_test

import (
	"bytes"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/canopy-mesh/canopy/internal/testing/golden"
	"github.com/canopy-mesh/canopy/internal/workloadtable"
	"github.com/canopy-mesh/canopy/node/configdump"
	"github.com/canopy-mesh/canopy/workloadapi"
	"github.com/canopy-mesh/canopy/workloadapi/security"
)

func ips(t *testing.T, ss ...string) [][]byte {
	t.Helper()
	var out [][]byte
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s).AsSlice())
	}
	return out
}

func netAddr(network, ip string, length ...uint32) *workloadapi.NetworkAddress {
	a := &workloadapi.NetworkAddress{Network: network, Address: netip.MustParseAddr(ip).AsSlice()}
	if len(length) > 0 {
		a.Length = &length[0]
	}
	return a
}

func secAddr(prefix string) *security.Address {
	p := netip.MustParsePrefix(prefix)
	return &security.Address{Address: p.Addr().AsSlice(), Length: uint32(p.Bits())}
}

func exact(s string) *security.StringMatch {
	return &security.StringMatch{MatchType: &security.StringMatch_Exact{Exact: s}}
}

func resource(t *testing.T, typeURL, name string, m proto.Message) *discoveryv3.Resource {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return &discoveryv3.Resource{Name: name, Resource: &anypb.Any{TypeUrl: typeURL, Value: b}}
}

const (
	echoKey   = "apps/echo.apps.svc.cluster.local"
	canaryKey = "apps/echo-canary.apps.svc.cluster.local"
)

// mesh is a node proxy's table, filled as the xDS client fills it.
func mesh(t *testing.T) workloadtable.Snapshot {
	t.Helper()
	workloads := []*workloadapi.Workload{
		{
			Uid: workloadapi.PodUID("Kubernetes", "apps", "echo-0"), Name: "echo-0", Namespace: "apps",
			Addresses: ips(t, "10.244.1.5", "fd00::5"), TunnelProtocol: workloadapi.TunnelProtocol_HBONE, ServiceAccount: "echo",
			Node: "node-a", CanonicalName: "echo", CanonicalRevision: "v1", WorkloadName: "echo", WorkloadType: workloadapi.WorkloadType_DEPLOYMENT,
			ClusterId: "Kubernetes", AuthorizationPolicies: []string{"apps/allow-frontend"},
			Locality: &workloadapi.Locality{Region: "eu", Zone: "eu-a"}, Capacity: wrapperspb.UInt32(3),
			Waypoint: &workloadapi.GatewayAddress{Destination: &workloadapi.GatewayAddress_Hostname{Hostname: &workloadapi.NamespacedHostname{
				Namespace: "apps", Hostname: "waypoint.apps.svc.cluster.local"}}, HboneMtlsPort: 15008},
			Services: map[string]*workloadapi.PortList{
				echoKey:   {Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}}},
				canaryKey: {},
			},
		},
		{
			Uid: workloadapi.PodUID("Kubernetes", "monitoring", "node-exporter-x1"), Name: "node-exporter-x1", Namespace: "monitoring",
			Addresses: ips(t, "172.18.0.2"), NetworkMode: workloadapi.NetworkMode_HOST_NETWORK, TrustDomain: "example.org",
			Node: "node-a", WorkloadType: workloadapi.WorkloadType_POD, Status: workloadapi.WorkloadStatus_UNHEALTHY,
			Locality: &workloadapi.Locality{}, // all empty: left out, as ztunnel leaves out a default locality
		},
		{
			Uid: "Kubernetes/networking.istio.io/WorkloadEntry/legacy/vm-1", Name: "vm-1", Namespace: "legacy",
			// One address that is no IP: left out rather than shown wrong.
			Addresses: [][]byte{{10, 0, 0}}, Hostname: "vm-1.example.com", Network: "net-1", WorkloadType: workloadapi.WorkloadType_CRONJOB,
			Waypoint: &workloadapi.GatewayAddress{Destination: &workloadapi.GatewayAddress_Address{Address: netAddr("net-1", "10.0.0.9")}, HboneMtlsPort: 15009},
			Services: map[string]*workloadapi.PortList{echoKey: {}},
		},
	}
	services := []*workloadapi.Service{
		{
			Name: "echo", Namespace: "apps", Hostname: "echo.apps.svc.cluster.local",
			Addresses:       []*workloadapi.NetworkAddress{netAddr("", "10.96.0.10"), netAddr("", "fd00:96::10")},
			Ports:           []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}, {ServicePort: 443, TargetPort: 8443}},
			SubjectAltNames: []string{"spiffe://cluster.local/ns/apps/sa/echo"}, IpFamilies: workloadapi.IPFamilies_DUAL,
			LoadBalancing: &workloadapi.LoadBalancing{RoutingPreference: []workloadapi.LoadBalancing_Scope{workloadapi.LoadBalancing_NETWORK, workloadapi.LoadBalancing_ZONE},
				Mode: workloadapi.LoadBalancing_FAILOVER},
			Waypoint: &workloadapi.GatewayAddress{Destination: &workloadapi.GatewayAddress_Hostname{Hostname: &workloadapi.NamespacedHostname{
				Namespace: "apps", Hostname: "waypoint.apps.svc.cluster.local"}}, HboneMtlsPort: 15008},
		},
		{
			Name: "echo-canary", Namespace: "apps", Hostname: "echo-canary.apps.svc.cluster.local",
			Addresses: []*workloadapi.NetworkAddress{netAddr("net-1", "10.100.0.0", 16)},
		},
	}
	policies := []*security.Authorization{
		{
			Name: "allow-frontend", Namespace: "apps", Scope: security.Scope_WORKLOAD_SELECTOR, Action: security.Action_ALLOW,
			Rules: []*security.Rule{{Clauses: []*security.Clause{
				{Matches: []*security.Match{
					{Principals: []*security.StringMatch{exact("cluster.local/ns/apps/sa/frontend"),
						{MatchType: &security.StringMatch_Prefix{Prefix: "cluster.local/ns/web/"}}}},
					{Namespaces: []*security.StringMatch{{MatchType: &security.StringMatch_Suffix{Suffix: "-prod"}}}},
				}},
				{Matches: []*security.Match{{
					DestinationPorts: []uint32{8080, 8443}, SourceIps: []*security.Address{secAddr("10.244.0.0/16")},
					NotSourceIps: []*security.Address{secAddr("10.244.9.9/32")}, DestinationIps: []*security.Address{secAddr("fd00::/64")},
					NotDestinationIps: []*security.Address{secAddr("10.96.0.1/32")},
				}}},
			}}},
		},
		{Name: "allow-all", Namespace: "apps", Scope: security.Scope_NAMESPACE, Action: security.Action_ALLOW,
			// An empty rule matches everything (AuthorizationPolicy rules: [{}]).
			Rules: []*security.Rule{{}}},
		{
			Name: "deny-legacy", Namespace: "istio-system", Scope: security.Scope_GLOBAL, Action: security.Action_DENY, DryRun: true,
			Rules: []*security.Rule{{Clauses: []*security.Clause{{Matches: []*security.Match{{
				NotPrincipals:       []*security.StringMatch{{MatchType: &security.StringMatch_Presence{Presence: &emptypb.Empty{}}}},
				NotNamespaces:       []*security.StringMatch{exact("kube-system")},
				ServiceAccounts:     []*security.ServiceAccountMatch{{Namespace: "legacy", ServiceAccount: "default"}},
				NotServiceAccounts:  []*security.ServiceAccountMatch{{Namespace: "legacy", ServiceAccount: "admin"}},
				NotDestinationPorts: []uint32{22},
			}}}}}},
		},
	}

	tbl := workloadtable.New()
	var addrs []*discoveryv3.Resource
	for _, w := range workloads {
		addrs = append(addrs, resource(t, workloadapi.AddressTypeURL, w.GetUid(), &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: w}}))
	}
	for _, s := range services {
		addrs = append(addrs, resource(t, workloadapi.AddressTypeURL, workloadapi.ServiceKey(s.GetNamespace(), s.GetHostname()),
			&workloadapi.Address{Type: &workloadapi.Address_Service{Service: s}}))
	}
	var authz []*discoveryv3.Resource
	for _, p := range policies {
		authz = append(authz, resource(t, workloadapi.AuthorizationTypeURL, security.ResourceName(p), p))
	}
	if rej := tbl.Apply(workloadapi.AddressTypeURL, addrs, nil); len(rej) > 0 {
		t.Fatalf("table rejected %v", rej)
	}
	if rej := tbl.Apply(workloadapi.AuthorizationTypeURL, authz, nil); len(rej) > 0 {
		t.Fatalf("table rejected %v", rej)
	}
	return tbl.Snapshot()
}

func readCert(t *testing.T, name string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		t.Fatalf("%s: no PEM block", name)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// dump is a whole /config_dump as node/admin assembles it.
func dump(t *testing.T, s workloadtable.Snapshot) configdump.Dump {
	t.Helper()
	leaf, root := readCert(t, "leaf.pem"), readCert(t, "root.pem")
	return configdump.Dump{
		Workloads: configdump.Workloads(s), Services: configdump.Services(s), Policies: configdump.Policies(s),
		Certificates: []configdump.CertState{{Identity: "spiffe://cluster.local/ns/apps/sa/echo", State: "Available",
			CertChain: []configdump.Certificate{configdump.Cert(leaf)}, RootCerts: []configdump.Certificate{configdump.Cert(root)}}},
		WorkloadState: map[string]configdump.PodState{"0b1c2d3e-pod-uid": {State: "Up",
			Info: map[string]string{"name": "echo-0", "namespace": "apps", "serviceAccount": "echo"}}},
		Version: "1.2.3-test",
		Config: map[string]any{"xdsAddress": "canopy-controller.istio-system.svc:15012", "caAddress": "canopy-controller.istio-system.svc:15012",
			"clusterId": "Kubernetes", "nodeName": "node-a"},
	}
}

// encode writes v as the admin port does.
func encode(t *testing.T, v any) []byte {
	t.Helper()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestGolden: each part of the dump, and the whole, as JSON; go test
// -update rewrites testdata/*.golden.
func TestGolden(t *testing.T) {
	t.Parallel()
	s := mesh(t)
	empty := workloadtable.New().Snapshot()
	for _, tt := range []struct {
		name string
		v    any
	}{
		{"workloads", configdump.Workloads(s)},
		{"services", configdump.Services(s)},
		{"policies", configdump.Policies(s)},
		{"dump", dump(t, s)},
		// An empty table has empty lists, never null: istioctl iterates
		// over them.
		{"empty", configdump.Dump{Workloads: configdump.Workloads(empty), Services: configdump.Services(empty),
			Policies: configdump.Policies(empty), Certificates: []configdump.CertState{}, WorkloadState: map[string]configdump.PodState{}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			golden.Check(t, tt.name+".golden", encode(t, tt.v))
		})
	}
}

func TestCert(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		file string
		want configdump.Certificate
	}{
		{"leaf.pem", configdump.Certificate{SerialNumber: "2246800662264969608"}}, // 0x1f2e3d4c5b6a7988, in decimal
		{"root.pem", configdump.Certificate{SerialNumber: "4096"}},
	} {
		t.Run(tt.file, func(t *testing.T) {
			t.Parallel()
			c := readCert(t, tt.file)
			pemText, err := os.ReadFile(filepath.Join("testdata", tt.file))
			if err != nil {
				t.Fatal(err)
			}
			// The PEM text in standard base64, as ztunnel writes it.
			tt.want.PEM, tt.want.ValidFrom, tt.want.ExpirationTime = base64.StdEncoding.EncodeToString(pemText), c.NotBefore, c.NotAfter
			got := configdump.Cert(c)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Cert() mismatch (-want +got):\n%s", diff)
			}
			back, err := configdump.ParsePEM(got.PEM)
			if err != nil || !back.Equal(c) {
				t.Errorf("ParsePEM(Cert().PEM) = %v, %v; want the certificate back", back, err)
			}
		})
	}
}

// TestRoundTrip: canopyctl decodes a node proxy's dump into Dump (as
// ctl's fetchDump does); nothing is lost, so encoding it again gives the
// same JSON, and the typed parts come back equal.
func TestRoundTrip(t *testing.T) {
	t.Parallel()
	want := dump(t, mesh(t))
	body := encode(t, want)
	var got configdump.Dump
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("decode: %v", err)
	}
	if diff := cmp.Diff(string(body), string(encode(t, got))); diff != "" {
		t.Errorf("JSON after a round trip (-sent +re-encoded):\n%s", diff)
	}
	// Policies hold map[string]any, whose numbers and lists decode as
	// float64 and []any: the JSON comparison above covers them.
	want.Policies, got.Policies = nil, nil
	want.Config, got.Config = nil, nil
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("decoded dump (-want +got):\n%s", diff)
	}
}

// TestZtunnelSpellings: enums are written as ztunnel's serde writes its
// own (variant names, no renaming): the policy scope and action of
// src/rbac.rs (RbacScope Global, Namespace, WorkloadSelector; RbacAction
// Allow, Deny), a workload's protocol, network mode and status of
// src/state/workload.rs (InboundProtocol TCP, HBONE; NetworkMode Standard,
// HostNetwork, always written; HealthStatus Healthy, Unhealthy). dryRun
// is always written too, as ztunnel's bool is.
func TestZtunnelSpellings(t *testing.T) {
	t.Parallel()
	s := mesh(t)
	type policy struct {
		Name, Scope, Action string
		DryRun              *bool
	}
	yes, no := true, false
	wantPolicies := []policy{
		{"allow-all", "Namespace", "Allow", &no},
		{"allow-frontend", "WorkloadSelector", "Allow", &no},
		{"deny-legacy", "Global", "Deny", &yes},
	}
	type workload struct{ Name, Protocol, NetworkMode, Status string }
	wantWorkloads := []workload{
		{"echo-0", "HBONE", "Standard", "Healthy"},
		{"node-exporter-x1", "TCP", "HostNetwork", "Unhealthy"},
		{"vm-1", "TCP", "Standard", "Healthy"},
	}
	// Read back from the JSON, as istioctl does.
	var got struct {
		Policies []struct {
			Name, Scope, Action string
			DryRun              *bool `json:"dryRun"`
		} `json:"policies"`
		Workloads []struct{ Name, Protocol, NetworkMode, Status string } `json:"workloads"`
	}
	if err := json.Unmarshal(encode(t, configdump.Dump{Policies: configdump.Policies(s), Workloads: configdump.Workloads(s)}), &got); err != nil {
		t.Fatal(err)
	}
	var gotPolicies []policy
	for _, p := range got.Policies {
		gotPolicies = append(gotPolicies, policy{p.Name, p.Scope, p.Action, p.DryRun})
	}
	var gotWorkloads []workload
	for _, w := range got.Workloads {
		gotWorkloads = append(gotWorkloads, workload(w))
	}
	slices.SortFunc(gotWorkloads, func(a, b workload) int { return strings.Compare(a.Name, b.Name) })
	if diff := cmp.Diff(wantPolicies, gotPolicies); diff != "" {
		t.Errorf("policies (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantWorkloads, gotWorkloads); diff != "" {
		t.Errorf("workloads (-want +got):\n%s", diff)
	}
}

// TestIstioctlDecodesPolicies: istioctl ztunnel-config decodes the whole
// dump into typed structs, a service-account match into an object
// {namespace, serviceAccount} (ztunnel's ServiceAccountMatch, src/rbac.rs),
// so a match written any other way fails every ztunnel-config command.
func TestIstioctlDecodesPolicies(t *testing.T) {
	t.Parallel()
	type saMatch struct {
		Namespace      string `json:"namespace"`
		ServiceAccount string `json:"serviceAccount"`
	}
	var got struct {
		Policies []struct {
			Name  string `json:"name"`
			Rules [][][]struct {
				ServiceAccounts    []saMatch `json:"serviceAccounts"`
				NotServiceAccounts []saMatch `json:"notServiceAccounts"`
			} `json:"rules"`
		} `json:"policies"`
	}
	if err := json.Unmarshal(encode(t, dump(t, mesh(t))), &got); err != nil {
		t.Fatalf("decode as istioctl does: %v", err)
	}
	var sas, notSAs []saMatch
	for _, p := range got.Policies {
		for _, r := range p.Rules {
			for _, c := range r {
				for _, m := range c {
					sas, notSAs = append(sas, m.ServiceAccounts...), append(notSAs, m.NotServiceAccounts...)
				}
			}
		}
	}
	if diff := cmp.Diff([]saMatch{{"legacy", "default"}}, sas); diff != "" {
		t.Errorf("serviceAccounts (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]saMatch{{"legacy", "admin"}}, notSAs); diff != "" {
		t.Errorf("notServiceAccounts (-want +got):\n%s", diff)
	}
}

// TestIstioctlReadsWhatZtunnelWrites: the fields istioctl ztunnel-config
// decodes into typed structs without omitempty, and so shows as zero
// values when missing, are written as ztunnel writes them: a workload's
// clusterId ("Kubernetes" when it names none) and capacity (1 when it
// names none), locality when known; a service's subjectAltNames (a list,
// empty or not), ipFamilies and loadBalancer when set, and each
// endpoint's ports.
func TestIstioctlReadsWhatZtunnelWrites(t *testing.T) {
	t.Parallel()
	type locality struct{ Region, Zone, Subzone string }
	type workload struct {
		Name      string    `json:"name"`
		ClusterID *string   `json:"clusterId"`
		Capacity  *uint32   `json:"capacity"`
		Locality  *locality `json:"locality"`
	}
	type endpoint struct {
		WorkloadUID string            `json:"workloadUid"`
		Port        map[string]uint32 `json:"port"`
	}
	type lb struct {
		RoutingPreferences []string `json:"routingPreferences"`
		Mode               string   `json:"mode"`
		HealthPolicy       string   `json:"healthPolicy"`
	}
	type service struct {
		Name            string              `json:"name"`
		SubjectAltNames *[]string           `json:"subjectAltNames"`
		IPFamilies      string              `json:"ipFamilies"`
		LoadBalancer    *lb                 `json:"loadBalancer"`
		Endpoints       map[string]endpoint `json:"endpoints"`
	}
	var got struct {
		Workloads []workload `json:"workloads"`
		Services  []service  `json:"services"`
	}
	if err := json.Unmarshal(encode(t, dump(t, mesh(t))), &got); err != nil {
		t.Fatal(err)
	}
	ptr := func(s string) *string { return &s }
	num := func(n uint32) *uint32 { return &n }
	wantWorkloads := []workload{
		{Name: "echo-0", ClusterID: ptr("Kubernetes"), Capacity: num(3), Locality: &locality{Region: "eu", Zone: "eu-a"}},
		{Name: "node-exporter-x1", ClusterID: ptr("Kubernetes"), Capacity: num(1)},
		{Name: "vm-1", ClusterID: ptr("Kubernetes"), Capacity: num(1)},
	}
	if diff := cmp.Diff(wantWorkloads, got.Workloads); diff != "" {
		t.Errorf("workloads (-want +got):\n%s", diff)
	}
	echo := workloadapi.PodUID("Kubernetes", "apps", "echo-0")
	vm := "Kubernetes/networking.istio.io/WorkloadEntry/legacy/vm-1"
	wantServices := []service{
		{Name: "echo-canary", SubjectAltNames: &[]string{}, Endpoints: map[string]endpoint{echo: {WorkloadUID: echo, Port: map[string]uint32{}}}},
		{Name: "echo", SubjectAltNames: &[]string{"spiffe://cluster.local/ns/apps/sa/echo"}, IPFamilies: "Dual",
			LoadBalancer: &lb{RoutingPreferences: []string{"Network", "Zone"}, Mode: "Failover", HealthPolicy: "OnlyHealthy"},
			Endpoints: map[string]endpoint{
				echo: {WorkloadUID: echo, Port: map[string]uint32{"80": 8080}},
				vm:   {WorkloadUID: vm, Port: map[string]uint32{}},
			}},
	}
	if diff := cmp.Diff(wantServices, got.Services); diff != "" {
		t.Errorf("services (-want +got):\n%s", diff)
	}
}
