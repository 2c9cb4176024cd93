// Command canopyctl is Canopy's command-line tool: it installs and removes
// Canopy and answers questions about the mesh (workloads, services,
// policies, certificates, proxy status, configuration dumps). It reaches
// the cluster only through the API server, with the user's kubeconfig.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/canopy-mesh/canopy/ctl"
	"github.com/canopy-mesh/canopy/ctl/cluster"
	"github.com/canopy-mesh/canopy/internal/version"
)

func main() {
	// client-go logs through klog, to stderr by default: a discovery
	// failure would print a log line beside canopyctl's own error. Every
	// failure canopyctl cares about reaches it as an error, so klog's
	// output goes nowhere. Set here, in main only: klog's logger is
	// process-wide.
	klog.SetLoggerWithOptions(logr.Discard(), klog.ContextualLogger(true))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := execute(ctx, newRootCommand(connectReader), os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// execute runs canopyctl with args and returns its exit code: 0, or 1
// after printing the error on stderr.
func execute(ctx context.Context, root *cobra.Command, args []string, stdout, stderr io.Writer) int {
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(stderr, "canopyctl:", err)
		return 1
	}
	return 0
}

// globals are the flags every command takes, and how the read commands
// reach the cluster they name.
type globals struct {
	kubeconfig, context, namespace string
	reader                         readerFunc
}

// readerFunc connects the read commands to the cluster g names; tests
// give a fake one.
type readerFunc func(ctx context.Context, g *globals) (ctl.PodReader, error)

var _ ctl.PodReader = (*cluster.Cluster)(nil)

func connectReader(ctx context.Context, g *globals) (ctl.PodReader, error) {
	c, err := g.connect(ctx)
	if err != nil {
		return nil, err
	}
	return c, nil
}

func (g *globals) connect(ctx context.Context) (*cluster.Cluster, error) {
	return cluster.Connect(ctx, g.kubeconfig, g.context)
}

func newRootCommand(reader readerFunc) *cobra.Command {
	g := &globals{reader: reader}
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
	root.AddCommand(workloadsCommand(g), servicesCommand(g), policiesCommand(g), certificatesCommand(g),
		proxyStatusCommand(g), configDumpCommand(g), trafficCommand(g), dnsCommand(g),
		installCommand(g), upgradeCommand(g), uninstallCommand(g), versionCommand(g))
	return root
}

// readFunc is a read command: it gets the cluster, the parsed -o, the
// command's stdout and stderr, and its arguments.
type readFunc func(ctx context.Context, c ctl.PodReader, o ctl.Output, out, errOut io.Writer, args []string) error

// run is a read command's RunE. It checks -o against formats (nil: the
// command has no -o) before connecting, so that a typo costs no round
// trip, then calls fn.
func run(g *globals, output *string, formats []ctl.Output, fn readFunc) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		var o ctl.Output
		if output != nil {
			var err error
			if o, err = ctl.ParseOutput(*output, formats); err != nil {
				return fmt.Errorf("%s: %w", cmd.Name(), err)
			}
		}
		c, err := g.reader(cmd.Context(), g)
		if err != nil {
			return err
		}
		return fn(cmd.Context(), c, o, cmd.OutOrStdout(), cmd.ErrOrStderr(), args)
	}
}

// outputFlag adds -o with the formats a command accepts.
func outputFlag(cmd *cobra.Command, output *string, formats []ctl.Output) {
	cmd.Flags().StringVarP(output, "output", "o", "", ctl.FormatNames(formats))
}

