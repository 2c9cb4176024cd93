package realnode

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/BurntSushi/toml"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// Spec describes one node. Host paths are absolute paths on the host;
// the node sees the standard paths (Paths) instead.
type Spec struct {
	// Name is the node's name and hostname.
	Name string `json:"name"`
	// Dir is the node's disk on the host: what it keeps across a reboot
	// (/var/lib/kubelet, /var/lib/containerd, /etc/cni/net.d, ...).
	Dir string `json:"dir"`
	// Netns is the pin path of the node's network namespace, already
	// connected to the underlay.
	Netns string `json:"netns"`
	// Cgroup is the node's cgroup, relative to each hierarchy's root:
	// containerd and the kubelet run in <Cgroup>/runtime, pods under
	// <Cgroup>/pods.
	Cgroup string `json:"cgroup"`
	// IP is the node's address on the underlay.
	IP netip.Addr `json:"ip"`
	// Labels and Taints are what the kubelet registers the Node with.
	Labels map[string]string `json:"labels,omitempty"`
	Taints []corev1.Taint    `json:"taints,omitempty"`
	// Registry is host:port of the OCI registry the node pulls from over
	// plain HTTP. Every other registry name is mirrored to it as well, so
	// that images named as users name them (canopy/echo, istio/proxyv2)
	// come from it and a node never reaches outside the machine.
	Registry string `json:"registry"`
	// SandboxImage is the pause image, from Registry.
	SandboxImage string `json:"sandboxImage"`
	// Nameserver is the upstream DNS server of pods with dnsPolicy
	// Default (and of CoreDNS): never a loopback address, which inside a
	// pod is the pod itself.
	Nameserver netip.Addr `json:"nameserver"`
	// ClusterDNS is the kube-dns Service address; ClusterDomain its zone.
	ClusterDNS    netip.Addr `json:"clusterDNS"`
	ClusterDomain string     `json:"clusterDomain"`
	// Kubeconfig is the kubelet's credential (a host path).
	Kubeconfig string `json:"kubeconfig"`
	// ClientCAFile verifies the API server's client certificate when it
	// calls the kubelet (logs, exec, port-forward).
	ClientCAFile string `json:"clientCAFile"`
	// RestrictOOMScoreAdj makes containerd raise a container's
	// oom_score_adj to its own where the kubelet asks for less (-998 for
	// sandboxes, -997 for Guaranteed pods): a host whose root lacks
	// CAP_SYS_RESOURCE (a VM sandbox, a rootless or nested node) may not
	// lower it, and runc fails every container that asks.
	RestrictOOMScoreAdj bool `json:"restrictOOMScoreAdj,omitempty"`
	// Binaries are host paths of the node's programs.
	Binaries Binaries `json:"binaries"`
}

// Binaries are the programs a node runs, as host paths.
type Binaries struct {
	// Containerd holds containerd and containerd-shim-runc-v2.
	Containerd string `json:"containerd"`
	// Kubelet is the kubelet binary.
	Kubelet string `json:"kubelet"`
	// Runc is the OCI runtime containerd's shim runs.
	Runc string `json:"runc"`
	// CNI holds the reference plugins installed onto the node
	// (loopback, ptp, host-local): what a node image ships.
	CNI string `json:"cni"`
}

// The paths inside a node.
const (
	containerdConfigPath = "/etc/containerd/config.toml"
	containerdSocket     = "/run/containerd/containerd.sock"
	certsDir             = "/etc/containerd/certs.d"
	kubeletConfigPath    = "/etc/kubernetes/kubelet.yaml"
	resolvConfPath       = "/etc/kubernetes/resolv.conf"
	cniConfDir           = "/etc/cni/net.d"
	cniBinDir            = "/opt/cni/bin"
)

// persistentPaths are the node's own directories that survive a reboot,
// each bound from <Dir><path>. What kind puts on the node container's
// volume, and what a hostPath volume of a node agent (the CNI agent's
// /etc/cni/net.d and /opt/cni/bin) must find per node.
var persistentPaths = []string{
	"/var/lib/kubelet",
	"/var/lib/containerd",
	"/var/lib/cni",
	"/var/log",
	"/etc/containerd",
	"/etc/kubernetes",
	cniConfDir,
	cniBinDir,
}

