package workloadapi

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestResourceNameAndAliases(t *testing.T) {
	t.Parallel()
	bits := func(n uint32) *uint32 { return &n }
	for _, tt := range []struct {
		name        string
		in          *Address
		wantName    string
		wantAliases []string
	}{
		{
			name: "workload on the default network",
			in: &Address{Type: &Address_Workload{Workload: &Workload{
				Uid:       "Kubernetes//Pod/default/echo-1",
				Addresses: [][]byte{{10, 244, 1, 5}, {0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5}},
			}}},
			wantName:    "Kubernetes//Pod/default/echo-1",
			wantAliases: []string{"/10.244.1.5", "/fd00::5"},
		},
		{
			name: "workload with a malformed address keeps the good one",
			in: &Address{Type: &Address_Workload{Workload: &Workload{
				Uid: "u", Network: "net1", Addresses: [][]byte{{1, 2, 3}, {10, 0, 0, 1}},
			}}},
			wantName:    "u",
			wantAliases: []string{"net1/10.0.0.1"},
		},
		{
			name: "service with a VIP and a CIDR",
			in: &Address{Type: &Address_Service{Service: &Service{
				Namespace: "default", Hostname: "echo.default.svc.cluster.local",
				Addresses: []*NetworkAddress{
					{Address: []byte{10, 96, 0, 20}},
					{Network: "n", Address: []byte{192, 168, 0, 0}, Length: bits(16)},
					{Address: []byte{1, 2, 3, 4}, Length: bits(99)},
				},
			}}},
			wantName:    "default/echo.default.svc.cluster.local",
			wantAliases: []string{"/10.96.0.20", "n/192.168.0.0/16"},
		},
		{name: "empty", in: &Address{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := ResourceName(tt.in); got != tt.wantName {
				t.Errorf("ResourceName() = %q, want %q", got, tt.wantName)
			}
			if diff := cmp.Diff(tt.wantAliases, Aliases(tt.in)); diff != "" {
				t.Errorf("Aliases() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}
