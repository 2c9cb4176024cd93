package workloadapi

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseIdentity(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in      string
		want    Identity
		wantErr bool
	}{
		{in: "spiffe://cluster.local/ns/default/sa/default", want: Identity{"cluster.local", "default", "default"}},
		{in: "spiffe://example.org/ns/ns-1/sa/bookinfo-productpage", want: Identity{"example.org", "ns-1", "bookinfo-productpage"}},
		{in: "spiffe://td/ns/sa/sa/ns", want: Identity{"td", "sa", "ns"}},

		{in: "", wantErr: true},
		{in: "cluster.local/ns/default/sa/default", wantErr: true},
		{in: "https://cluster.local/ns/default/sa/default", wantErr: true},
		{in: "spiffe://Cluster.local/ns/default/sa/default", wantErr: true},
		{in: "spiffe://cluster.local", wantErr: true},
		{in: "spiffe://cluster.local/ns/default", wantErr: true},
		{in: "spiffe://cluster.local/ns/default/sa", wantErr: true},
		{in: "spiffe://cluster.local/ns/default/sa/", wantErr: true},
		{in: "spiffe://cluster.local/ns//sa/x", wantErr: true},
		{in: "spiffe://cluster.local/sa/x/ns/y", wantErr: true},
		{in: "spiffe://cluster.local/ns/a/sa/b/extra", wantErr: true},
		{in: "spiffe://cluster.local/ns/a/sa/b?x=1", wantErr: true},
		{in: "spiffe://cluster.local/ns/a/sa/b#f", wantErr: true},
		{in: "spiffe://user@cluster.local/ns/a/sa/b", wantErr: true},
		{in: "spiffe://cluster.local:8080/ns/a/sa/b", wantErr: true},
		{in: "spiffe://cluster.local/ns/../sa/b", wantErr: true},
	} {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			got, err := ParseIdentity(tt.in)
			if tt.wantErr {
				if !errors.Is(err, ErrMalformedName) {
					t.Fatalf("ParseIdentity(%q) = %+v, %v; want ErrMalformedName", tt.in, got, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseIdentity(%q): %v", tt.in, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseIdentity(%q) mismatch (-want +got):\n%s", tt.in, diff)
			}
			if s := got.String(); s != tt.in {
				t.Errorf("String() = %q, want %q", s, tt.in)
			}
		})
	}
}

func TestIdentityPrincipal(t *testing.T) {
	t.Parallel()
	id := Identity{TrustDomain: "cluster.local", Namespace: "ns", ServiceAccount: "sa"}
	if got, want := id.Principal(), "cluster.local/ns/ns/sa/sa"; got != want {
		t.Errorf("Principal() = %q, want %q", got, want)
	}
}

func TestWorkloadIdentityDefaults(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		w    *Workload
		want string
	}{
		{"defaults", &Workload{Namespace: "ns"}, "spiffe://cluster.local/ns/ns/sa/default"},
		{"explicit", &Workload{Namespace: "ns", TrustDomain: "example.org", ServiceAccount: "api"}, "spiffe://example.org/ns/ns/sa/api"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := WorkloadIdentity(tt.w).String(); got != tt.want {
				t.Errorf("WorkloadIdentity() = %q, want %q", got, tt.want)
			}
		})
	}
}

func FuzzParseIdentity(f *testing.F) {
	f.Add("spiffe://cluster.local/ns/default/sa/default")
	f.Add("spiffe://td/ns/a/sa/b/c")
	f.Add("spiffe://TD/ns/a/sa/b")
	f.Fuzz(func(t *testing.T, s string) {
		id, err := ParseIdentity(s)
		if err != nil {
			if !errors.Is(err, ErrMalformedName) {
				t.Fatalf("error %v does not wrap ErrMalformedName", err)
			}
			return
		}
		if got := id.String(); got != s {
			t.Fatalf("ParseIdentity(%q).String() = %q", s, got)
		}
	})
}
