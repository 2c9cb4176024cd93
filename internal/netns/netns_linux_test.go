package netns

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/canopy-mesh/canopy/internal/testing/ci"
)

func needRoot(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("root-level test: skipped in -short mode")
	}
	if os.Geteuid() != 0 {
		ci.Unavailable(t, "network namespaces need root")
	}
}

func TestCreateDoDelete(t *testing.T) {
	needRoot(t)
	name := fmt.Sprintf("canopy-test-%d", os.Getpid())
	path, err := Create(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Delete(name) })

	if _, err := Create(name); err == nil {
		t.Error("Create of a taken name succeeded")
	}
	if !Exists(path) {
		t.Fatalf("%s is not a network namespace", path)
	}

	var links []netlink.Link
	var loUp bool
	if err := Do(path, func() error {
		var err error
		links, err = netlink.LinkList()
		lo, _ := netlink.LinkByName("lo")
		loUp = lo != nil && lo.Attrs().Flags&(1<<0) != 0
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if len(links) != 1 || links[0].Attrs().Name != "lo" || !loUp {
		t.Errorf("new namespace links = %v (lo up %v), want only lo, up", links, loUp)
	}

	// A process started inside Do is born in the namespace.
	var out []byte
	if err := Do(path, func() error {
		var err error
		out, err = exec.Command("cat", "/proc/self/net/dev").Output()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if strings.Count(string(out), ":") != 1 {
		t.Errorf("child process sees interfaces %q, want lo only", out)
	}

	if err := Delete(name); err != nil {
		t.Fatal(err)
	}
	if err := Delete(name); err != nil {
		t.Errorf("second Delete: %v", err)
	}
	if Exists(path) {
		t.Error("namespace still pinned after Delete")
	}
}