func workloadsCommand(g *globals) *cobra.Command {
	var opts ctl.WorkloadsOptions
	var output string
	formats := ctl.WorkloadsFormats()
	cmd := &cobra.Command{
		Use:     "workloads",
		Aliases: []string{"w", "workload"},
		Short:   "List the mesh's workloads: address, node, waypoint and whether HBONE carries their traffic",
		Args:    cobra.NoArgs,
	}
	cmd.RunE = run(g, &output, formats, func(ctx context.Context, cl ctl.PodReader, o ctl.Output, out, errOut io.Writer, _ []string) error {
		opts.Namespace, opts.Output = g.namespace, o
		return ctl.Workloads(ctx, cl, opts, out, errOut)
	})
	f := cmd.Flags()
	f.StringVarP(&opts.Filter.Namespace, "namespace", "n", "", "only workloads of this namespace")
	f.StringVar(&opts.Filter.Node, "node", "", "only workloads on this node")
	f.BoolVar(&opts.Filter.AmbientOnly, "ambient-only", false, "only workloads in the mesh (protocol HBONE)")
	f.StringVar(&opts.Proxy, "proxy", "", "read this canopy-node pod's view (default: any ready one)")
	outputFlag(cmd, &output, formats)
	return cmd
}

func servicesCommand(g *globals) *cobra.Command {
	return listCommand(g, "services", []string{"svc", "service"}, "List the mesh's services: VIPs, waypoint, healthy endpoints", ctl.Services)
}

func policiesCommand(g *globals) *cobra.Command {
	return listCommand(g, "policies", []string{"policy"}, "List the authorization policies node proxies enforce", ctl.Policies)
}

func listCommand(g *globals, use string, aliases []string, short string,
	fn func(context.Context, ctl.PodReader, ctl.ListOptions, io.Writer, io.Writer) error) *cobra.Command {
	var opts ctl.ListOptions
	var output string
	formats := ctl.ListFormats()
	cmd := &cobra.Command{Use: use, Aliases: aliases, Short: short, Args: cobra.NoArgs}
	cmd.RunE = run(g, &output, formats, func(ctx context.Context, cl ctl.PodReader, o ctl.Output, out, errOut io.Writer, _ []string) error {
		opts.Namespace, opts.Output = g.namespace, o
		return fn(ctx, cl, opts, out, errOut)
	})
	f := cmd.Flags()
	f.StringVarP(&opts.Filter, "namespace", "n", "", "only this namespace")
	f.StringVar(&opts.Proxy, "proxy", "", "read this canopy-node pod's view (default: any ready one)")
	outputFlag(cmd, &output, formats)
	return cmd
}

func certificatesCommand(g *globals) *cobra.Command {
	var opts ctl.CertificatesOptions
	var output string
	formats := ctl.ListFormats()
	cmd := &cobra.Command{
		Use:     "certificates",
		Aliases: []string{"certs", "certificate"},
		Short:   "List each node proxy's workload certificates and when they expire",
		Args:    cobra.NoArgs,
	}
	cmd.RunE = run(g, &output, formats, func(ctx context.Context, cl ctl.PodReader, o ctl.Output, out, errOut io.Writer, _ []string) error {
		opts.Namespace, opts.Output = g.namespace, o
		return ctl.Certificates(ctx, cl, opts, out, errOut)
	})
	cmd.Flags().StringVar(&opts.Node, "node", "", "only this node's proxy")
	outputFlag(cmd, &output, formats)
	return cmd
}

func proxyStatusCommand(g *globals) *cobra.Command {
	var opts ctl.ProxyStatusOptions
	var output string
	formats := ctl.ListFormats()
	cmd := &cobra.Command{
		Use:     "proxy-status",
		Aliases: []string{"ps"},
		Short:   "Show every proxy the controller serves and whether it is in sync",
		Args:    cobra.NoArgs,
	}
	cmd.RunE = run(g, &output, formats, func(ctx context.Context, cl ctl.PodReader, o ctl.Output, out, _ io.Writer, _ []string) error {
		opts.Namespace, opts.Output = g.namespace, o
		return ctl.ProxyStatus(ctx, cl, opts, out)
	})
	cmd.Flags().BoolVar(&opts.Verbose, "verbose", false, "one column per type with its state and age")
	outputFlag(cmd, &output, formats)
	return cmd
}

