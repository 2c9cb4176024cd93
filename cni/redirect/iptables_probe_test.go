package redirect

import (
	"strings"
	"testing"
)

// TestIptablesProbe: an agent whose image lacks iptables-restore (Canopy's
// own is FROM scratch) is told at start, naming the binary, instead of
// failing every pod's enrollment.
func TestIptablesProbe(t *testing.T) {
	t.Parallel()
	err := Iptables{Restore: "/nonexistent/iptables-restore"}.Probe()
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/iptables-restore") {
		t.Errorf("Probe() with no iptables-restore = %v, want an error naming it", err)
	}
	err = Iptables{Restore: "/bin/true", Save: "/nonexistent/iptables-save"}.Probe()
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/iptables-save") {
		t.Errorf("Probe() with no iptables-save = %v, want an error naming it", err)
	}
	if err := (Iptables{Restore: "/bin/true", Save: "/bin/true", Restore6: "/nonexistent/ip6tables-restore"}).Probe(); err != nil {
		t.Errorf("Probe() without the IPv6 pair = %v, want nil (it is optional)", err)
	}
}
