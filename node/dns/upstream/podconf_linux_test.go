package upstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/canopy-mesh/canopy/internal/netns"
	"github.com/canopy-mesh/canopy/internal/procs"
	"github.com/canopy-mesh/canopy/internal/testing/childproc"
	"github.com/canopy-mesh/canopy/internal/testing/ci"
)

func needRoot(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("root-level test: skipped in -short mode")
	}
	if os.Geteuid() != 0 {
		ci.Unavailable(t, "network and mount namespaces need root")
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
}

func openDir(t *testing.T, path string) int {
	t.Helper()
	fd, err := unix.Open(path, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// TestReadInRoot is the pod that points its resolv.conf at a node file: the
// open resolves inside the pod's root or fails, and never reads the node's
// file.
func TestReadInRoot(t *testing.T) {
	t.Parallel()
	// outside stands for a node file (/etc/shadow); its marker must never
	// be read through a root that does not contain it.
	const secret = "nameserver 192.0.2.66 # node file\n"
	const own = "nameserver 192.0.2.1 # the pod's\n"
	outside := filepath.Join(t.TempDir(), "node", "shadow")
	writeFile(t, outside, secret)
	// so that a symlinked etc would reach the secret as etc/resolv.conf
	// if followed out of the root
	symlink(t, "shadow", filepath.Join(filepath.Dir(outside), "resolv.conf"))

	for _, tt := range []struct {
		name    string
		setup   func(t *testing.T, root string)
		want    string
		wantErr error // nil: any error, checked with want == ""
	}{
		{
			name:  "regular file",
			setup: func(t *testing.T, root string) { writeFile(t, root+"/etc/resolv.conf", own) },
			want:  own,
		},
		{
			name:    "absolute symlink out of the root, nothing there inside",
			setup:   func(t *testing.T, root string) { symlink(t, outside, root+"/etc/resolv.conf") },
			wantErr: unix.ENOENT,
		},
		{
			name: "absolute symlink out of the root resolves inside it",
			setup: func(t *testing.T, root string) {
				symlink(t, outside, root+"/etc/resolv.conf")
				writeFile(t, root+outside, own)
			},
			want: own,
		},
		{
			name: "dot-dot past the root stops at the root",
			setup: func(t *testing.T, root string) {
				symlink(t, strings.Repeat("../", 20)+strings.TrimPrefix(outside, "/"), root+"/etc/resolv.conf")
			},
			wantErr: unix.ENOENT,
		},
		{
			name: "relative symlink inside the root",
			setup: func(t *testing.T, root string) {
				symlink(t, "../run/resolv.conf", root+"/etc/resolv.conf")
				writeFile(t, root+"/run/resolv.conf", own)
			},
			want: own,
		},
		{
			name:    "symlinked directory out of the root",
			setup:   func(t *testing.T, root string) { symlink(t, filepath.Dir(outside), root+"/etc") },
			wantErr: unix.ENOENT,
		},
		{
			name: "FIFO",
			setup: func(t *testing.T, root string) {
				if err := os.MkdirAll(root+"/etc", 0o755); err != nil {
					t.Fatal(err)
				}
				if err := unix.Mkfifo(root+"/etc/resolv.conf", 0o644); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name: "directory",
			setup: func(t *testing.T, root string) {
				if err := os.MkdirAll(root+"/etc/resolv.conf", 0o755); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name: "over 64 KiB",
			setup: func(t *testing.T, root string) {
				writeFile(t, root+"/etc/resolv.conf", own+strings.Repeat("#", MaxResolvConfSize))
			},
			wantErr: ErrTooLarge,
		},
		{
			name: "exactly 64 KiB",
			setup: func(t *testing.T, root string) {
				writeFile(t, root+"/etc/resolv.conf", own+strings.Repeat("#", MaxResolvConfSize-len(own)))
			},
			want: own + strings.Repeat("#", MaxResolvConfSize-len(own)),
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			tt.setup(t, root)
			got, err := readInRoot(openDir(t, root), "etc/resolv.conf")
			if bytes.Contains(got, []byte("192.0.2.66")) {
				t.Fatalf("read the file outside the root: %q", got)
			}
			if tt.want != "" {
				if err != nil {
					t.Fatalf("readInRoot: %v", err)
				}
				if string(got) != tt.want {
					t.Fatalf("readInRoot = %.80q, want %.80q", got, tt.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("readInRoot = %q, want an error", got)
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Fatalf("readInRoot error %v, want %v", err, tt.wantErr)
			}
		})
	}

	// A magic link (/proc/<pid>/root, /proc/self/fd/N) leads to a root
	// of the reader's choosing, here the test's own "/": the open fails.
	t.Run("magic link", func(t *testing.T) {
		t.Parallel()
		got, err := readInRoot(openDir(t, "/"), "proc/self/root"+outside)
		if !errors.Is(err, unix.ELOOP) {
			t.Fatalf("readInRoot through /proc/self/root = %q, %v; want ELOOP", got, err)
		}
	})
}

// fakeProc builds a proc root: for each pid, ns/net links to the namespace
// file given and root to a directory.
func fakeProc(t *testing.T, procs map[int][2]string) string {
	t.Helper()
	dir := t.TempDir()
	for pid, p := range procs {
		symlink(t, p[0], fmt.Sprintf("%s/%d/ns/net", dir, pid))
		symlink(t, p[1], fmt.Sprintf("%s/%d/root", dir, pid))
	}
	// The reader: skipped whatever its namespace.
	symlink(t, "5", dir+"/self")
	// Not a process: skipped.
	writeFile(t, dir+"/meminfo", "")
	return dir
}

// fileID is the NetNSID of the file at path: a fake proc's namespaces are
// plain files, since only the device and inode count.
func fileID(t *testing.T, path string) NetNSID {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	id, err := NetNSIDOf(f)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestPodConfigFakeProc scans a proc root built by the test: the first
// process of the namespace with a usable file wins, processes of other
// namespaces are never read, and the scan is bounded.
func TestPodConfigFakeProc(t *testing.T) {
	t.Parallel()
	nsDir := t.TempDir()
	ours, other := nsDir+"/pod", nsDir+"/other"
	writeFile(t, ours, "")
	writeFile(t, other, "")
	id := fileID(t, ours)

	sandbox := t.TempDir() // the pause container: no resolv.conf
	app := t.TempDir()
	writeFile(t, app+"/etc/resolv.conf", "search ns1.svc.cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n")
	elsewhere := t.TempDir()
	writeFile(t, elsewhere+"/etc/resolv.conf", "nameserver 192.0.2.99\n")
	broken := t.TempDir()
	writeFile(t, broken+"/etc/resolv.conf", "# no nameserver\n")

	t.Run("reader and sandbox skipped, other namespace not read", func(t *testing.T) {
		t.Parallel()
		proc := fakeProc(t, map[int][2]string{
			5:   {ours, elsewhere},
			7:   {ours, sandbox},
			10:  {other, elsewhere},
			42:  {ours, broken},
			300: {ours, app},
			301: {ours, elsewhere},
		})
		got, err := PodConfigByID(proc, id)
		if err != nil {
			t.Fatal(err)
		}
		want := Config{
			Nameservers: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
			Search:      []string{"ns1.svc.cluster.local"},
			Ndots:       5, Timeout: 5 * time.Second, Attempts: 2,
		}
		if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
			t.Errorf("PodConfigByID mismatch (-want +got):\n%s", diff)
		}
	})
	t.Run("no process in the namespace", func(t *testing.T) {
		t.Parallel()
		proc := fakeProc(t, map[int][2]string{10: {other, elsewhere}})
		got, err := PodConfigByID(proc, id)
		if !errors.Is(err, ErrNoProcess) {
			t.Fatalf("PodConfigByID = %+v, %v; want ErrNoProcess", got, err)
		}
	})
	t.Run("no usable file", func(t *testing.T) {
		t.Parallel()
		proc := fakeProc(t, map[int][2]string{7: {ours, sandbox}, 42: {ours, broken}})
		got, err := PodConfigByID(proc, id)
		if !errors.Is(err, ErrNoNameserver) || errors.Is(err, ErrNoProcess) {
			t.Fatalf("PodConfigByID = %+v, %v; want the last cause, ErrNoNameserver", got, err)
		}
	})
	t.Run("bounded scan", func(t *testing.T) {
		t.Parallel()
		m := map[int][2]string{1000: {ours, app}}
		for pid := 100; pid < 100+maxCandidates; pid++ {
			m[pid] = [2]string{ours, sandbox}
		}
		got, err := PodConfigByID(fakeProc(t, m), id)
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%d processes", maxCandidates)) {
			t.Fatalf("PodConfigByID = %+v, %v; want it to give up after %d processes", got, err, maxCandidates)
		}
	})
}

// TestPodConfigNetns reads the resolv.conf of a process living in a network
// namespace the test made, with its own mount namespace and file on
// /etc/resolv.conf, as a pod's container has: the file read is the pod's,
// not the node's.
func TestPodConfigNetns(t *testing.T) {
	needRoot(t)
	t.Parallel()
	name := fmt.Sprintf("canopy-dnsupstream-%d", os.Getpid())
	path, err := netns.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		procs.KillInNetns(path)
		if err := netns.Delete(name); err != nil {
			t.Errorf("delete netns: %v", err)
		}
	})
	ns, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })

	// Nobody lives in the namespace yet.
	if got, err := PodConfig("", ns); !errors.Is(err, ErrNoProcess) {
		t.Fatalf("PodConfig of an empty namespace = %+v, %v; want ErrNoProcess", got, err)
	}

	dir := t.TempDir()
	podFile := filepath.Join(dir, "pod-resolv.conf")
	writeFile(t, podFile, "search ns1.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\nnameserver fd00::10\noptions ndots:5 attempts:3\n")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+podFile)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	var pod *childproc.Process
	if err := netns.Do(path, func() (err error) {
		pod, err = childproc.Start("pod", cmd, filepath.Join(dir, "pod.log"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := pod.Stop(5 * time.Second); err != nil {
			t.Errorf("stop pod process: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := pod.WaitFor(ctx, 10*time.Millisecond, func(context.Context) error {
		b, err := os.ReadFile(pod.LogPath)
		if err != nil || !bytes.Contains(b, []byte("ready\n")) {
			return errors.New("pod process not ready")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	got, err := PodConfig("", ns)
	if err != nil {
		t.Fatalf("PodConfig: %v", err)
	}
	want := Config{
		Nameservers: []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00::10")},
		Search:      []string{"ns1.svc.cluster.local", "svc.cluster.local", "cluster.local"},
		Ndots:       5, Timeout: 5 * time.Second, Attempts: 3,
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("PodConfig mismatch (-want +got):\n%s", diff)
	}
}
