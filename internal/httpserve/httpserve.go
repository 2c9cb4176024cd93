// Package httpserve runs a component's HTTP ports (monitoring, admin,
// plugin sockets, the injection webhook) in an errgroup, shut down
// gracefully when the group's context ends, and bounds how many requests
// a handler serves at once (Limit).
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
	"strconv"
	"time"

	"golang.org/x/sync/errgroup"
)

// Run serves h on addr ("tcp", or "unix" for a socket path, whose stale
// file is replaced) until ctx ends.
func Run(ctx context.Context, g *errgroup.Group, what, network, addr string, h http.Handler, log *slog.Logger) {
	Serve(ctx, g, what, network, addr, &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}, log)
}

// Serve serves srv (its handler, timeouts and limits as set) on addr until
// ctx ends. With srv.TLSConfig set it serves HTTPS (HTTP/2 and HTTP/1.1),
// the certificate coming from the TLS configuration.
func Serve(ctx context.Context, g *errgroup.Group, what, network, addr string, srv *http.Server, log *slog.Logger) {
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
		if srv.TLSConfig != nil {
			err = srv.ServeTLS(l, "", "")
		} else {
			err = srv.Serve(l)
		}
		if !errors.Is(err, http.ErrServerClosed) {
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

// Limit serves at most max requests of h at once. A request beyond them
// waits up to wait for a slot (less if its context ends first), then is
// answered 503 Service Unavailable with a Retry-After of one second,
// without reaching h. max must be positive.
func Limit(h http.Handler, max int, wait time.Duration) http.Handler {
	slots := make(chan struct{}, max)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case slots <- struct{}{}:
		default:
			t := time.NewTimer(wait)
			select {
			case slots <- struct{}{}:
				t.Stop()
			case <-t.C:
				busy(w)
				return
			case <-r.Context().Done():
				t.Stop()
				busy(w)
				return
			}
		}
		defer func() { <-slots }()
		h.ServeHTTP(w, r)
	})
}

func busy(w http.ResponseWriter) {
	w.Header().Set("Retry-After", strconv.Itoa(1))
	http.Error(w, "too many requests in progress; retry", http.StatusServiceUnavailable)
}
