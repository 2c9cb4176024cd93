package localcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/canopy-mesh/canopy/internal/cgroup"
	"github.com/canopy-mesh/canopy/internal/netns"
	"github.com/canopy-mesh/canopy/internal/procs"
	"github.com/canopy-mesh/canopy/localcluster/kubelet"
	"github.com/canopy-mesh/canopy/localcluster/realnode"
)

// Down removes everything Up recorded in dir: processes (the recorded ones,
// then any left in the cluster's network namespaces or its pods' cgroups),
// the cgroups, the namespaces, host links and the bridge, then the
// directory. It works on a
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
		st.Processes[i].Stop(5 * time.Second)
	}

	// Then every process in the cluster's namespaces: pods' processes, and
	// host-network pods' in the node namespaces.
	namespaces := append(append([]string(nil), st.Netns...), kubelet.PodNetns(filepath.Join(dir, "nodes", "*"))...)
	procs.KillInNetns(namespaces...)

	var errs []error
	// Real nodes: containers, shims and whatever a daemon left, in every
	// cgroup hierarchy. The nodes' mounts go with their mount namespaces
	// once their last process is gone.
	if st.NodeCgroup != "" {
		if err := realnode.RemoveCgroup(st.NodeCgroup); err != nil {
			errs = append(errs, err)
		}
	}
	// Whatever a pod left in its cgroup, wherever its network.
	if st.Cgroup != "" {
		if err := cgroup.Remove(st.Cgroup); err != nil {
			errs = append(errs, err)
		}
	}
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
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove state directory: %w", err)
	}
	removeLeftovers(dir, defaultStateRoot, cniHostPaths)
	// The real nodes' mount points the host lacked, deepest first; a
	// directory something else filled meanwhile stays.
	for i := len(st.Mountpoints) - 1; i >= 0; i-- {
		_ = os.Remove(st.Mountpoints[i])
	}
	return nil
}

// removeLeftovers removes what clusters leave on the host around a removed
// state directory, when nothing else holds it: the mount points of the
// node-local CNI paths and, for a cluster kept under root, root itself.
// os.Remove takes only empty directories, so another cluster's state, or a
// real CNI agent's socket, stays.
func removeLeftovers(dir, root string, hostPaths []string) {
	leftovers := hostPaths
	if filepath.Dir(filepath.Clean(dir)) == filepath.Clean(root) {
		leftovers = append([]string{root}, leftovers...)
	}
	for _, d := range leftovers {
		_ = os.Remove(d)
	}
}
