package main

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/canopy-mesh/canopy/internal/netns"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/nettest"
)

// TestKubeletNamedPodProcessGainsNothing: a pod's process that calls
// itself kubelet, running as a user ID of its own in its pod's network
// namespace, does not become the user whose connections are SNATed as
// kubelet probes: with the default flags the probe UID stays root's.
func TestKubeletNamedPodProcessGainsNothing(t *testing.T) {
	nettest.NeedRoot(t)
	const impostorUID = 4242
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	pod, err := netns.Create("cnp-kubelet-" + hex.EncodeToString(b))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netns.DeletePath(pod) })
	// The kernel names a process after the file it executes: a link
	// called kubelet gives sleep the name kubelet.
	dir, err := os.MkdirTemp("", "cnp-kubelet-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	kubelet := filepath.Join(dir, "kubelet")
	if err := os.Symlink(sleep, kubelet); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(kubelet, "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: impostorUID, Gid: impostorUID}}
	if err := netns.Do(pod, cmd.Start); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	comm := filepath.Join("/proc", strconv.Itoa(cmd.Process.Pid), "comm")
	eventually.True(t, "the pod's process is called kubelet", func() bool {
		b, err := os.ReadFile(comm)
		return err == nil && strings.TrimSpace(string(b)) == "kubelet"
	})

	c, err := parseFlags([]string{"--node-name=n1"})
	if err != nil {
		t.Fatal(err)
	}
	if got := probeUID(c); got != 0 {
		t.Errorf("probe UID = %d with a pod process called kubelet running as %d; want 0 (root, the default)", got, impostorUID)
	}
}
