// Command canopyctl is Canopy's command-line tool: it installs and removes
// Canopy and answers questions about the mesh (workloads, services,
// policies, certificates, proxy status, configuration dumps). It reaches
// the cluster only through the API server, with the user's kubeconfig.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/canopy-mesh/canopy/ctl"
	"github.com/canopy-mesh/canopy/ctl/cluster"
	"github.com/canopy-mesh/canopy/internal/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCommand().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "canopyctl:", err)
		os.Exit(1)
	}
}

// globals are the flags every command takes.
type globals struct {
	kubeconfig, context, namespace string
}

func (g *globals) connect() (*cluster.Cluster, error) {
	return cluster.Connect(g.kubeconfig, g.context)
}

func newRootCommand() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:           "canopyctl",
		Short:         "Install Canopy and ask the mesh questions",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version.Get(),
	}
	pf := root.PersistentFlags()
	pf.StringVar(&g.kubeconfig, "kubeconfig", "", "kubeconfig file (default $KUBECONFIG, else ~/.kube/config)")
	pf.StringVar(&g.context, "context", "", "kubeconfig context (default the current one)")
	pf.StringVarP(&g.namespace, "istio-namespace", "i", "istio-system", "namespace Canopy runs in")
	root.AddCommand(installCommand(g), uninstallCommand(g), versionCommand(g))
	return root
}

func installCommand(g *globals) *cobra.Command {
	opts := ctl.InstallOptions{Version: version.Get()}
	cmd := &cobra.Command{
		Use:   "install",
		Short: "Install Canopy (CRDs, controller, CNI agent, node proxy) and wait until it is ready",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts.Namespace = g.namespace
			if opts.DryRun {
				return ctl.Install(cmd.Context(), nil, opts, cmd.OutOrStdout())
			}
			c, err := g.connect()
			if err != nil {
				return err
			}
			return ctl.Install(cmd.Context(), c, opts, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringArrayVarP(&opts.ValuesFiles, "values", "f", nil, "values file (repeatable; later ones win)")
	f.StringArrayVar(&opts.Set, "set", nil, "a value, key=value, as helm --set (repeatable)")
	f.StringVar(&opts.Version, "version", opts.Version, "image tag to install")
	f.BoolVar(&opts.SkipCRDs, "skip-crds", false, "do not apply the CRDs (they are managed elsewhere)")
	f.BoolVar(&opts.DryRun, "dry-run", false, "print the manifests instead of applying them")
	f.DurationVar(&opts.Wait, "wait", 5*time.Minute, "how long to wait for readiness (0: do not wait)")
	return cmd
}

func uninstallCommand(g *globals) *cobra.Command {
	opts := ctl.UninstallOptions{}
	cmd := &cobra.Command{
		Use:   "uninstall",
		Short: "Take every pod out of the mesh, then remove Canopy",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts.Namespace = g.namespace
			c, err := g.connect()
			if err != nil {
				return err
			}
			return ctl.Uninstall(cmd.Context(), c, opts, cmd.OutOrStdout())
		},
	}
	cmd.Flags().BoolVar(&opts.RemoveCRDs, "remove-crds", false, "also delete the CRDs, and with them every Istio resource of the cluster")
	cmd.Flags().DurationVar(&opts.Wait, "wait", 2*time.Minute, "how long the CNI agents may take to un-enroll their pods")
	return cmd
}

func versionCommand(g *globals) *cobra.Command {
	short := false
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print canopyctl's version and the control plane's",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if short {
				fmt.Fprintln(cmd.OutOrStdout(), version.Get())
				return nil
			}
			c, err := g.connect()
			if err != nil {
				return err
			}
			return ctl.Version(cmd.Context(), c, ctl.VersionOptions{Namespace: g.namespace, Client: version.Get()}, cmd.OutOrStdout())
		},
	}
	cmd.Flags().BoolVar(&short, "client", false, "only canopyctl's version, without asking the cluster")
	return cmd
}
