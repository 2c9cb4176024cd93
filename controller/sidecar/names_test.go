package sidecar

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestParseClusterName: a proxy asks for any string; only
// "<direction>|<port>|<subset>|<hostname>" parses, each part checked.
func TestParseClusterName(t *testing.T) {
	for _, tt := range []struct {
		name string
		want ClusterKey
		ok   bool
	}{
		{"outbound|80||web.a.svc.cluster.local", ClusterKey{Outbound, 80, "", "web.a.svc.cluster.local"}, true},
		{"outbound|8080|v1|web.a.svc.cluster.local", ClusterKey{Outbound, 8080, "v1", "web.a.svc.cluster.local"}, true},
		{"inbound|80||", ClusterKey{Inbound, 80, "", ""}, true},
		{"outbound|80||", ClusterKey{}, false},
		{"outbound|80|web", ClusterKey{}, false},
		{"outbound|80||web|x", ClusterKey{}, false},
		{"sideways|80||web", ClusterKey{}, false},
		{"outbound|0||web", ClusterKey{}, false},
		{"outbound|65536||web", ClusterKey{}, false},
		{"outbound|x||web", ClusterKey{}, false},
		{"outbound|080||web", ClusterKey{}, false}, // one name for one cluster
		{"outbound|+80||web", ClusterKey{}, false},
		{"", ClusterKey{}, false},
	} {
		got, err := ParseClusterName(tt.name)
		if (err == nil) != tt.ok {
			t.Errorf("ParseClusterName(%q) error %v, want ok %v", tt.name, err, tt.ok)
			continue
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("ParseClusterName(%q) (-want +got):\n%s", tt.name, diff)
		}
	}
}

// FuzzParseClusterName: what parses is a cluster name, written back the
// same (no two names for one cluster), and parsing it allocates nothing.
func FuzzParseClusterName(f *testing.F) {
	for _, s := range []string{"outbound|80||web.a.svc.cluster.local", "inbound|80||", "outbound|80|v1|x", "a|b|c|d", "|||", "outbound|80||a|b", "outbound|080||x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		k, err := ParseClusterName(name)
		if err != nil {
			return
		}
		if k.String() != name {
			t.Errorf("ParseClusterName(%q) = %+v, written back as %q", name, k, k.String())
		}
		if n := testing.AllocsPerRun(1, func() { _, _ = ParseClusterName(name) }); n != 0 {
			t.Errorf("ParseClusterName(%q): %v allocations", name, n)
		}
	})
}
