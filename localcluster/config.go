package localcluster

import (
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/netip"
	"os/exec"
	"path/filepath"
	"regexp"

	corev1 "k8s.io/api/core/v1"

	"github.com/canopy-mesh/canopy/internal/tools"
)

// Config describes a local cluster. The zero value, with Binaries set, is a
// two-node cluster called "canopy".
type Config struct {
	// Name tells clusters apart: it names the state directory, the bridge
	// and the node namespaces. Lower-case letters, digits and '-', at most
	// 11 characters.
	Name string
	// Nodes is the number of nodes; default 2.
	Nodes int
	// StateDir holds the state file, logs and the pods' files; default
	// /var/lib/canopy-local/<name>.
	StateDir string
	// Underlay is the host bridge network: the host takes the first address,
	// node i (from 1) the (10+i)th. Default 10.99.0.0/24.
	Underlay netip.Prefix
	// PodCIDR is split into one /24 per node (node i gets the i-th).
	// Default 10.244.0.0/16.
	PodCIDR netip.Prefix
	// ServiceCIDR holds Service VIPs: the first is the API server's, the
	// tenth cluster DNS. Default 10.96.0.0/16.
	ServiceCIDR netip.Prefix
	// Region and Zones label the nodes (topology.kubernetes.io/region and
	// zone); node i gets Zones[(i-1) % len(Zones)]. Default "local" and
	// zone-a, zone-b.
	Region string
	Zones  []string
	// Images maps image repositories to programs, added to the default
	// table (canopy/echo and its aliases).
	Images map[string]string
	// NodeTaints are the taints every node registers with, as a kubelet's
	// --register-with-taints: a CNI agent's startup taint, say.
	NodeTaints []corev1.Taint
	// Runtime chooses the nodes: RuntimeContainerd (real kubelets and
	// containerd, images pulled from the cluster's registry) or
	// RuntimeStandIn (the kubelet stand-in running Images' programs).
	// Default RuntimeStandIn.
	Runtime  Runtime
	Binaries Binaries
	Log      *slog.Logger
}

// Runtime is what runs a cluster's pods.
type Runtime string

const (
	// RuntimeStandIn: the kubelet stand-in (localcluster/kubelet) maps
	// image names to programs on the host and runs them in the pods'
	// namespaces; no container, no image, no runtime.
	RuntimeStandIn Runtime = "stand-in"
	// RuntimeContainerd: real nodes (localcluster/realnode), the kubelet
	// and containerd with runc, pulling images from the cluster's OCI
	// registry on the bridge.
	RuntimeContainerd Runtime = "containerd"
)

// Binaries are the programs a cluster runs.
type Binaries struct {
	// Self is a binary with the canopy-local commands: kubelet, scheduler
	// and the container init.
	Self string
	// Echo is canopy-echo, the test application.
	Echo string
	// KubeDir holds kube-apiserver, kube-controller-manager and kube-proxy.
	KubeDir string
	// CoreDNS is the coredns binary.
	CoreDNS string
	// CNIDir holds the CNI plugins ptp, host-local and loopback.
	CNIDir string
	// Etcd is the etcd binary; default from PATH.
	Etcd string

	// For RuntimeContainerd only (KubeDir then also holds kubelet and
	// kube-scheduler):
	// ContainerdDir holds containerd and containerd-shim-runc-v2.
	ContainerdDir string
	// Registry is distribution's registry binary.
	Registry string
	// Pause is canopy-pause, the pods' sandbox process.
	Pause string
	// Runc is the OCI runtime; default runc from PATH.
	Runc string
}

