package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"

	"github.com/canopy-mesh/canopy/cni/install"
	"github.com/canopy-mesh/canopy/internal/httpserve"
	"github.com/canopy-mesh/canopy/internal/version"
)

// Enroller is the agent's loop as the lifecycle drives it; *Agent
// implements it.
type Enroller interface {
	// Run enrolls the node's pods until ctx ends.
	Run(ctx context.Context) error
	// Synced is closed once every pod of the node has been seen.
	Synced() <-chan struct{}
	// Uninstall takes every pod out of the mesh; only after Run returned.
	Uninstall(ctx context.Context) error
	// PluginHandler serves the plugin's events.
	PluginHandler() http.Handler
}

// PluginInstaller puts the plugin into the node's CNI chain and keeps it
// there; install.Installer implements it.
type PluginInstaller interface {
	Install() error
	// Watch puts the plugin back whenever the configuration changes, until
	// ctx ends.
	Watch(ctx context.Context) error
	Uninstall() error
}

// RemovalWatch tells an uninstall from an upgrade; *removal.Watcher
// implements it.
type RemovalWatch interface {
	Run(ctx context.Context) error
	Removed(ctx context.Context) (bool, error)
}

// ProxyServer serves ZDS to the node proxy; *zds.Server implements it.
type ProxyServer interface {
	Run(ctx context.Context) error
}

var _ Enroller = (*Agent)(nil)

// LifecycleConfig configures RunLifecycle.
type LifecycleConfig struct {
	// Uninstall selects the one-shot mode: take every pod of the node out
	// of the mesh, remove the plugin and the host rules, and return.
	Uninstall bool
	// PluginSocket is the unix socket where the plugin reaches the agent.
	PluginSocket string
	// ZDSSocket is the node proxy's socket; its directory is created
	// before ZDS is served.
	ZDSSocket string
	// MonitorAddr serves /metrics, /healthz, /readyz and /version.
	MonitorAddr string
	// Describe are key-value pairs (node, backend, ...) for the log line
	// that says the agent started.
	Describe []any
}

// Components are what RunLifecycle starts and stops; cmd/canopy-cni-agent
// builds them. Proxy and Removal are not used when uninstalling.
type Components struct {
	Agent   Enroller
	Plugin  PluginInstaller
	Removal RemovalWatch
	Proxy   ProxyServer
	Metrics prometheus.Gatherer
}

// RunLifecycle runs the CNI agent on its node: the plugin installed into
// the CNI chain and kept there, the pods enrolled, ZDS served to the node
// proxy once the agent knows the node's pods, the plugin's events and the
// monitoring port served. It returns when ctx ends (SIGTERM) after
// cleanup: if the agent's DaemonSet is being deleted, the node is taken
// out of the mesh first; otherwise (an upgrade) the pods stay enrolled and
// the plugin stays installed. With cfg.Uninstall it only takes the node
// out of the mesh.
func RunLifecycle(ctx context.Context, cfg LifecycleConfig, c Components, log *slog.Logger) error {
	if cfg.Uninstall {
		return uninstallNode(ctx, c, log)
	}

	// The loop outlives the signal by a moment: stopping must first ask
	// whether the DaemonSet is being deleted, and then take the node out
	// of the mesh with the rules still verified.
	signalled := ctx
	runCtx, stopRun := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRun()
	g, ctx := errgroup.WithContext(runCtx)
	if err := c.Plugin.Install(); err != nil && !errors.Is(err, install.ErrNoPrimary) {
		return fmt.Errorf("install the plugin: %w", err)
	}
	// The watch restores the plugin whenever the configuration changes: it
	// must have stopped before an uninstall removes the plugin, or it
	// would put it straight back.
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	watchDone := make(chan struct{})
	g.Go(func() error {
		defer close(watchDone)
		return c.Plugin.Watch(watchCtx)
	})
	g.Go(func() error { return c.Removal.Run(ctx) })
	var removing atomic.Bool
	g.Go(func() error {
		select {
		case <-signalled.Done():
		case <-ctx.Done():
			return nil
		}
		defer stopRun()
		checkCtx, cancel := context.WithTimeout(runCtx, 5*time.Second)
		defer cancel()
		gone, err := c.Removal.Removed(checkCtx)
		if err != nil {
			log.Warn("cannot tell whether the DaemonSet is being deleted; staying installed", "err", err)
			return nil
		}
		if gone {
			log.Info("the DaemonSet is being deleted: taking the node out of the mesh")
			removing.Store(true)
			stopWatch()
			<-watchDone
			if err := c.Plugin.Uninstall(); err != nil {
				log.Error("remove the plugin", "err", err)
			}
		}
		return nil
	})
	g.Go(func() error { return c.Agent.Run(ctx) })
	g.Go(func() error {
		// The node proxy treats a snapshot as complete: open ZDS only once
		// the agent knows the node's pods.
		select {
		case <-c.Agent.Synced():
		case <-ctx.Done():
			return nil
		}
		if err := os.MkdirAll(filepath.Dir(cfg.ZDSSocket), 0o755); err != nil {
			return err
		}
		return c.Proxy.Run(ctx)
	})
	httpserve.Run(ctx, g, "plugin events", "unix", cfg.PluginSocket, c.Agent.PluginHandler(), log)
	httpserve.Run(ctx, g, "monitoring", "tcp", cfg.MonitorAddr, monitorHandler(c), log)
	log.Info("canopy-cni-agent started", slices.Concat(cfg.Describe, []any{"version", version.Get()})...)
	err := g.Wait()
	if removing.Load() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(runCtx), 30*time.Second)
		defer cancel()
		if uerr := c.Agent.Uninstall(ctx); uerr != nil {
			return errors.Join(err, fmt.Errorf("un-enroll: %w", uerr))
		}
		log.Info("uninstalled: every pod of the node is out of the mesh")
	}
	return err
}

// monitorHandler serves the monitoring port: metrics, liveness, readiness
// (the agent has seen the node's pods) and the version.
func monitorHandler(c Components) http.Handler {
	monitor := http.NewServeMux()
	monitor.Handle("GET /metrics", promhttp.HandlerFor(c.Metrics, promhttp.HandlerOpts{}))
	monitor.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	monitor.HandleFunc("GET /version", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, version.Get()) })
	monitor.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		select {
		case <-c.Agent.Synced():
			fmt.Fprintln(w, "ok")
		default:
			http.Error(w, "not synced", http.StatusServiceUnavailable)
		}
	})
	return monitor
}

// uninstallNode takes the node out of the mesh: the plugin out of the
// chain first (no new pod is enrolled meanwhile), the agent's loop stopped
// once it has found every pod (it would enroll them again), then every pod
// un-enrolled and the host rules removed.
func uninstallNode(ctx context.Context, c Components, log *slog.Logger) error {
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Agent.Run(runCtx) }()
	select {
	case <-c.Agent.Synced():
	case err := <-done:
		return fmt.Errorf("agent ended before it synced: %w", err)
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := c.Plugin.Uninstall(); err != nil {
		return fmt.Errorf("remove the plugin: %w", err)
	}
	cancel()
	if err := <-done; err != nil {
		return err
	}
	if err := c.Agent.Uninstall(ctx); err != nil {
		return fmt.Errorf("un-enroll: %w", err)
	}
	log.Info("uninstalled: every pod of the node is out of the mesh")
	return nil
}
