package kubelet

import (
	"context"
	"fmt"
	"sort"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	cnitypes100 "github.com/containernetworking/cni/pkg/types/100"
	corev1 "k8s.io/api/core/v1"
)

// network runs the node's CNI chain for pods, as a CRI runtime does: the
// first configuration file of the config directory, in lexical order, with
// plugins from the bin directory.
type network struct {
	cni     *libcni.CNIConfig
	confDir string
}

// newNetwork runs plugins from binDir; exec, when not nil, runs them (nil
// is libcni's own).
func newNetwork(confDir, binDir, cacheDir string, exec invoke.Exec) *network {
	return &network{
		cni:     libcni.NewCNIConfigWithCacheDir([]string{binDir}, cacheDir, exec),
		confDir: confDir,
	}
}

// config loads the network configuration list in effect now. It is read on
// every call because a CNI agent may rewrite it at any time (a chained
// plugin installing itself).
func (n *network) config() (*libcni.NetworkConfigList, error) {
	files, err := libcni.ConfFiles(n.confDir, []string{".conflist", ".conf", ".json"})
	if err != nil {
		return nil, fmt.Errorf("list CNI config in %s: %w", n.confDir, err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no CNI config in %s", n.confDir)
	}
	sort.Strings(files)
	list, err := libcni.NetworkConfFromFile(files[0])
	if err != nil {
		return nil, fmt.Errorf("load CNI config %s: %w", files[0], err)
	}
	return list, nil
}

func runtimeConf(pod *corev1.Pod, netnsPath string) *libcni.RuntimeConf {
	uid := string(pod.UID)
	return &libcni.RuntimeConf{
		ContainerID: uid,
		NetNS:       netnsPath,
		IfName:      "eth0",
		// The arguments a CRI runtime passes; CNI plugins (including a
		// mesh's) identify the pod by them.
		Args: [][2]string{
			{"IgnoreUnknown", "1"},
			{"K8S_POD_NAMESPACE", pod.Namespace},
			{"K8S_POD_NAME", pod.Name},
			{"K8S_POD_INFRA_CONTAINER_ID", uid},
			{"K8S_POD_UID", uid},
		},
	}
}

// add runs CNI ADD and returns the pod's IPs.
func (n *network) add(ctx context.Context, pod *corev1.Pod, netnsPath string) ([]string, error) {
	list, err := n.config()
	if err != nil {
		return nil, err
	}
	res, err := n.cni.AddNetworkList(ctx, list, runtimeConf(pod, netnsPath))
	if err != nil {
		return nil, fmt.Errorf("CNI ADD (network %s): %w", list.Name, err)
	}
	cur, err := cnitypes100.NewResultFromResult(res)
	if err != nil {
		return nil, fmt.Errorf("convert CNI result: %w", err)
	}
	var ips []string
	for _, ip := range cur.IPs {
		ips = append(ips, ip.Address.IP.String())
	}
	if len(ips) == 0 {
		return nil, fmt.Errorf("CNI ADD (network %s) returned no IP", list.Name)
	}
	return ips, nil
}

// del runs CNI DEL. Plugins must treat a repeated DEL as success.
func (n *network) del(ctx context.Context, pod *corev1.Pod, netnsPath string) error {
	list, err := n.config()
	if err != nil {
		return err
	}
	if err := n.cni.DelNetworkList(ctx, list, runtimeConf(pod, netnsPath)); err != nil {
		return fmt.Errorf("CNI DEL (network %s): %w", list.Name, err)
	}
	return nil
}
