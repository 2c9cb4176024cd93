// Package procs identifies and stops processes safely: by PID together with
// its start time (so a reused PID is never killed by mistake), and by the
// network namespace they live in.
package procs

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Process is a PID with its start time in clock ticks since boot, which
// together name one process for as long as the machine runs.
type Process struct {
	PID       int    `json:"pid"`
	StartTime uint64 `json:"startTime"`
}

// Lookup returns the running process with pid.
func Lookup(pid int) (Process, error) {
	st, err := startTime(pid)
	if err != nil {
		return Process{}, err
	}
	return Process{PID: pid, StartTime: st}, nil
}

// startTime reads a running process's start time. A zombie counts as gone.
func startTime(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces and parentheses; the
	// fields after its last ')' are plain.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, errors.New("malformed /proc stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, errors.New("short /proc stat")
	}
	if f[0] == "Z" || f[0] == "X" {
		return 0, errors.New("process has exited")
	}
	return strconv.ParseUint(f[19], 10, 64) // field 22: starttime
}

// Alive reports whether the process still runs.
func (p Process) Alive() bool {
	st, err := startTime(p.PID)
	return err == nil && st == p.StartTime
}

// Stop sends SIGTERM to the process and its process group, waits up to
// grace, then sends SIGKILL. It does nothing to a process that is gone.
func (p Process) Stop(grace time.Duration) {
	if !p.Alive() {
		return
	}
	p.signal(syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		if !p.Alive() {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.signal(syscall.SIGKILL)
}

// Kill sends SIGKILL to the process and its process group, if it still runs.
func (p Process) Kill() {
	if p.Alive() {
		p.signal(syscall.SIGKILL)
	}
}

func (p Process) signal(sig syscall.Signal) {
	_ = syscall.Kill(-p.PID, sig) // its group, when it leads one
	_ = syscall.Kill(p.PID, sig)
}

// KillInNetns sends SIGKILL to every process whose network namespace is one
// of the namespaces pinned at paths, and waits up to 5s for them to go.
func KillInNetns(paths ...string) {
	want := map[uint64]bool{}
	for _, p := range paths {
		if ino, ok := inode(p); ok {
			want[ino] = true
		}
	}
	if len(want) == 0 {
		return
	}
	self := os.Getpid()
	for range 50 {
		entries, err := os.ReadDir("/proc")
		if err != nil {
			return
		}
		found := false
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == self {
				continue
			}
			if ino, ok := inode(fmt.Sprintf("/proc/%d/ns/net", pid)); ok && want[ino] {
				if _, err := startTime(pid); err == nil {
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
