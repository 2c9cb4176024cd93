package workloadapi_test

import (
	"encoding/hex"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	wapi "github.com/canopy-mesh/canopy/workloadapi"
	"github.com/canopy-mesh/canopy/workloadapi/security"
	"github.com/canopy-mesh/canopy/workloadapi/zds"
)

// wireVector is a message and its encoding, written out by hand from the
// field numbers and types of the wire contract (the tables of
// docs/wire-contract.md §1 and §3.2), not from the generated code: a
// renumbered or retyped field changes the bytes.
//
// Tags are (field number << 3 | wire type): wire type 0 is a varint, 2 is
// length-delimited. Field numbers from 16 on take two tag bytes.
type wireVector struct {
	name string
	msg  proto.Message
	hex  string
}

func wireVectors() []wireVector {
	gatewayByHostname := &wapi.GatewayAddress{
		Destination:   &wapi.GatewayAddress_Hostname{Hostname: &wapi.NamespacedHostname{Namespace: "n", Hostname: "h"}},
		HboneMtlsPort: 15008,
	}
	// The Go encoder writes oneof members after the other fields; fields may
	// come in any order on the wire, so these vectors follow the encoder.
	const gatewayByHostnameHex = "18 a0 75" + // 3 hbone_mtls_port 15008
		"0a 06 0a 01 6e 12 01 68" // 1 hostname: {1 namespace "n", 2 hostname "h"}
	gatewayByAddress := &wapi.GatewayAddress{
		Destination:   &wapi.GatewayAddress_Address{Address: &wapi.NetworkAddress{Address: ip("1.2.3.4")}},
		HboneMtlsPort: 15008,
	}
	const gatewayByAddressHex = "18 a0 75" + // 3 hbone_mtls_port 15008
		"12 06 12 04 01 02 03 04" // 2 address: {2 address 1.2.3.4}

	return []wireVector{
		// istio.workload
		{"Port", &wapi.Port{ServicePort: 80, TargetPort: 8080, AppProtocol: wapi.AppProtocol_HTTP2},
			"08 50" + // 1 service_port 80
				"10 90 3f" + // 2 target_port 8080
				"18 02"}, // 3 app_protocol HTTP2
		{"PortList", &wapi.PortList{Ports: []*wapi.Port{{ServicePort: 1, TargetPort: 2}}},
			"0a 04 08 01 10 02"}, // 1 ports: {1 service_port 1, 2 target_port 2}
		{"Locality", &wapi.Locality{Region: "r", Zone: "z", Subzone: "s"},
			"0a 01 72" + // 1 region "r"
				"12 01 7a" + // 2 zone "z"
				"1a 01 73"}, // 3 subzone "s"
		{"LoadBalancing", &wapi.LoadBalancing{
			RoutingPreference: []wapi.LoadBalancing_Scope{wapi.LoadBalancing_NETWORK, wapi.LoadBalancing_ZONE},
			Mode:              wapi.LoadBalancing_FAILOVER,
			HealthPolicy:      wapi.LoadBalancing_ALLOW_ALL,
		},
			"0a 02 06 02" + // 1 routing_preference, packed: NETWORK(6), ZONE(2)
				"10 02" + // 2 mode FAILOVER
				"18 01"}, // 3 health_policy ALLOW_ALL
		{"NetworkAddress/cidr", &wapi.NetworkAddress{Network: "n", Address: ip("10.0.0.1"), Length: proto.Uint32(24)},
			"0a 01 6e" + // 1 network "n"
				"12 04 0a 00 00 01" + // 2 address 10.0.0.1
				"18 18"}, // 3 length 24
		{"NetworkAddress/length present and zero", &wapi.NetworkAddress{Length: proto.Uint32(0)},
			"18 00"}, // 3 length 0: optional, so presence is on the wire
		{"NetworkAddress/host", &wapi.NetworkAddress{Address: ip("2001:db8::1")},
			"12 10 20 01 0d b8 00 00 00 00 00 00 00 00 00 00 00 01"}, // 2 address, 16 bytes
		{"NamespacedHostname", &wapi.NamespacedHostname{Namespace: "n", Hostname: "h"},
			"0a 01 6e 12 01 68"},
		{"GatewayAddress/hostname", gatewayByHostname, gatewayByHostnameHex},
		{"GatewayAddress/address", gatewayByAddress, gatewayByAddressHex},
		{"WeightedWaypoint", &wapi.WeightedWaypoint{Destination: gatewayByAddress, Weight: 90},
			"0a 0b " + gatewayByAddressHex + // 1 destination
				"10 5a"}, // 2 weight 90
		{"ApplicationTunnel", &wapi.ApplicationTunnel{Protocol: wapi.ApplicationTunnel_PROXY, Port: 15088},
			"08 01" + // 1 protocol PROXY
				"10 f0 75"}, // 2 port 15088
		{"Extension", &wapi.Extension{Name: "e", Config: &anypb.Any{TypeUrl: "t", Value: []byte{1}}},
			"0a 01 65" + // 1 name "e"
				"12 06 0a 01 74 12 01 01"}, // 2 config: Any{1 type_url "t", 2 value 0x01}
		{"Service", &wapi.Service{
			Name:               "s",
			Namespace:          "n",
			Hostname:           "h",
			Addresses:          []*wapi.NetworkAddress{{Address: ip("10.0.0.1")}},
			Ports:              []*wapi.Port{{ServicePort: 80, TargetPort: 8080}},
			SubjectAltNames:    []string{"x"},
			Waypoint:           gatewayByHostname,
			LoadBalancing:      &wapi.LoadBalancing{Mode: wapi.LoadBalancing_STRICT},
			IpFamilies:         wapi.IPFamilies_DUAL,
			Extensions:         []*wapi.Extension{{Name: "e"}},
			Canonical:          true,
			IngressUseWaypoint: true,
			WeightedWaypoints:  []*wapi.WeightedWaypoint{{Weight: 1}},
			Visibility:         wapi.Service_NAMESPACE,
		},
			"0a 01 73" + // 1 name "s"
				"12 01 6e" + // 2 namespace "n"
				"1a 01 68" + // 3 hostname "h"
				"22 06 12 04 0a 00 00 01" + // 4 addresses: {2 address 10.0.0.1}
				"2a 05 08 50 10 90 3f" + // 5 ports: {80 -> 8080}
				"32 01 78" + // 6 subject_alt_names "x"
				"3a 0b " + gatewayByHostnameHex + // 7 waypoint
				"42 02 10 01" + // 8 load_balancing: {2 mode STRICT}
				"48 03" + // 9 ip_families DUAL
				"52 03 0a 01 65" + // 10 extensions: {1 name "e"}
				"58 01" + // 11 canonical
				"60 01" + // 12 ingress_use_waypoint
				"6a 02 10 01" + // 13 weighted_waypoints: {2 weight 1}
				"70 01"}, // 14 visibility NAMESPACE
		{"Workload", &wapi.Workload{
			Uid:                   "u",
			Name:                  "w",
			Namespace:             "n",
			Addresses:             [][]byte{ip("10.0.0.1"), ip("::1")},
			Hostname:              "h",
			Network:               "k",
			TunnelProtocol:        wapi.TunnelProtocol_HBONE,
			TrustDomain:           "t",
			ServiceAccount:        "a",
			Waypoint:              gatewayByAddress,
			NetworkGateway:        &wapi.GatewayAddress{HboneMtlsPort: 15008},
			Node:                  "o",
			CanonicalName:         "c",
			CanonicalRevision:     "v",
			WorkloadType:          wapi.WorkloadType_POD,
			WorkloadName:          "d",
			NativeTunnel:          true,
			ApplicationTunnel:     &wapi.ApplicationTunnel{Protocol: wapi.ApplicationTunnel_PROXY},
			Services:              map[string]*wapi.PortList{"k": {Ports: []*wapi.Port{{ServicePort: 1, TargetPort: 2}}}},
			AuthorizationPolicies: []string{"p"},
			Status:                wapi.WorkloadStatus_UNHEALTHY,
			ClusterId:             "K",
			Locality:              &wapi.Locality{Zone: "z"},
			NetworkMode:           wapi.NetworkMode_HOST_NETWORK,
			Extensions:            []*wapi.Extension{{Name: "e"}},
			Capacity:              wrapperspb.UInt32(3),
		},
			"0a 01 77" + // 1 name "w"
				"12 01 6e" + // 2 namespace "n"
				"1a 04 0a 00 00 01" + // 3 addresses 10.0.0.1
				"1a 10 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 01" + // 3 addresses ::1
				"22 01 6b" + // 4 network "k"
				"28 01" + // 5 tunnel_protocol HBONE
				"32 01 74" + // 6 trust_domain "t"
				"3a 01 61" + // 7 service_account "a"
				"42 0b " + gatewayByAddressHex + // 8 waypoint
				"4a 01 6f" + // 9 node "o"
				"52 01 63" + // 10 canonical_name "c"
				"5a 01 76" + // 11 canonical_revision "v"
				"60 02" + // 12 workload_type POD
				"6a 01 64" + // 13 workload_name "d"
				"70 01" + // 14 native_tunnel
				"82 01 01 70" + // 16 authorization_policies "p"
				"88 01 01" + // 17 status UNHEALTHY
				"92 01 01 4b" + // 18 cluster_id "K"
				"9a 01 03 18 a0 75" + // 19 network_gateway: {3 hbone_mtls_port 15008}
				"a2 01 01 75" + // 20 uid "u"
				"aa 01 01 68" + // 21 hostname "h"
				"b2 01 0b 0a 01 6b 12 06 0a 04 08 01 10 02" + // 22 services: entry {1 key "k", 2 value PortList{1 -> 2}}
				"ba 01 02 08 01" + // 23 application_tunnel: {1 protocol PROXY}
				"c2 01 03 12 01 7a" + // 24 locality: {2 zone "z"}
				"c8 01 01" + // 25 network_mode HOST_NETWORK
				"d2 01 03 0a 01 65" + // 26 extensions: {1 name "e"}
				"da 01 02 08 03"}, // 27 capacity: UInt32Value{1 value 3}
		{"Address/workload", &wapi.Address{Type: &wapi.Address_Workload{Workload: &wapi.Workload{Uid: "u"}}},
			"0a 04 a2 01 01 75"}, // 1 workload: {20 uid "u"}
		{"Address/service", &wapi.Address{Type: &wapi.Address_Service{Service: &wapi.Service{Name: "s"}}},
			"12 03 0a 01 73"}, // 2 service: {1 name "s"}

		// istio.security
		{"StringMatch/exact", &security.StringMatch{MatchType: &security.StringMatch_Exact{Exact: "e"}}, "0a 01 65"},
		{"StringMatch/prefix", &security.StringMatch{MatchType: &security.StringMatch_Prefix{Prefix: "p"}}, "12 01 70"},
		{"StringMatch/suffix", &security.StringMatch{MatchType: &security.StringMatch_Suffix{Suffix: "s"}}, "1a 01 73"},
		{"StringMatch/presence", &security.StringMatch{MatchType: &security.StringMatch_Presence{Presence: &emptypb.Empty{}}}, "22 00"},
		{"ServiceAccountMatch", &security.ServiceAccountMatch{Namespace: "n", ServiceAccount: "a"},
			"0a 01 6e 12 01 61"},
		{"security.Address", &security.Address{Address: ip("10.0.0.0"), Length: 8},
			"0a 04 0a 00 00 00" + // 1 address 10.0.0.0
				"10 08"}, // 2 length 8
		{"Match", &security.Match{
			Namespaces:          []*security.StringMatch{{MatchType: &security.StringMatch_Exact{Exact: "a"}}},
			NotNamespaces:       []*security.StringMatch{{MatchType: &security.StringMatch_Prefix{Prefix: "b"}}},
			Principals:          []*security.StringMatch{{MatchType: &security.StringMatch_Suffix{Suffix: "c"}}},
			NotPrincipals:       []*security.StringMatch{{MatchType: &security.StringMatch_Presence{Presence: &emptypb.Empty{}}}},
			SourceIps:           []*security.Address{{Address: ip("10.0.0.0"), Length: 8}},
			NotSourceIps:        []*security.Address{{Length: 32}},
			DestinationIps:      []*security.Address{{Length: 1}},
			NotDestinationIps:   []*security.Address{{Length: 2}},
			DestinationPorts:    []uint32{80, 443},
			NotDestinationPorts: []uint32{22},
			ServiceAccounts:     []*security.ServiceAccountMatch{{Namespace: "n", ServiceAccount: "a"}},
			NotServiceAccounts:  []*security.ServiceAccountMatch{{ServiceAccount: "x"}},
			Extensions:          []*wapi.Extension{{Name: "e"}},
		},
			"0a 03 0a 01 61" + // 1 namespaces: exact "a"
				"12 03 12 01 62" + // 2 not_namespaces: prefix "b"
				"1a 03 1a 01 63" + // 3 principals: suffix "c"
				"22 02 22 00" + // 4 not_principals: presence
				"2a 08 0a 04 0a 00 00 00 10 08" + // 5 source_ips: 10.0.0.0/8
				"32 02 10 20" + // 6 not_source_ips: {2 length 32}
				"3a 02 10 01" + // 7 destination_ips: {2 length 1}
				"42 02 10 02" + // 8 not_destination_ips: {2 length 2}
				"4a 03 50 bb 03" + // 9 destination_ports, packed: 80, 443
				"52 01 16" + // 10 not_destination_ports, packed: 22
				"5a 06 0a 01 6e 12 01 61" + // 11 service_accounts: {n, a}
				"62 03 12 01 78" + // 12 not_service_accounts: {2 serviceAccount "x"}
				"6a 03 0a 01 65"}, // 13 extensions: {1 name "e"}
		{"Clause", &security.Clause{Matches: []*security.Match{{DestinationPorts: []uint32{80}}}},
			"12 03 4a 01 50"}, // 2 matches (field 1 is unused): {9 destination_ports 80}
		{"Rule", &security.Rule{Clauses: []*security.Clause{{Matches: []*security.Match{{}}}}},
			"0a 02 12 00"}, // 1 clauses: {2 matches: {}}
		{"Authorization", &security.Authorization{
			Name:       "a",
			Namespace:  "n",
			Scope:      security.Scope_WORKLOAD_SELECTOR,
			Action:     security.Action_DENY,
			Rules:      []*security.Rule{{}},
			DryRun:     true,
			Extensions: []*wapi.Extension{{Name: "e"}},
		},
			"0a 01 61" + // 1 name "a"
				"12 01 6e" + // 2 namespace "n"
				"18 02" + // 3 scope WORKLOAD_SELECTOR
				"20 01" + // 4 action DENY
				"2a 00" + // 5 rules: {}
				"30 01" + // 6 dry_run
				"3a 03 0a 01 65"}, // 7 extensions: {1 name "e"}

		// istio.workload.zds
		{"ZdsHello", &zds.ZdsHello{Version: zds.Version_V1}, "08 01"},
		{"WorkloadInfo", &zds.WorkloadInfo{Name: "p", Namespace: "n", ServiceAccount: "s"},
			"0a 01 70 12 01 6e 1a 01 73"},
		{"AddWorkload", &zds.AddWorkload{Uid: "u", WorkloadInfo: &zds.WorkloadInfo{Name: "p"}},
			"0a 01 75" + // 1 uid "u"
				"12 03 0a 01 70"}, // 2 workload_info: {1 name "p"}
		{"KeepWorkload", &zds.KeepWorkload{Uid: "u"}, "0a 01 75"},
		{"DelWorkload", &zds.DelWorkload{Uid: "u"}, "12 01 75"}, // uid is field 2
		{"SnapshotSent", &zds.SnapshotSent{}, ""},
		{"WorkloadRequest/add", &zds.WorkloadRequest{Payload: &zds.WorkloadRequest_Add{Add: &zds.AddWorkload{Uid: "u"}}},
			"0a 03 0a 01 75"},
		{"WorkloadRequest/del", &zds.WorkloadRequest{Payload: &zds.WorkloadRequest_Del{Del: &zds.DelWorkload{Uid: "u"}}},
			"12 03 12 01 75"},
		{"WorkloadRequest/snapshot_sent", &zds.WorkloadRequest{Payload: &zds.WorkloadRequest_SnapshotSent{SnapshotSent: &zds.SnapshotSent{}}},
			"1a 00"},
		{"WorkloadRequest/keep", &zds.WorkloadRequest{Payload: &zds.WorkloadRequest_Keep{Keep: &zds.KeepWorkload{Uid: "u"}}},
			"2a 03 0a 01 75"}, // keep is field 5
		{"Ack", &zds.Ack{Error: "e"}, "0a 01 65"},
		{"WorkloadResponse", &zds.WorkloadResponse{Payload: &zds.WorkloadResponse_Ack{Ack: &zds.Ack{Error: "e"}}},
			"0a 03 0a 01 65"},
	}
}

