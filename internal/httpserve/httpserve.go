// Package httpserve runs a component's HTTP ports (monitoring, admin,
// plugin sockets) in an errgroup, shut down gracefully when the group's
// context ends.
package httpserve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sync/errgroup"
)

// Run serves h on addr ("tcp", or "unix" for a socket path, whose stale
// file is replaced) until ctx ends.
func Run(ctx context.Context, g *errgroup.Group, what, network, addr string, h http.Handler, log *slog.Logger) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	g.Go(func() error {
		if network == "unix" {
			if err := os.MkdirAll(filepath.Dir(addr), 0o755); err != nil {
				return err
			}
			_ = os.Remove(addr)
		}
		l, err := net.Listen(network, addr)
		if err != nil {
			return fmt.Errorf("%s: listen: %w", what, err)
		}
		log.Info("serving "+what, "addr", addr)
		if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	})
	g.Go(func() error {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return srv.Shutdown(shutdown)
	})
}
