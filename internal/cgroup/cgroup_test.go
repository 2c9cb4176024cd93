package cgroup

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/canopy-mesh/canopy/internal/testing/ci"
)

func TestUnescape(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"/sys/fs/cgroup":          "/sys/fs/cgroup",
		`/mnt/with\040space`:      "/mnt/with space",
		`/tab\011and\134slash`:    "/tab\tand\\slash",
		`/trailing\`:              `/trailing\`,
		`/not\9octal`:             `/not\9octal`,
		`/short\04`:               `/short\04`,
		`/two\040\040spaces/here`: "/two  spaces/here",
	} {
		if got := unescape(in); got != want {
			t.Errorf("unescape(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestStartAndRemove: a process started in a cgroup is in it from birth,
// /proc says so relative to the hierarchy's root, and Remove kills it and
// takes the cgroups away, twice without error.
func TestStartAndRemove(t *testing.T) {
	if testing.Short() {
		t.Skip("root-level test: skipped in -short mode")
	}
	if os.Geteuid() != 0 {
		ci.Unavailable(t, "cgroups need root")
	}
	root, err := Root()
	if errors.Is(err, ErrNoHierarchy) {
		ci.Unavailable(t, "no cgroup v2 hierarchy mounted")
	}
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	top := filepath.Join(root, "canopy-test-"+hex.EncodeToString(b))
	t.Cleanup(func() { _ = Remove(top) })
	dir := filepath.Join(top, "kubepods", "pod1234")
	cmd := exec.Command("sleep", "60")
	if err := Start(cmd, dir); err != nil {
		t.Fatal(err)
	}
	waited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(waited) }()

	got, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	want := "0::" + strings.TrimPrefix(dir, root) + "\n"
	if !strings.Contains(string(got), want) {
		t.Errorf("/proc/<pid>/cgroup = %q, want a line %q", got, want)
	}
	if pids, err := Procs(dir); err != nil || len(pids) != 1 || pids[0] != cmd.Process.Pid {
		t.Errorf("Procs = %v, %v; want [%d]", pids, err, cmd.Process.Pid)
	}

	for range 2 {
		if err := Remove(top); err != nil {
			t.Fatal(err)
		}
	}
	<-waited
	if _, err := os.Stat(top); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cgroup %s left: %v", top, err)
	}
}