var validNodeName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// Validate reports what is missing or wrong in s.
func (s Spec) Validate() error {
	var errs []error
	if !validNodeName.MatchString(s.Name) {
		errs = append(errs, fmt.Errorf("node name %q is not a DNS label", s.Name))
	}
	for what, p := range map[string]string{"dir": s.Dir, "netns": s.Netns, "kubeconfig": s.Kubeconfig,
		"client CA file": s.ClientCAFile, "containerd dir": s.Binaries.Containerd, "kubelet": s.Binaries.Kubelet,
		"runc": s.Binaries.Runc, "CNI plugin dir": s.Binaries.CNI} {
		if !filepath.IsAbs(p) {
			errs = append(errs, fmt.Errorf("%s: %q is not an absolute path", what, p))
		}
	}
	if s.Cgroup == "" || path.IsAbs(s.Cgroup) || path.Clean(s.Cgroup) != s.Cgroup || strings.HasPrefix(s.Cgroup, "..") {
		errs = append(errs, fmt.Errorf("cgroup %q: want a clean relative path", s.Cgroup))
	}
	for what, a := range map[string]netip.Addr{"IP": s.IP, "nameserver": s.Nameserver, "cluster DNS": s.ClusterDNS} {
		if !a.IsValid() {
			errs = append(errs, fmt.Errorf("%s is not set", what))
		}
	}
	if s.Nameserver.IsLoopback() {
		errs = append(errs, fmt.Errorf("nameserver %s is a loopback address, which inside a pod is the pod itself", s.Nameserver))
	}
	if s.Registry == "" || s.SandboxImage == "" || s.ClusterDomain == "" {
		errs = append(errs, errors.New("registry, sandbox image and cluster domain are required"))
	}
	return errors.Join(errs...)
}

// Bind is a mount inside the node: Source (a host path) on Target.
type Bind struct {
	Source, Target string
}

// Binds are the node's persistent directories, bound over the standard
// paths.
func (s Spec) Binds() []Bind {
	binds := make([]Bind, 0, len(persistentPaths))
	for _, p := range persistentPaths {
		binds = append(binds, Bind{Source: filepath.Join(s.Dir, p), Target: p})
	}
	return binds
}

// podsCgroup is the kubelet's cgroupRoot; runtimeCgroup holds containerd,
// the shims and the kubelet.
func (s Spec) podsCgroup() string    { return path.Join(s.Cgroup, "pods") }
func (s Spec) runtimeCgroup() string { return path.Join(s.Cgroup, "runtime") }

// ContainerdConfig is the node's /etc/containerd/config.toml.
func (s Spec) ContainerdConfig() ([]byte, error) {
	cfg := map[string]any{
		"version": 3,
		"root":    "/var/lib/containerd",
		"state":   "/run/containerd",
		"grpc":    map[string]any{"address": containerdSocket},
		"plugins": map[string]any{
			"io.containerd.cri.v1.images": map[string]any{
				// The node's disk is ext4 or xfs, never overlayfs
				// itself: overlayfs, as a real node.
				"snapshotter":   "overlayfs",
				"pinned_images": map[string]any{"sandbox": s.SandboxImage},
				"registry":      map[string]any{"config_path": certsDir},
			},
			"io.containerd.cri.v1.runtime": map[string]any{
				"restrict_oom_score_adj": s.RestrictOOMScoreAdj,
				"containerd": map[string]any{
					"default_runtime_name": "runc",
					"runtimes": map[string]any{"runc": map[string]any{
						"runtime_type": "io.containerd.runc.v2",
						// Never a shim of another containerd found on
						// $PATH: daemon and shim must be one release.
						"runtime_path": filepath.Join(s.Binaries.Containerd, "containerd-shim-runc-v2"),
						"options": map[string]any{
							"BinaryName":    s.Binaries.Runc,
							"SystemdCgroup": false,
						},
					}},
				},
				"cni": map[string]any{"bin_dirs": []string{cniBinDir}, "conf_dir": cniConfDir},
			},
		},
	}
	var b bytes.Buffer
	b.WriteString("# Written by canopy-local for node " + s.Name + ".\n")
	if err := toml.NewEncoder(&b).Encode(cfg); err != nil {
		return nil, fmt.Errorf("encode containerd config: %w", err)
	}
	return b.Bytes(), nil
}

