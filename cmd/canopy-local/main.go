// Command canopy-local runs a Kubernetes cluster on one Linux machine out of
// namespaces and processes, for Canopy's end-to-end tests and demos: real
// nodes (a kubelet and containerd each, pulling from the cluster's own
// registry) or, with --runtime stand-in, the kubelet stand-in:
//
//	canopy-local up [--nodes N]   start a cluster, print its kubeconfig path
//	canopy-local status           components, nodes and pods
//	canopy-local down             remove everything up made
//
// It needs root.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/canopy-mesh/canopy/internal/version"
	"github.com/canopy-mesh/canopy/localcluster"
	"github.com/canopy-mesh/canopy/localcluster/containerinit"
	"github.com/canopy-mesh/canopy/localcluster/realnode"
)

func main() {
	// A container's init runs before anything else: it must not start
	// goroutines or parse flags of its own.
	if len(os.Args) > 1 && os.Args[1] == containerinit.Arg {
		if err := containerinit.Main(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "canopy-local container init:", err)
		}
		os.Exit(127)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRootCommand().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "canopy-local:", err)
		os.Exit(1)
	}
}

type globalOptions struct {
	name     string
	stateDir string
	verbose  bool
}

func (g globalOptions) dir() string {
	if g.stateDir != "" {
		return g.stateDir
	}
	return localcluster.DefaultStateDir(g.name)
}

// logger logs at level, or everything with --verbose.
func (g globalOptions) logger(w io.Writer, level slog.Level) *slog.Logger {
	if g.verbose {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

func newRootCommand() *cobra.Command {
	var g globalOptions
	root := &cobra.Command{
		Use:           "canopy-local",
		Short:         "A Kubernetes cluster of network namespaces and processes on this machine",
		Version:       version.Get(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&g.name, "name", "canopy", "cluster name")
	root.PersistentFlags().StringVar(&g.stateDir, "state-dir", "", "state directory (default /var/lib/canopy-local/<name>)")
	root.PersistentFlags().BoolVarP(&g.verbose, "verbose", "v", false, "debug logging")

	var up upOptions
	upCmd := &cobra.Command{
		Use:   "up",
		Short: "Start a cluster and wait until it is ready",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runUp(cmd.Context(), g, up, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	upCmd.Flags().IntVar(&up.nodes, "nodes", 2, "number of nodes")
	upCmd.Flags().StringArrayVar(&up.images, "image", nil, "extra image table entry repository=/path/to/program (repeatable)")
	upCmd.Flags().StringVar(&up.echo, "echo", "", "canopy-echo binary (default: next to canopy-local, else on PATH)")
	upCmd.Flags().StringVar(&up.runtime, "runtime", string(localcluster.RuntimeContainerd),
		"what runs pods: containerd (real kubelets and containerd pulling from the cluster's registry) or stand-in (the kubelet stand-in; --image programs)")

	downCmd := &cobra.Command{
		Use:   "down",
		Short: "Remove every process, namespace, link and file of a cluster",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return localcluster.Down(cmd.Context(), g.dir())
		},
	}
	statusCmd := &cobra.Command{
		Use:   "status",
		Short: "Print components, nodes and pods",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return localcluster.PrintStatus(cmd.Context(), g.dir(), cmd.OutOrStdout())
		},
	}

	var kubeletConfig string
	kubeletCmd := &cobra.Command{
		Use:    "kubelet",
		Short:  "Run a node's kubelet stand-in (started by up inside the node's namespace)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return localcluster.RunKubelet(cmd.Context(), kubeletConfig, g.logger(cmd.ErrOrStderr(), slog.LevelInfo))
		},
	}
	kubeletCmd.Flags().StringVar(&kubeletConfig, "config", "", "kubelet configuration file written by up")
	var kubeconfig string
	schedulerCmd := &cobra.Command{
		Use:    "scheduler",
		Short:  "Run the cluster's scheduler (started by up)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return localcluster.RunScheduler(cmd.Context(), kubeconfig, g.logger(cmd.ErrOrStderr(), slog.LevelInfo))
		},
	}
	schedulerCmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the cluster")

	var nodeSpec string
	nodeInitCmd := &cobra.Command{
		Use:    "node-init",
		Short:  "Hold a real node's namespaces and mounts (started by up, in the node's namespaces)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runNodeInit(nodeSpec)
		},
	}
	nodeInitCmd.Flags().StringVar(&nodeSpec, "spec", "", "the node's spec, written by up")

	root.AddCommand(upCmd, downCmd, statusCmd, kubeletCmd, schedulerCmd, nodeInitCmd)
	return root
}

