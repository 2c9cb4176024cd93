package localcluster

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/canopy-mesh/canopy/internal/procs"
)

// State records what Up created, written after every step so that Down can
// undo a partial Up.
type State struct {
	Name      string   `json:"name"`
	Dir       string   `json:"dir"`
	Bridge    string   `json:"bridge,omitempty"`
	HostLinks []string `json:"hostLinks,omitempty"`
	Netns     []string `json:"netns,omitempty"` // node namespaces' pin paths
	// Cgroup is the cgroup v2 directory holding every node's pods.
	Cgroup string `json:"cgroup,omitempty"`
	// Runtime is what runs the pods (Config.Runtime).
	Runtime Runtime `json:"runtime,omitempty"`
	// NodeCgroup is, with real nodes, the cgroup (relative to each
	// hierarchy's root) of every node's daemons, containers and pods.
	NodeCgroup string `json:"nodeCgroup,omitempty"`
	// Self is, with real nodes, the canopy-local binary whose node-init
	// holds each node's namespaces: a reboot starts it again.
	Self string `json:"self,omitempty"`
	// Mountpoints are directories real nodes' binds needed that the host
	// lacked; Down removes those left empty.
	Mountpoints []string `json:"mountpoints,omitempty"`
	// Registry is host:port of the cluster's OCI registry.
	Registry  string    `json:"registry,omitempty"`
	Processes []Process `json:"processes,omitempty"`
	// Kubeconfig is the admin kubeconfig; APIServer the server URL.
	Kubeconfig string `json:"kubeconfig,omitempty"`
	APIServer  string `json:"apiServer,omitempty"`
	Nodes      []Node `json:"nodes,omitempty"`
	Ready      bool   `json:"ready"`
}

// Process is a long-lived process of the cluster.
type Process struct {
	Name string `json:"name"`
	procs.Process
}

// Node is a node of the cluster as Up made it.
type Node struct {
	Name    string `json:"name"`
	IP      string `json:"ip"`
	PodCIDR string `json:"podCIDR"`
	Netns   string `json:"netns"`
	Zone    string `json:"zone"`
	// InitPID is a real node's init, which holds its mount namespace:
	// /proc/<InitPID>/root is the node's file system.
	InitPID int `json:"initPID,omitempty"`
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
	p, err := procs.Lookup(pid)
	if err != nil {
		return fmt.Errorf("record %s: %w", name, err)
	}
	s.Processes = append(s.Processes, Process{Name: name, Process: p})
	return s.save()
}
