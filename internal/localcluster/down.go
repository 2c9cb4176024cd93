package localcluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/canopy-mesh/canopy/internal/netns"
)

// Down removes everything Up recorded in dir: processes (the recorded ones,
// then any left in the cluster's network namespaces, pods included), the
// namespaces, host links and the bridge, then the directory. It works on a
// partial or crashed Up and is safe to repeat; a missing state is not an
// error.
func Down(_ context.Context, dir string) error {
	st, err := loadState(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	// Components first, the last started first: scheduler, kubelets and
	// proxies before the API server they talk to.
	for i := len(st.Processes) - 1; i >= 0; i-- {
		st.Processes[i].stop(5 * time.Second)
	}

	namespaces := append([]string(nil), st.Netns...)
	pods, podPIDs := podLeftovers(st.Dir)
	namespaces = append(namespaces, pods...)
	for _, pid := range podPIDs {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
	// Whatever still runs in the cluster's namespaces (pods' processes,
	// host-network pods in node namespaces) goes too.
	killInNamespaces(namespaces)

	var errs []error
	for _, path := range namespaces {
		if err := netns.DeletePath(path); err != nil {
			errs = append(errs, err)
		}
	}
	for _, l := range st.HostLinks {
		if err := deleteLink(l); err != nil {
			errs = append(errs, err)
		}
	}
	if st.Bridge != "" {
		if err := deleteLink(st.Bridge); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if err := os.RemoveAll(st.Dir); err != nil {
		return fmt.Errorf("remove state directory: %w", err)
	}
	return nil
}

// podLeftovers reads the kubelets' pod records: pods' namespaces and
// process IDs.
func podLeftovers(dir string) (namespaces []string, pids []int) {
	files, _ := filepath.Glob(filepath.Join(dir, "nodes", "*", "pods", "*", "record.json"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var rec struct {
			Netns string `json:"netns"`
			PIDs  []int  `json:"pids"`
		}
		if json.Unmarshal(b, &rec) != nil {
			continue
		}
		if rec.Netns != "" {
			namespaces = append(namespaces, rec.Netns)
		}
		pids = append(pids, rec.PIDs...)
	}
	return namespaces, pids
}

// killInNamespaces sends SIGKILL to every process whose network namespace
// is one of paths, and waits briefly for them to go.
func killInNamespaces(paths []string) {
	want := map[uint64]bool{}
	for _, p := range paths {
		if ino, ok := inode(p); ok {
			want[ino] = true
		}
	}
	if len(want) == 0 {
		return
	}
	for range 50 {
		entries, err := os.ReadDir("/proc")
		if err != nil {
			return
		}
		found := false
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == os.Getpid() {
				continue
			}
			if ino, ok := inode(fmt.Sprintf("/proc/%d/ns/net", pid)); ok && want[ino] {
				if _, err := procStartTime(pid); err == nil { // not a zombie
					found = true
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		if !found {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func inode(path string) (uint64, bool) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0, false
	}
	return st.Ino, true
}
