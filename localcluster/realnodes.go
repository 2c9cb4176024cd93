package localcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/canopy-mesh/canopy/internal/atomicfile"
	"github.com/canopy-mesh/canopy/internal/ociimage"
	"github.com/canopy-mesh/canopy/localcluster/realnode"
)

// PauseImage is the sandbox image of real nodes, under the cluster's
// registry; the tag is the upstream pause image's whose contract it keeps.
const PauseImage = "canopy/pause:3.10.2"

// startRegistry runs distribution's registry on the bridge address, where
// both the host and every node's containerd reach it (loopback inside a
// node is the node's own), and pushes the pause image every pod needs.
func (u *upper) startRegistry(ctx context.Context) error {
	cfg, st := u.cfg, u.st
	st.Registry = cfg.registry()
	if err := st.save(); err != nil {
		return err
	}
	dir := filepath.Join(cfg.StateDir, "registry")
	conf := fmt.Sprintf(`version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
http:
  addr: %s
`, filepath.Join(dir, "data"), st.Registry)
	confPath := filepath.Join(dir, "config.yml")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		return fmt.Errorf("write registry config: %w", err)
	}
	if err := u.spawn("registry", "", cfg.Binaries.Registry, "serve", confPath); err != nil {
		return err
	}
	httpc := &http.Client{Timeout: time.Second}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		return httpOK(ctx, httpc, "http://"+st.Registry+"/v2/"), nil
	}); err != nil {
		return fmt.Errorf("registry on %s does not answer (log: %s): %w", st.Registry, filepath.Join(cfg.StateDir, "logs", "registry.log"), err)
	}
	img, err := ociimage.Build(ociimage.Spec{
		Files:      []ociimage.File{{Path: "/pause", Source: cfg.Binaries.Pause, Mode: 0o755}},
		Entrypoint: []string{"/pause"},
		// As Kubernetes' pause: no privilege to hold namespaces.
		User: "65535:65535",
		Arch: runtime.GOARCH,
	})
	if err != nil {
		return fmt.Errorf("build the pause image: %w", err)
	}
	ref, err := name.ParseReference(st.Registry+"/"+PauseImage, name.Insecure)
	if err != nil {
		return err
	}
	if err := remote.Write(ref, img, remote.WithContext(ctx)); err != nil {
		return fmt.Errorf("push %s: %w", ref, err)
	}
	return nil
}

// grantKubeletAPI lets the API server's kubelet client identity call the
// kubelets' API (logs, exec, port-forward), which the kubelets authorize
// by SubjectAccessReview, as kubeadm's cluster does.
func (u *upper) grantKubeletAPI(ctx context.Context) error {
	_, err := u.client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-apiserver-kubelet-api-admin"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:kubelet-api-admin"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "kube-apiserver-kubelet-client"}},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("grant the API server the kubelets' API: %w", err)
	}
	return nil
}

// startRealNode boots node i (its network namespace already connected):
// containerd and the kubelet in the node's namespaces and cgroup, with the
// primary CNI a plain cluster has (ptp with host-local IPAM).
func (u *upper) startRealNode(ctx context.Context, i int, node Node) error {
	cfg, st := u.cfg, u.st
	nodeIP := cfg.nodeIP(i)
	lowerOOM, err := realnode.CanLowerOOMScore()
	if err != nil {
		return err
	}
	if !lowerOOM {
		u.cfg.Log.Warn("this host's root lacks CAP_SYS_RESOURCE: containerd keeps every container's oom_score_adj at or above its own",
			"node", node.Name)
	}
	s := realnode.Spec{
		Name:   node.Name,
		Dir:    filepath.Join(st.Dir, "nodes", node.Name, "disk"),
		Netns:  node.Netns,
		Cgroup: st.NodeCgroup + "/" + node.Name,
		IP:     nodeIP,
		Labels: map[string]string{
			corev1.LabelTopologyRegion: cfg.Region,
			corev1.LabelTopologyZone:   node.Zone,
		},
		Taints:              cfg.NodeTaints,
		Registry:            st.Registry,
		SandboxImage:        st.Registry + "/" + PauseImage,
		Nameserver:          cfg.hostIP(),
		ClusterDNS:          cfg.dnsServiceIP(),
		ClusterDomain:       "cluster.local",
		Kubeconfig:          st.Kubeconfig,
		ClientCAFile:        u.kubeletClientCA,
		RestrictOOMScoreAdj: !lowerOOM,
		Binaries: realnode.Binaries{
			Containerd: cfg.Binaries.ContainerdDir,
			Kubelet:    filepath.Join(cfg.Binaries.KubeDir, "kubelet"),
			Runc:       cfg.Binaries.Runc,
			CNI:        cfg.Binaries.CNIDir,
		},
	}
	if err := writePrimaryCNIConfig(s, node.PodCIDR); err != nil {
		return err
	}
	n, err := realnode.Boot(ctx, s, cfg.Binaries.Self, filepath.Join(cfg.StateDir, "logs"), st.addProcess)
	if n != nil {
		st.Nodes[i-1].InitPID = n.InitPID
		st.Mountpoints = append(st.Mountpoints, n.Mountpoints...)
		if serr := st.save(); serr != nil && err == nil {
			err = serr
		}
	}
	return err
}

