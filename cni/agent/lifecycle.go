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
	"github.com/canopy-mesh/canopy/cni/redirect"
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
	// SelfTest enrolls, verifies and un-enrolls a throwaway namespace.
	SelfTest() error
}

// PluginInstaller puts the plugin into the node's CNI chain and keeps it
// there; install.Installer implements it.
type PluginInstaller interface {
	Install() error
	// Watch puts the plugin back whenever the configuration changes, until
	// ctx ends.
	Watch(ctx context.Context) error
	Uninstall() error
	// InChain returns nil once the runtime runs the plugin for every new
	// pod, else what is missing.
	InChain() error
}

// StartupTaint is the node's startup taint, which the agent removes once
// the node can enroll pods; taint.Remover implements it.
type StartupTaint interface {
	Remove(ctx context.Context) (bool, error)
}

// RemovalWatch tells an uninstall from an upgrade; *removal.Watcher
// implements it.
type RemovalWatch interface {
	Run(ctx context.Context) error
	Removed(ctx context.Context) (bool, error)
	// Synced is closed once Removed can answer without asking the API
	// server (an uninstall may have revoked the agent's access by then).
	Synced() <-chan struct{}
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
	// ReadyRetry is the first wait before the node's readiness (plugin in
	// the chain, self-test, taint removal) is tried again; it doubles up
	// to 30s. Default 1s.
	ReadyRetry time.Duration
}

// Components are what RunLifecycle starts and stops; cmd/canopy-cni-agent
// builds them. Proxy, Removal and Taint are not used when uninstalling;
// a nil Taint means the node has no startup taint to remove.
type Components struct {
	Agent   Enroller
	Plugin  PluginInstaller
	Removal RemovalWatch
	Proxy   ProxyServer
	Taint   StartupTaint
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
	if c.Taint != nil {
		g.Go(func() error { readyNode(ctx, cfg.ReadyRetry, c, log); return nil })
	}
	httpserve.Run(ctx, g, "plugin events", "unix", cfg.PluginSocket, c.Agent.PluginHandler(), log)
	httpserve.Run(ctx, g, "monitoring", "tcp", cfg.MonitorAddr, monitorHandler(c), log)
	log.Info("canopy-cni-agent started", slices.Concat(cfg.Describe, []any{"version", version.Get()})...)
	if !redirect.MigrateSupported() {
		// Said once: the pods are enrolled all the same, as before.
		log.Warn("the kernel has no net.ipv4.tcp_migrate_req (Linux 5.14): when the node proxy is replaced, connections queued on the old proxy's listeners are reset")
	}
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

// readyNode removes the node's startup taint once the node can enroll
// pods: the agent knows the node's pods (it answers the plugin), the
// plugin is in the CNI chain (every new pod goes through it) and a
// self-test enrollment passed (the backend works on this kernel). Until
// then pods that do not tolerate the taint are not scheduled to the node,
// so none starts outside the mesh because the agent was not ready. It
// tries again, backing off, until it succeeds or ctx ends.
func readyNode(ctx context.Context, retry time.Duration, c Components, log *slog.Logger) {
	select {
	case <-c.Agent.Synced():
	case <-ctx.Done():
		return
	}
	if retry <= 0 {
		retry = time.Second
	}
	for {
		err := c.Plugin.InChain()
		if err != nil {
			err = fmt.Errorf("plugin not in the CNI chain: %w", err)
		} else if err = c.Agent.SelfTest(); err == nil {
			var removed bool
			if removed, err = c.Taint.Remove(ctx); err == nil {
				if removed {
					log.Info("node ready for pods: startup taint removed")
				}
				return
			}
		}
		log.Warn("node not ready for pods yet; keeping its startup taint", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry):
		}
		retry = min(2*retry, 30*time.Second)
	}
}

// monitorHandler serves the monitoring port: metrics, liveness, readiness
// (the agent has seen the node's pods and watches its DaemonSet, so it can
// tell an uninstall) and the version.
func monitorHandler(c Components) http.Handler {
	monitor := http.NewServeMux()
	monitor.Handle("GET /metrics", promhttp.HandlerFor(c.Metrics, promhttp.HandlerOpts{}))
	monitor.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	monitor.HandleFunc("GET /version", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, version.Get()) })
	monitor.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		for _, s := range []struct {
			what string
			done <-chan struct{}
		}{{"the node's pods", c.Agent.Synced()}, {"the agent's DaemonSet", c.Removal.Synced()}} {
			select {
			case <-s.done:
			default:
				http.Error(w, "not synced: "+s.what, http.StatusServiceUnavailable)
				return
			}
		}
		fmt.Fprintln(w, "ok")
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