func ip(s string) []byte { return netip.MustParseAddr(s).AsSlice() }

func decodeHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatalf("bad hex vector %q: %v", s, err)
	}
	return b
}

func TestWireVectors(t *testing.T) {
	t.Parallel()
	for _, v := range wireVectors() {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			want := decodeHex(t, v.hex)
			got, err := proto.MarshalOptions{Deterministic: true}.Marshal(v.msg)
			if err != nil {
				t.Fatalf("marshal: %v", err)
			}
			if string(got) != string(want) {
				t.Errorf("encoding mismatch\n got: % x\nwant: % x", got, want)
			}

			decoded := v.msg.ProtoReflect().New().Interface()
			if err := proto.Unmarshal(want, decoded); err != nil {
				t.Fatalf("unmarshal vector: %v", err)
			}
			if diff := cmp.Diff(v.msg, decoded, protocmp.Transform()); diff != "" {
				t.Errorf("decoded vector mismatch (-want +got):\n%s", diff)
			}
			if unknown := decoded.ProtoReflect().GetUnknown(); len(unknown) > 0 {
				t.Errorf("vector left unknown fields: % x", unknown)
			}
		})
	}
}

// TestWireVectorsCoverEveryField makes the vectors complete: every message of
// the three protocol files has a vector, and every field of every message is
// set in at least one vector, so no field escapes the wire check.
func TestWireVectorsCoverEveryField(t *testing.T) {
	t.Parallel()
	seenMsg := map[protoreflect.FullName]bool{}
	seenField := map[protoreflect.FullName]bool{}
	var walk func(m protoreflect.Message)
	walk = func(m protoreflect.Message) {
		seenMsg[m.Descriptor().FullName()] = true
		m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			seenField[fd.FullName()] = true
			switch {
			case fd.IsMap():
				if fd.MapValue().Kind() == protoreflect.MessageKind {
					v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
						walk(mv.Message())
						return true
					})
				}
			case fd.IsList() && fd.Kind() == protoreflect.MessageKind:
				for i := 0; i < v.List().Len(); i++ {
					walk(v.List().Get(i).Message())
				}
			case fd.Kind() == protoreflect.MessageKind:
				walk(v.Message())
			}
			return true
		})
	}
	for _, v := range wireVectors() {
		walk(v.msg.ProtoReflect())
		// A message with no fields set still counts as covered by its vector.
		seenMsg[v.msg.ProtoReflect().Descriptor().FullName()] = true
	}

	for _, file := range []protoreflect.FileDescriptor{
		wapi.File_workload_proto,
		security.File_authorization_proto,
		zds.File_zds_proto,
	} {
		msgs := file.Messages()
		for i := 0; i < msgs.Len(); i++ {
			md := msgs.Get(i)
			if !seenMsg[md.FullName()] {
				t.Errorf("no wire vector for message %s", md.FullName())
			}
			fields := md.Fields()
			for j := 0; j < fields.Len(); j++ {
				if fd := fields.Get(j); !seenField[fd.FullName()] {
					t.Errorf("no wire vector sets field %s (%d)", fd.FullName(), fd.Number())
				}
			}
		}
	}
}