// primaryCNIConfigPath is the node's own CNI configuration, as a plain
// cluster's primary CNI writes it. A CNI agent chains itself after it.
const primaryCNIConfigPath = "/etc/cni/net.d/10-canopy-local.conflist"

// primaryCNIConfig is the primary CNI's configuration of a node: ptp with
// host-local IPAM over the node's pod CIDR, its state in dataDir ("" for
// host-local's default, /var/lib/cni/networks).
func primaryCNIConfig(podCIDR, dataDir string) ([]byte, error) {
	ipam := map[string]any{
		"type":   "host-local",
		"ranges": [][]map[string]string{{{"subnet": podCIDR}}},
		"routes": []map[string]string{{"dst": "0.0.0.0/0"}},
	}
	if dataDir != "" {
		ipam["dataDir"] = dataDir
	}
	return json.MarshalIndent(map[string]any{
		"cniVersion": "1.0.0",
		"name":       "canopy-local",
		"plugins":    []any{map[string]any{"type": "ptp", "ipMasq": false, "mtu": 1500, "ipam": ipam}},
	}, "", "  ")
}

// writePrimaryCNIConfig writes the primary CNI's configuration of the real
// node with spec s, whatever was chained into it.
func writePrimaryCNIConfig(s realnode.Spec, podCIDR string) error {
	conf, err := primaryCNIConfig(podCIDR, "")
	if err != nil {
		return err
	}
	p := s.HostPath(primaryCNIConfigPath)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	// Replaced whole, as CNI daemons write their file: the kubelet's
	// runtime never reads half of it.
	return atomicfile.Write(p, conf, 0o644)
}

// attach returns the real node called name, for restarting its parts.
func (c *Cluster) attach(name string) (*realnode.Node, Node, error) {
	if c.State.Runtime != RuntimeContainerd {
		return nil, Node{}, fmt.Errorf("cluster %s has no real nodes", c.State.Name)
	}
	node, err := c.node(name)
	if err != nil {
		return nil, Node{}, err
	}
	n, err := realnode.Attach(c.nodeDisk(name), node.InitPID, c.State.Self, filepath.Join(c.State.Dir, "logs"), c.State.addProcess)
	return n, node, err
}

// nodeDisk is the host directory holding a real node's persistent files.
func (c *Cluster) nodeDisk(name string) string {
	return filepath.Join(c.State.Dir, "nodes", name, "disk")
}

// RestartContainerd restarts the container runtime of a real node, as a
// runtime upgrade or a crash does, with its pods running.
func (c *Cluster) RestartContainerd(ctx context.Context, name string) error {
	n, _, err := c.attach(name)
	if err != nil {
		return err
	}
	return n.RestartContainerd(ctx)
}