func configDumpCommand(g *globals) *cobra.Command {
	var opts ctl.ConfigDumpOptions
	cmd := &cobra.Command{
		Use:       "config-dump controller|node",
		Short:     "Print a component's whole configuration as JSON",
		Long:      "config-dump node prints a node proxy's /config_dump (what istioctl ztunnel-config reads); config-dump controller prints the controller's tables, or with --proxy-id what it sent that proxy.",
		ValidArgs: ctl.ConfigDumpTargets(),
		// The target and flags are checked before connecting.
		Args: func(_ *cobra.Command, args []string) error {
			switch len(args) {
			case 0:
				return ctl.ErrNoConfigDumpTarget
			case 1:
				opts.Target = args[0]
				return opts.Check()
			}
			return fmt.Errorf("config-dump takes one target, controller or node, not %d (%s)", len(args), strings.Join(args, " "))
		},
	}
	cmd.RunE = run(g, nil, nil, func(ctx context.Context, cl ctl.PodReader, _ ctl.Output, out, _ io.Writer, args []string) error {
		opts.Namespace, opts.Target = g.namespace, args[0]
		return ctl.ConfigDump(ctx, cl, opts, out)
	})
	f := cmd.Flags()
	f.StringVar(&opts.Pod, "pod", "", "the component's pod (default: a ready one)")
	f.StringVar(&opts.Node, "node", "", "for node: the node proxy on this node")
	f.StringVar(&opts.ProxyID, "proxy-id", "", "for controller: what it sent this proxy (<pod>.<namespace>)")
	return cmd
}

func dnsCommand(g *globals) *cobra.Command {
	var opts ctl.DNSOptions
	var output string
	formats := ctl.DNSFormats()
	cmd := &cobra.Command{
		Use:   "dns <namespace>/<pod>",
		Short: "Show a pod's DNS as its node proxy answers it: mesh names, addresses, resolvers",
		Args:  cobra.ExactArgs(1),
	}
	cmd.RunE = run(g, &output, formats, func(ctx context.Context, cl ctl.PodReader, o ctl.Output, out, _ io.Writer, args []string) error {
		opts.Namespace, opts.Pod, opts.Output = g.namespace, args[0], o
		return ctl.DNS(ctx, cl, opts, out)
	})
	outputFlag(cmd, &output, formats)
	return cmd
}

func trafficCommand(g *globals) *cobra.Command {
	var opts ctl.TrafficOptions
	var output string
	formats := ctl.ListFormats()
	cmd := &cobra.Command{
		Use:   "traffic",
		Short: "Show the connections node proxies carried: workloads, identities, whether over mutual TLS, and how many authorization policies denied",
		Args:  cobra.NoArgs,
	}
	cmd.RunE = run(g, &output, formats, func(ctx context.Context, cl ctl.PodReader, o ctl.Output, out, errOut io.Writer, _ []string) error {
		opts.Namespace, opts.Output = g.namespace, o
		return ctl.Traffic(ctx, cl, opts, out, errOut)
	})
	cmd.Flags().StringVar(&opts.Node, "node", "", "only this node's proxy")
	cmd.Flags().BoolVar(&opts.Denied, "denied", false, "only rows with connections an authorization policy denied")
	outputFlag(cmd, &output, formats)
	return cmd
}

// chartFlags adds the flags that say what to render and apply, which
// install and upgrade share.
func chartFlags(f *pflag.FlagSet, opts *ctl.InstallOptions) {
	f.StringArrayVarP(&opts.ValuesFiles, "values", "f", nil, "values file (repeatable; later ones win)")
	f.StringArrayVar(&opts.Set, "set", nil, "a value, key=value, as helm --set (repeatable)")
	f.StringVar(&opts.Version, "version", opts.Version, "image tag to install")
	f.BoolVar(&opts.SkipCRDs, "skip-crds", false, "do not apply the CRDs (they are managed elsewhere)")
	f.BoolVar(&opts.ForceCRDs, "force-crds", false, "take over CRD fields another installer manages")
	f.BoolVar(&opts.DryRun, "dry-run", false, "print what would be applied instead of applying it")
	f.StringVar(&opts.Revision, "revision", "", "a control-plane revision beside the default one (e.g. canary): only its canopy-controller and injector, named for it; the node DaemonSets stay the default release's")
}