var validName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,9}[a-z0-9])?$`)

func (c Config) withDefaults() (Config, error) {
	if c.Name == "" {
		c.Name = "canopy"
	}
	if !validName.MatchString(c.Name) {
		return c, fmt.Errorf("cluster name %q: want 1 to 11 lower-case letters, digits or '-'", c.Name)
	}
	if c.Nodes == 0 {
		c.Nodes = 2
	}
	if c.Nodes < 1 || c.Nodes > 200 {
		return c, fmt.Errorf("nodes: %d is not between 1 and 200", c.Nodes)
	}
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir(c.Name)
	}
	def := func(p *netip.Prefix, s string) {
		if !p.IsValid() {
			*p = netip.MustParsePrefix(s)
		}
	}
	def(&c.Underlay, "10.99.0.0/24")
	def(&c.PodCIDR, "10.244.0.0/16")
	def(&c.ServiceCIDR, "10.96.0.0/16")
	for _, p := range []netip.Prefix{c.Underlay, c.PodCIDR, c.ServiceCIDR} {
		if !p.Addr().Is4() {
			return c, fmt.Errorf("%s: only IPv4 networks are supported", p)
		}
	}
	if c.Underlay.Bits() > 24 || c.PodCIDR.Bits() > 16 {
		return c, errors.New("underlay must be /24 or larger and the pod CIDR /16 or larger")
	}
	if c.Region == "" {
		c.Region = "local"
	}
	if len(c.Zones) == 0 {
		c.Zones = []string{"zone-a", "zone-b"}
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	switch c.Runtime {
	case "":
		c.Runtime = RuntimeStandIn
	case RuntimeStandIn:
	case RuntimeContainerd:
		if c.Binaries.Runc == "" {
			runc, err := exec.LookPath("runc")
			if err != nil {
				return c, errors.New("runc is not installed (hack/install-deps.sh installs Debian's)")
			}
			c.Binaries.Runc = runc
		}
		for name, path := range map[string]string{"containerd dir": c.Binaries.ContainerdDir,
			"registry": c.Binaries.Registry, "pause": c.Binaries.Pause, "runc": c.Binaries.Runc} {
			if path == "" || !filepath.IsAbs(path) {
				return c, fmt.Errorf("binary %s: %q is not an absolute path", name, path)
			}
		}
	default:
		return c, fmt.Errorf("runtime %q: want %q or %q", c.Runtime, RuntimeContainerd, RuntimeStandIn)
	}
	for name, path := range map[string]string{"self": c.Binaries.Self, "echo": c.Binaries.Echo, "kube dir": c.Binaries.KubeDir,
		"coredns": c.Binaries.CoreDNS, "cni dir": c.Binaries.CNIDir} {
		if path == "" || !filepath.IsAbs(path) {
			return c, fmt.Errorf("binary %s: %q is not an absolute path", name, path)
		}
	}
	return c, nil
}

// FindTools fills in the pinned third-party binaries (Kubernetes, CNI
// plugins, CoreDNS) through internal/tools: from $CANOPY_*_BIN_DIR, else
// built by hack/tools.sh inside the repository.
func (b *Binaries) FindTools() error {
	var err error
	if b.KubeDir, err = tools.Dir("kube"); err != nil {
		return err
	}
	if b.CNIDir, err = tools.Dir("cni"); err != nil {
		return err
	}
	dns, err := tools.Dir("coredns")
	if err != nil {
		return err
	}
	b.CoreDNS = filepath.Join(dns, "coredns")
	return nil
}

// FindNodeTools fills in what real nodes run beyond FindTools: containerd
// and the registry, through internal/tools.
func (b *Binaries) FindNodeTools() error {
	var err error
	if b.ContainerdDir, err = tools.Dir("containerd"); err != nil {
		return err
	}
	reg, err := tools.Dir("registry")
	if err != nil {
		return err
	}
	b.Registry = filepath.Join(reg, "registry")
	return nil
}

// DefaultStateDir is where a cluster called name keeps its state.
func DefaultStateDir(name string) string {
	return filepath.Join(defaultStateRoot, name)
}

// defaultStateRoot holds the state directories of clusters that name no
// directory of their own.
const defaultStateRoot = "/var/lib/canopy-local"

// nth returns the n-th address of p (0 is p's first).
func nth(p netip.Prefix, n int) netip.Addr {
	b := p.Masked().Addr().As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(n)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func (c Config) hostIP() netip.Addr             { return nth(c.Underlay, 1) }
func (c Config) nodeIP(i int) netip.Addr        { return nth(c.Underlay, 10+i) }
func (c Config) apiServiceIP() netip.Addr       { return nth(c.ServiceCIDR, 1) }
func (c Config) dnsServiceIP() netip.Addr       { return nth(c.ServiceCIDR, 10) }
func (c Config) nodeName(i int) string          { return fmt.Sprintf("node-%d", i) }
func (c Config) nodeZone(i int) string          { return c.Zones[(i-1)%len(c.Zones)] }
func (c Config) nodeNetns(i int) string         { return fmt.Sprintf("%s-node-%d", c.Name, i) }
func (c Config) bridge() string                 { return "cnp-" + c.Name }
func (c Config) registry() string               { return c.hostIP().String() + ":5000" }
func (c Config) cgroup() string                 { return "canopy-local-" + c.Name }
func (c Config) nodePodCIDR(i int) netip.Prefix { return netip.PrefixFrom(nth(c.PodCIDR, i*256), 24) }

// hostLink names a node's veth on the host, within the 15 characters a
// link name allows whatever the cluster name.
func (c Config) hostLink(i int) string {
	h := fnv.New32a()
	h.Write([]byte(c.Name))
	return fmt.Sprintf("cnp%06xn%d", h.Sum32()&0xffffff, i)
}
