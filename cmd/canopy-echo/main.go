// Command canopy-echo is the test application of Canopy's local cluster and
// end-to-end tests: an HTTP and TCP echo server, and its client.
package main

import (
	"context"
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

	"github.com/canopy-mesh/canopy/internal/echo"
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

	var cfg echo.ServerConfig
	serve := &cobra.Command{
		Use:   "serve",
		Short: "Serve HTTP (GET /, /healthz, /fetch, /dial) and TCP echo",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runServe(cmd.Context(), cfg, cmd.ErrOrStderr())
		},
	}
	serve.Flags().StringVar(&cfg.HTTPAddr, "http", ":8080", "HTTP listen address (empty: none)")
	serve.Flags().StringVar(&cfg.TCPAddr, "tcp", ":9000", "TCP echo listen address (empty: none)")
	serve.Flags().StringVar(&cfg.Name, "name", "", "name to report (default: hostname)")

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

func runServe(ctx context.Context, cfg echo.ServerConfig, logOut io.Writer) error {
	log := slog.New(slog.NewTextHandler(logOut, nil)).With("component", "echo")
	s, err := echo.NewServer(cfg, log)
	if err != nil {
		return err
	}
	return s.Run(ctx)
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