// RebootNode powers a real node off (every process of it ends at once) and
// boots it again: the kubelet recreates its pods' sandboxes. With
// rewriteCNI the node's primary CNI configuration is written again while
// the node is down, as a CNI daemon that owns the file does at its start:
// whatever was chained into it is gone when the kubelet starts.
func (c *Cluster) RebootNode(ctx context.Context, name string, rewriteCNI bool) error {
	n, node, err := c.attach(name)
	if err != nil {
		return err
	}
	var whileDown func() error
	if rewriteCNI {
		whileDown = func() error { return c.RewritePrimaryCNIConfig(name) }
	}
	err = n.Reboot(ctx, whileDown)
	for i := range c.State.Nodes {
		if c.State.Nodes[i].Name == node.Name {
			c.State.Nodes[i].InitPID = n.InitPID
		}
	}
	if serr := c.State.save(); serr != nil && err == nil {
		err = serr
	}
	return err
}

// RewritePrimaryCNIConfig writes a real node's primary CNI configuration
// again as the primary CNI first wrote it, dropping whatever a CNI agent
// chained into it: what Cilium, say, does each time its agent starts.
func (c *Cluster) RewritePrimaryCNIConfig(name string) error {
	n, node, err := c.attach(name)
	if err != nil {
		return err
	}
	return writePrimaryCNIConfig(n.Spec, node.PodCIDR)
}

// node returns the state of the node called name.
func (c *Cluster) node(name string) (Node, error) {
	for _, n := range c.State.Nodes {
		if n.Name == name {
			return n, nil
		}
	}
	return Node{}, fmt.Errorf("no node %q in cluster %s", name, c.State.Name)
}

// NodePath is where the host finds path p as node sees it (a real node's
// own /etc/cni/net.d, /var/run, /sys/fs/bpf, ...): under its init's root,
// with symbolic links resolved inside the node (/var/run is a link to /run,
// which the kernel would follow to the host's /run).
func (c *Cluster) NodePath(node, p string) (string, error) {
	if c.State.Runtime != RuntimeContainerd {
		return "", fmt.Errorf("cluster %s has no real nodes: the stand-in shares the host's file system", c.State.Name)
	}
	n, err := c.node(node)
	if err != nil {
		return "", err
	}
	return resolveIn(filepath.Join("/proc", strconv.Itoa(n.InitPID), "root"), p)
}

// resolveIn returns root joined with p after resolving every symbolic link
// on the way as if root were "/". A missing component ends the resolution:
// the rest is joined as it is.
func resolveIn(root, p string) (string, error) {
	rest := strings.Split(strings.Trim(filepath.Clean("/"+p), "/"), "/")
	cur := "/"
	for links := 0; len(rest) > 0; {
		part := rest[0]
		rest = rest[1:]
		if part == "" || part == "." {
			continue
		}
		next := filepath.Join(cur, part)
		fi, err := os.Lstat(filepath.Join(root, next))
		if err != nil || fi.Mode()&os.ModeSymlink == 0 {
			cur = next
			continue
		}
		if links++; links > 40 {
			return "", fmt.Errorf("%s: too many levels of symbolic links in %s", p, root)
		}
		target, err := os.Readlink(filepath.Join(root, next))
		if err != nil {
			return "", err
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(cur, target)
		}
		rest = append(strings.Split(strings.Trim(filepath.Clean(target), "/"), "/"), rest...)
		cur = "/"
	}
	return filepath.Join(root, cur), nil
}

// PodNetns returns a path that opens the network namespace of a running
// pod: the stand-in's pin, or on a real node that of a process in the
// pod's cgroup (the sandbox's, or a container's).
func (c *Cluster) PodNetns(pod *corev1.Pod) (string, error) {
	if c.State.Runtime != RuntimeContainerd {
		return filepath.Join("/run/netns", "cpod-"+string(pod.UID)), nil
	}
	pids, err := realnode.PodPIDs(c.State.NodeCgroup+"/"+pod.Spec.NodeName, string(pod.UID))
	if err != nil {
		return "", err
	}
	if len(pids) == 0 {
		return "", fmt.Errorf("pod %s/%s has no process on %s", pod.Namespace, pod.Name, pod.Spec.NodeName)
	}
	return filepath.Join("/proc", strconv.Itoa(pids[0]), "ns", "net"), nil
}