func installCommand(g *globals) *cobra.Command {
	opts := ctl.InstallOptions{Version: version.Get()}
	cmd := &cobra.Command{
		Use:   "install",
		Short: "Install Canopy (CRDs, controller, CNI agent, node proxy) and wait until it is ready",
		Long: "Install Canopy (CRDs, controller, CNI agent, node proxy) and wait until it is ready.\n\n" +
			"On a release already installed it applies every component at once; canopyctl upgrade rolls them one at a time, the controller first. " +
			"With --revision it installs a second control plane for a canary upgrade: namespaces labelled istio.io/rev=<revision> get its sidecars.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts.Namespace = g.namespace
			if err := opts.Check(); err != nil {
				return err
			}
			if opts.DryRun {
				return ctl.Install(cmd.Context(), nil, opts, cmd.OutOrStdout())
			}
			c, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			return ctl.Install(cmd.Context(), c, opts, cmd.OutOrStdout())
		},
	}
	chartFlags(cmd.Flags(), &opts)
	cmd.Flags().DurationVar(&opts.Wait, "wait", 5*time.Minute, "how long to wait for readiness (0: do not wait)")
	return cmd
}

func upgradeCommand(g *globals) *cobra.Command {
	opts := ctl.UpgradeOptions{InstallOptions: ctl.InstallOptions{Version: version.Get()}}
	cmd := &cobra.Command{
		Use:   "upgrade",
		Short: "Upgrade Canopy one component at a time: CRDs, controller, CNI agent, node proxy, each rolled out before the next",
		Long: "Upgrade an installed Canopy to this canopyctl's version (or --version), with the values given, one component at a time: " +
			"the CRDs, then the controller (so that new node proxies find a controller that knows them), the CNI agent and the node proxy. " +
			"Each step waits until its rollout is done (every pod updated and available), at most --wait; a step that does not finish stops the upgrade, " +
			"naming the component and its stuck pods. --all-at-once applies everything and waits once, as install does. --dry-run prints the plan.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts.Namespace = g.namespace
			if err := opts.Check(); err != nil {
				return err
			}
			if opts.DryRun {
				return ctl.Upgrade(cmd.Context(), nil, opts, cmd.OutOrStdout())
			}
			c, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			return ctl.Upgrade(cmd.Context(), c, opts, cmd.OutOrStdout())
		},
	}
	chartFlags(cmd.Flags(), &opts.InstallOptions)
	cmd.Flags().DurationVar(&opts.Wait, "wait", 5*time.Minute, "how long each step's rollout may take (with --all-at-once, the whole rollout)")
	cmd.Flags().BoolVar(&opts.AllAtOnce, "all-at-once", false, "apply every component together and wait once, instead of one at a time")
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
			if err := opts.Check(); err != nil {
				return err
			}
			c, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			return ctl.Uninstall(cmd.Context(), c, opts, cmd.OutOrStdout())
		},
	}
	cmd.Flags().BoolVar(&opts.RemoveCRDs, "remove-crds", false, "also delete the CRDs, and with them every Istio resource of the cluster")
	cmd.Flags().BoolVar(&opts.Purge, "purge", false, "also delete the self-signed CA and the root-certificate ConfigMaps of every namespace (a reinstall gets a new root)")
	cmd.Flags().DurationVar(&opts.Wait, "wait", 2*time.Minute, "how long the CNI agents may take to un-enroll their pods")
	cmd.Flags().StringVar(&opts.Revision, "revision", "", "remove only this revision's control plane (installed with install --revision), leaving the rest of Canopy")
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
			c, err := g.reader(cmd.Context(), g)
			if err != nil {
				return err
			}
			return ctl.Version(cmd.Context(), c, ctl.VersionOptions{Namespace: g.namespace, Client: version.Get()}, cmd.OutOrStdout())
		},
	}
	cmd.Flags().BoolVar(&short, "client", false, "only canopyctl's version, without asking the cluster")
	return cmd
}