// HostsTOML are the node's registry host files, by directory name under
// /etc/containerd/certs.d: the local registry over plain HTTP under its
// own name, and as the mirror of every other registry (_default).
func (s Spec) HostsTOML() map[string][]byte {
	file := func(server string) []byte {
		return fmt.Appendf(nil, "server = %q\n\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", server, "http://"+s.Registry)
	}
	return map[string][]byte{
		strings.ReplaceAll(s.Registry, ":", "_") + "_": file("http://" + s.Registry),
		"_default": file("http://" + s.Registry),
	}
}

// ResolvConf is the resolv.conf of the kubelet's dnsPolicy Default pods.
func (s Spec) ResolvConf() []byte {
	return fmt.Appendf(nil, "nameserver %s\n", s.Nameserver)
}

// KubeletConfig is the node's KubeletConfiguration: only what differs from
// the kubelet's defaults, field names as in k8s.io/kubelet's v1beta1 types
// (the kubelet refuses unknown fields).
func (s Spec) KubeletConfig() ([]byte, error) {
	zero := "0%"
	cfg := map[string]any{
		"apiVersion": "kubelet.config.k8s.io/v1beta1",
		"kind":       "KubeletConfiguration",
		// Hybrid hosts (cgroup v2 mounted but empty) run the kubelet on
		// cgroup v1, which it refuses unless told otherwise.
		"failCgroupV1":             false,
		"containerRuntimeEndpoint": "unix://" + containerdSocket,
		// No systemd here: the kubelet and runc both manage cgroupfs
		// paths, under the node's own root so that two kubelets never
		// remove each other's pod cgroups.
		"cgroupDriver":   "cgroupfs",
		"cgroupsPerQOS":  true,
		"cgroupRoot":     "/" + s.podsCgroup(),
		"kubeletCgroups": "/" + s.runtimeCgroup(),
		"failSwapOn":     false,
		"resolvConf":     resolvConfPath,
		"clusterDNS":     []string{s.ClusterDNS.String()},
		"clusterDomain":  s.ClusterDomain,
		// Nodes share one disk: its fill level is no node's business.
		"imageGCHighThresholdPercent": 100,
		"evictionHard": map[string]string{
			"nodefs.available": zero, "nodefs.inodesFree": zero, "imagefs.available": zero, "imagefs.inodesFree": zero,
		},
		"authentication": map[string]any{
			"x509":      map[string]any{"clientCAFile": s.ClientCAFile},
			"anonymous": map[string]any{"enabled": false},
			"webhook":   map[string]any{"enabled": true},
		},
		"authorization": map[string]any{"mode": "Webhook"},
	}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("encode kubelet config: %w", err)
	}
	return append([]byte("# Written by canopy-local for node "+s.Name+".\n"), b...), nil
}

// KubeletArgs are the kubelet's flags (what has no config field).
func (s Spec) KubeletArgs() []string {
	args := []string{
		"--config=" + kubeletConfigPath,
		"--kubeconfig=" + s.Kubeconfig,
		"--hostname-override=" + s.Name,
		"--node-ip=" + s.IP.String(),
	}
	if len(s.Labels) > 0 {
		var kv []string
		for k, v := range s.Labels {
			kv = append(kv, k+"="+v)
		}
		slices.Sort(kv)
		args = append(args, "--node-labels="+strings.Join(kv, ","))
	}
	if len(s.Taints) > 0 {
		var ts []string
		for _, t := range s.Taints {
			ts = append(ts, t.Key+"="+t.Value+":"+string(t.Effect))
		}
		args = append(args, "--register-with-taints="+strings.Join(ts, ","))
	}
	return args
}
