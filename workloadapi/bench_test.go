package workloadapi_test

import (
	"net/netip"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	wapi "github.com/canopy-mesh/canopy/workloadapi"
)

// typicalPodAddress is what the control plane sends for an ambient pod that
// backs one service: the unit of every push.
func typicalPodAddress() *wapi.Address {
	return &wapi.Address{Type: &wapi.Address_Workload{Workload: &wapi.Workload{
		Uid:               wapi.PodUID("Kubernetes", "shop", "checkout-7c9f8d6b5-x2x9q"),
		Name:              "checkout-7c9f8d6b5-x2x9q",
		Namespace:         "shop",
		Addresses:         [][]byte{netip.MustParseAddr("10.244.1.17").AsSlice()},
		TunnelProtocol:    wapi.TunnelProtocol_HBONE,
		ServiceAccount:    "checkout",
		Node:              "node-1",
		CanonicalName:     "checkout",
		CanonicalRevision: "v3",
		WorkloadType:      wapi.WorkloadType_POD,
		WorkloadName:      "checkout",
		Services: map[string]*wapi.PortList{
			"shop/checkout.shop.svc.cluster.local": {Ports: []*wapi.Port{{ServicePort: 80, TargetPort: 8080}}},
		},
		ClusterId: "Kubernetes",
		Locality:  &wapi.Locality{Region: "eu-west", Zone: "eu-west-1a"},
	}}}
}

// BenchmarkMarshalAddressAny measures encoding one workload as the Any an
// xDS response carries.
func BenchmarkMarshalAddressAny(b *testing.B) {
	a := typicalPodAddress()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := anypb.New(a); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkUnmarshalAddress measures decoding one workload, the node proxy's
// per-resource cost.
func BenchmarkUnmarshalAddress(b *testing.B) {
	raw, err := proto.Marshal(typicalPodAddress())
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		var a wapi.Address
		if err := proto.Unmarshal(raw, &a); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseAddressKey measures parsing an on-demand lookup key.
func BenchmarkParseAddressKey(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := wapi.ParseAddressKey("/10.244.1.17"); err != nil {
			b.Fatal(err)
		}
	}
}
