// Command canopy-echo is the test application of Canopy's local cluster and
// end-to-end tests: an HTTP and TCP echo server, a gRPC one (plain or
// proxyless through the mesh's xDS), and their clients.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/canopy-mesh/canopy/internal/echo"
	"github.com/canopy-mesh/canopy/internal/echogrpc"
	"github.com/canopy-mesh/canopy/internal/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRootCommand().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "canopy-echo:", err)
		os.Exit(1)
	}
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "canopy-echo",
		Short:         "HTTP and TCP echo server and client for tests and demos",
		Version:       version.Get(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}

	var cfg serveConfig
	serve := &cobra.Command{
		Use:   "serve",
		Short: "Serve HTTP (GET /, /healthz, /fetch, /dial, /grpc) and TCP echo, and optionally gRPC",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runServe(cmd.Context(), cfg, cmd.ErrOrStderr())
		},
	}
	serve.Flags().StringVar(&cfg.HTTPAddr, "http", ":8080", "HTTP listen address (empty: none)")
	serve.Flags().StringVar(&cfg.TCPAddr, "tcp", ":9000", "TCP echo listen address (empty: none)")
	serve.Flags().StringVar(&cfg.Name, "name", "", "name to report (default: hostname)")
	serve.Flags().StringVar(&cfg.grpcAddr, "grpc", "", "gRPC Echo service listen address (empty: none)")
	serve.Flags().StringVar(&cfg.version, "version", "", "version the gRPC server reports (a Deployment's version label)")
	serve.Flags().BoolVar(&cfg.xds, "xds", false, "proxyless gRPC: serve and call through the mesh's xDS (bootstrap from $GRPC_XDS_BOOTSTRAP)")
	serve.Flags().DurationVar(&cfg.bootstrapWait, "bootstrap-wait", 2*time.Minute, "with --xds, how long to wait for the bootstrap file the pod's agent writes")

	var timeout time.Duration
	get := &cobra.Command{
		Use:   "get URL",
		Short: "GET a URL and print the body",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runGet(cmd.Context(), args[0], timeout, cmd.OutOrStdout())
		},
	}
	tcp := &cobra.Command{
		Use:   "tcp ADDRESS MESSAGE",
		Short: "Send a message to a TCP echo server and print the echo",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			got, err := echo.EchoTCP(ctx, &net.Dialer{}, args[0], args[1])
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), got)
			return err
		},
	}
	for _, c := range []*cobra.Command{get, tcp} {
		c.Flags().DurationVar(&timeout, "timeout", 10*time.Second, "give up after this long")
	}
	root.AddCommand(serve, get, tcp)
	return root
}

// serveConfig is the serve command's flags.
type serveConfig struct {
	echo.ServerConfig
	grpcAddr, version string
	xds               bool
	bootstrapWait     time.Duration
}

func runServe(ctx context.Context, cfg serveConfig, logOut io.Writer) error {
	log := slog.New(slog.NewTextHandler(logOut, nil)).With("component", "echo")
	if cfg.xds {
		if err := waitBootstrap(ctx, os.Getenv("GRPC_XDS_BOOTSTRAP"), cfg.bootstrapWait, log); err != nil {
			return err
		}
	}
	client, err := echogrpc.NewClient(cfg.xds)
	if err != nil {
		return err
	}
	defer client.Close()
	cfg.Handlers = map[string]http.Handler{"GET /grpc": client}

	g, ctx := errgroup.WithContext(ctx)
	if cfg.grpcAddr != "" {
		gs, err := echogrpc.NewServer(echogrpc.ServerConfig{
			Addr: cfg.grpcAddr, Hostname: echogrpc.Hostname(), Version: cfg.version, XDS: cfg.xds,
		}, log)
		if err != nil {
			return err
		}
		cfg.Ready = gs.Ready
		g.Go(func() error { return gs.Run(ctx) })
	}
	s, err := echo.NewServer(cfg.ServerConfig, log)
	if err != nil {
		return err
	}
	g.Go(func() error { return s.Run(ctx) })
	return g.Wait()
}

// waitBootstrap waits for the xDS bootstrap file: the pod's agent writes it
// once it has its certificate, after the app may have started (a kubelet
// that runs Istio's postStart hook holds the app until then; one that does
// not, such as the local cluster's, does not).
func waitBootstrap(ctx context.Context, path string, wait time.Duration, log *slog.Logger) error {
	if path == "" {
		return errors.New("--xds needs GRPC_XDS_BOOTSTRAP (the grpc-agent injection template sets it)")
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for logged := false; ; logged = true {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		if !logged {
			log.Info("waiting for the xDS bootstrap", "path", path)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no xDS bootstrap at %s after %s: is the pod's agent running?", path, wait)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func runGet(ctx context.Context, url string, timeout time.Duration, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("build request: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("get %s: %w", url, err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(out, resp.Body); err != nil {
		return fmt.Errorf("read body: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("get %s: %s", url, resp.Status)
	}
	return nil
}
