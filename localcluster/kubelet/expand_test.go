package kubelet

import "testing"

func TestExpand(t *testing.T) {
	vars := map[string]string{"POD_NAMESPACE": "grpc-demo", "EMPTY": ""}
	for _, tt := range []struct{ in, want string }{
		{"plain", "plain"},
		{"--domain $(POD_NAMESPACE).svc.cluster.local", "--domain grpc-demo.svc.cluster.local"},
		{"$(POD_NAMESPACE)$(POD_NAMESPACE)", "grpc-demogrpc-demo"},
		{"$(EMPTY)x", "x"},
		{"$(UNDEFINED) stays", "$(UNDEFINED) stays"},
		{"$$(POD_NAMESPACE) is escaped", "$(POD_NAMESPACE) is escaped"},
		{"$$", "$"},
		{"cost $5", "cost $5"},
		{"trailing $", "trailing $"},
		{"unclosed $(POD_NAMESPACE", "unclosed $(POD_NAMESPACE"},
	} {
		if got := expand(tt.in, vars); got != tt.want {
			t.Errorf("expand(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func FuzzExpand(f *testing.F) {
	for _, s := range []string{"$(A)", "$$", "$(", "a$(B)c", "$"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		// Without variables, only $$ changes: nothing is lost or made up.
		got := expand(s, nil)
		if len(got) > len(s) {
			t.Fatalf("expand(%q) = %q grew", s, got)
		}
		_ = expand(s, map[string]string{"A": "x"})
	})
}