// runNodeInit runs a real node's init; up reads its one line of readiness
// from file descriptor 3.
func runNodeInit(specPath string) error {
	ready := os.NewFile(3, "ready")
	if ready == nil {
		return errors.New("node-init: no readiness pipe on file descriptor 3")
	}
	b, err := os.ReadFile(specPath)
	if err != nil {
		return fmt.Errorf("node-init: %w", err)
	}
	var s realnode.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("node-init: spec %s: %w", specPath, err)
	}
	return realnode.Init(s, ready)
}

type upOptions struct {
	nodes   int
	images  []string
	echo    string
	runtime string
}

func runUp(ctx context.Context, g globalOptions, o upOptions, out, errOut io.Writer) error {
	rt := localcluster.Runtime(o.runtime)
	bins, err := findBinaries(o.echo)
	if err != nil {
		return err
	}
	if rt == localcluster.RuntimeContainerd {
		if len(o.images) > 0 {
			return errors.New("--image is for the stand-in runtime; real nodes pull images from the cluster's registry")
		}
		bins.Pause = filepath.Join(filepath.Dir(bins.Self), "canopy-pause")
		if _, err := os.Stat(bins.Pause); err != nil {
			return fmt.Errorf("canopy-pause not found next to %s: make build", bins.Self)
		}
		if err := bins.FindNodeTools(); err != nil {
			return err
		}
	}
	images := map[string]string{}
	for _, e := range o.images {
		repo, path, ok := strings.Cut(e, "=")
		if !ok || repo == "" || !filepath.IsAbs(path) {
			return fmt.Errorf("--image %q: want repository=/absolute/path", e)
		}
		images[repo] = path
	}
	start := time.Now()
	c, err := localcluster.Up(ctx, localcluster.Config{
		Name:     g.name,
		Nodes:    o.nodes,
		StateDir: g.stateDir,
		Images:   images,
		Runtime:  rt,
		Binaries: bins,
		// up prints its own summary; its components' lifecycle lines
		// are for --verbose, and warnings always show.
		Log: g.logger(errOut, slog.LevelWarn),
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "cluster %q is ready in %.1fs with %d nodes\nexport KUBECONFIG=%s\n",
		g.name, time.Since(start).Seconds(), len(c.State.Nodes), c.State.Kubeconfig)
	if c.State.Registry != "" {
		fmt.Fprintf(out, "registry: %s (plain HTTP; every node pulls every image from it)\n", c.State.Registry)
	}
	return nil
}

// findBinaries locates what a cluster runs: this binary, canopy-echo and
// the pinned third-party tools.
func findBinaries(echo string) (localcluster.Binaries, error) {
	self, err := os.Executable()
	if err != nil {
		return localcluster.Binaries{}, fmt.Errorf("find own binary: %w", err)
	}
	if echo == "" {
		echo = filepath.Join(filepath.Dir(self), "canopy-echo")
		if _, err := os.Stat(echo); err != nil {
			if echo, err = exec.LookPath("canopy-echo"); err != nil {
				return localcluster.Binaries{}, fmt.Errorf("canopy-echo not found next to %s or on PATH: make build, or pass --echo", self)
			}
		}
	}
	if echo, err = filepath.Abs(echo); err != nil {
		return localcluster.Binaries{}, err
	}
	b := localcluster.Binaries{Self: self, Echo: echo}
	return b, b.FindTools()
}
