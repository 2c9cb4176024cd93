package debugjson

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/canopy-mesh/canopy/internal/testing/golden"
	"github.com/canopy-mesh/canopy/workloadapi"
	"github.com/canopy-mesh/canopy/workloadapi/security"
)

func ip(s string) []byte { return netip.MustParseAddr(s).AsSlice() }

func ptr[T any](v T) *T { return &v }

// TestMarshal: every IP field of the workload API as text, wherever it
// sits (a list, a oneof, a map value's message, inside an Any), and the
// rest as protojson writes it.
func TestMarshal(t *testing.T) {
	workload := &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: &workloadapi.Workload{
		Uid: "Kubernetes//Pod/demo/echo-a", Name: "echo-a", Namespace: "demo",
		Addresses:      [][]byte{ip("10.244.1.5"), ip("fd00::5"), {1, 2, 3}},
		TunnelProtocol: workloadapi.TunnelProtocol_HBONE,
		Waypoint: &workloadapi.GatewayAddress{Destination: &workloadapi.GatewayAddress_Address{
			Address: &workloadapi.NetworkAddress{Network: "net1", Address: ip("10.96.0.30")}}, HboneMtlsPort: 15008},
		Services: map[string]*workloadapi.PortList{"demo/echo.demo.svc.cluster.local": {Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}}}},
	}}}
	service := &workloadapi.Address{Type: &workloadapi.Address_Service{Service: &workloadapi.Service{
		Name: "echo", Namespace: "demo", Hostname: "echo.demo.svc.cluster.local",
		Addresses: []*workloadapi.NetworkAddress{{Address: ip("10.96.0.20")}, {Network: "net1", Address: ip("10.97.0.0"), Length: ptr[uint32](16)}},
	}}}
	policy := &security.Authorization{Name: "allow", Namespace: "demo", Action: security.Action_ALLOW, Rules: []*security.Rule{{
		Clauses: []*security.Clause{{Matches: []*security.Match{{
			SourceIps:      []*security.Address{{Address: ip("10.244.0.0"), Length: 16}},
			NotSourceIps:   []*security.Address{{Address: ip("2001:db8::1"), Length: 128}},
			DestinationIps: []*security.Address{{Address: ip("10.0.0.1"), Length: 32}},
		}}}},
	}}}
	anyWorkload, err := anypb.New(workload)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	for _, m := range []proto.Message{workload, service, policy, anyWorkload} {
		b, err := Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Indent(&out, b, "", "  "); err != nil {
			t.Fatalf("Marshal(%T) is not valid JSON: %v\n%s", m, err, b)
		}
		out.WriteString("\n")
	}
	golden.Check(t, "marshal.golden", out.Bytes())
}

// TestIPFieldsComplete: every bytes field of the workload API is either
// an IP field or listed here, so a new one gets a decision.
func TestIPFieldsComplete(t *testing.T) {
	notIP := map[protoreflect.FullName]bool{}
	for _, fd := range []protoreflect.FileDescriptor{workloadapi.File_workload_proto, security.File_authorization_proto} {
		var walk func(protoreflect.MessageDescriptors)
		walk = func(ms protoreflect.MessageDescriptors) {
			for i := range ms.Len() {
				md := ms.Get(i)
				for j := range md.Fields().Len() {
					f := md.Fields().Get(j)
					if f.Kind() == protoreflect.BytesKind && !IsIPField(f) && !notIP[f.FullName()] {
						t.Errorf("bytes field %s: is it an IP? add it to IsIPField or to notIP here", f.FullName())
					}
				}
				walk(md.Messages())
			}
		}
		walk(fd.Messages())
	}
}
