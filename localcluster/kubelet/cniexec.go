package kubelet

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/canopy-mesh/canopy/localcluster/containerinit"
)

// nodeViewExec runs CNI plugins the way libcni does, but through the
// container init with some host paths bound to this node's directories.
// On a real node a CNI agent's DaemonSet puts its socket under a host path
// the plugin, run by the runtime on the host, finds at the same path; nodes
// sharing one machine each have their own directory there instead.
type nodeViewExec struct {
	self   string
	mounts []containerinit.Mount
}

var _ invoke.Exec = nodeViewExec{}

func (e nodeViewExec) ExecPlugin(ctx context.Context, pluginPath string, stdin []byte, environ []string) ([]byte, error) {
	cmd, err := containerinit.Command(e.self, containerinit.Spec{Argv: []string{pluginPath}, Mounts: e.mounts})
	if err != nil {
		return nil, err
	}
	// Not Setpgid's process group of a container: the plugin dies with a
	// cancelled ADD like any child of the runtime.
	cmd.SysProcAttr.Setpgid = false
	cmd.Env = environ
	cmd.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := startAndWait(ctx, cmd); err != nil {
		// A plugin reports its failure as a CNI error on stdout.
		var cniErr types.Error
		if json.Unmarshal(stdout.Bytes(), &cniErr) == nil && cniErr.Code != 0 {
			return nil, &cniErr
		}
		return nil, fmt.Errorf("CNI plugin %s: %w: %s", pluginPath, err, bytes.TrimSpace(stderr.Bytes()))
	}
	return stdout.Bytes(), nil
}

func (nodeViewExec) FindInPath(plugin string, paths []string) (string, error) {
	return invoke.FindInPath(plugin, paths)
}

func (nodeViewExec) Decode(b []byte) (version.PluginInfo, error) {
	var d version.PluginDecoder
	return d.Decode(b)
}

// startAndWait runs cmd, killing it when ctx ends first.
func startAndWait(ctx context.Context, cmd *exec.Cmd) error {
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		<-done
		return ctx.Err()
	}
}
