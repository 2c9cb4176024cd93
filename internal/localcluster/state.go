package localcluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// State records what Up created, written after every step so that Down can
// undo a partial Up.
type State struct {
	Name      string    `json:"name"`
	Dir       string    `json:"dir"`
	Bridge    string    `json:"bridge,omitempty"`
	HostLinks []string  `json:"hostLinks,omitempty"`
	Netns     []string  `json:"netns,omitempty"` // node namespaces' pin paths
	Processes []Process `json:"processes,omitempty"`
	// Kubeconfig is the admin kubeconfig; APIServer the server URL.
	Kubeconfig string `json:"kubeconfig,omitempty"`
	APIServer  string `json:"apiServer,omitempty"`
	Nodes      []Node `json:"nodes,omitempty"`
	Ready      bool   `json:"ready"`
}

// Process is a long-lived process of the cluster. StartTime (from
// /proc/<pid>/stat) tells it apart from a later process that reuses its PID.
type Process struct {
	Name      string `json:"name"`
	PID       int    `json:"pid"`
	StartTime uint64 `json:"startTime"`
}

// Node is a node of the cluster as Up made it.
type Node struct {
	Name    string `json:"name"`
	IP      string `json:"ip"`
	PodCIDR string `json:"podCIDR"`
	Netns   string `json:"netns"`
	Zone    string `json:"zone"`
}

const stateFile = "state.json"

func loadState(dir string) (*State, error) {
	b, err := os.ReadFile(filepath.Join(dir, stateFile))
	if err != nil {
		return nil, err
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("parse %s: %w", filepath.Join(dir, stateFile), err)
	}
	return &s, nil
}

func (s *State) save() error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(s.Dir, stateFile+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("write state: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(s.Dir, stateFile)); err != nil {
		return fmt.Errorf("write state: %w", err)
	}
	return nil
}

func (s *State) addProcess(name string, pid int) error {
	st, err := procStartTime(pid)
	if err != nil {
		return fmt.Errorf("record %s: %w", name, err)
	}
	s.Processes = append(s.Processes, Process{Name: name, PID: pid, StartTime: st})
	return s.save()
}

// procStartTime reads a running process's start time in clock ticks since
// boot. A zombie counts as gone.
func procStartTime(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; fields after its closing
	// parenthesis are plain.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, errors.New("malformed /proc stat")
	}
	f := strings.Fields(string(b[i+1:]))
	// Field 22 overall is starttime; f starts at field 3.
	if len(f) < 20 {
		return 0, errors.New("short /proc stat")
	}
	if f[0] == "Z" || f[0] == "X" {
		return 0, errors.New("process has exited")
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// alive reports whether the recorded process still runs.
func (p Process) alive() bool {
	st, err := procStartTime(p.PID)
	return err == nil && st == p.StartTime
}

// stop sends SIGTERM to the process (and its group, which it leads), waits
// up to grace, then sends SIGKILL.
func (p Process) stop(grace time.Duration) {
	if !p.alive() {
		return
	}
	_ = syscall.Kill(-p.PID, syscall.SIGTERM)
	_ = syscall.Kill(p.PID, syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		if !p.alive() {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = syscall.Kill(-p.PID, syscall.SIGKILL)
	_ = syscall.Kill(p.PID, syscall.SIGKILL)
}
