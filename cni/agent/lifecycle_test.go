package agent_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/canopy-mesh/canopy/cni/agent"
	"github.com/canopy-mesh/canopy/cni/install"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
)

// record is the order in which the fakes were asked to do things.
type record struct {
	mu  sync.Mutex
	got []string
}

func (r *record) add(what string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, what)
}

func (r *record) list() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

func (r *record) has(what string) bool { return slices.Contains(r.list(), what) }

// fakeAgent is the agent's loop: Run records its start and its end, and
// syncs at once unless told to wait for sync().
type fakeAgent struct {
	rec          *record
	waitForSync  bool
	runErr       error // Run returns it at once
	uninstallErr error

	once   sync.Once
	synced chan struct{}

	mu          sync.Mutex
	selfTestErr error
	// uninstallCtxErr is the context's error when Uninstall was called.
	uninstallCtxErr error
}

func newFakeAgent(rec *record) *fakeAgent { return &fakeAgent{rec: rec, synced: make(chan struct{})} }

func (a *fakeAgent) sync() { a.once.Do(func() { close(a.synced) }) }

// Run implements agent.Enroller.
func (a *fakeAgent) Run(ctx context.Context) error {
	a.rec.add("agent runs")
	if a.runErr != nil {
		return a.runErr
	}
	if !a.waitForSync {
		a.sync()
	}
	<-ctx.Done()
	a.rec.add("agent stopped")
	return nil
}

// Synced implements agent.Enroller.
func (a *fakeAgent) Synced() <-chan struct{} { return a.synced }

// Uninstall implements agent.Enroller.
func (a *fakeAgent) Uninstall(ctx context.Context) error {
	a.rec.add("pods un-enrolled")
	a.uninstallCtxErr = ctx.Err()
	return a.uninstallErr
}

// PluginHandler implements agent.Enroller.
func (a *fakeAgent) PluginHandler() http.Handler { return http.NotFoundHandler() }

// SelfTest implements agent.Enroller: it fails while selfTestErr is set.
func (a *fakeAgent) SelfTest() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.selfTestErr != nil {
		a.rec.add("self-test failed")
		return a.selfTestErr
	}
	a.rec.add("self-test passed")
	return nil
}

func (a *fakeAgent) setSelfTestErr(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.selfTestErr = err
}

// fakePlugin is the plugin in the CNI chain.
type fakePlugin struct {
	rec                      *record
	installErr, uninstallErr error

	mu         sync.Mutex
	inChainErr error
}

// Install implements agent.PluginInstaller.
func (p *fakePlugin) Install() error {
	p.rec.add("plugin installed")
	return p.installErr
}

// Watch implements agent.PluginInstaller.
func (p *fakePlugin) Watch(ctx context.Context) error {
	p.rec.add("watch runs")
	<-ctx.Done()
	p.rec.add("watch stopped")
	return nil
}

// Uninstall implements agent.PluginInstaller.
func (p *fakePlugin) Uninstall() error {
	p.rec.add("plugin removed")
	return p.uninstallErr
}

// InChain implements agent.PluginInstaller: the plugin is in the chain
// unless told otherwise.
func (p *fakePlugin) InChain() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inChainErr
}

func (p *fakePlugin) setInChainErr(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inChainErr = err
}

// fakeRemoval says whether the DaemonSet is being deleted.
type fakeRemoval struct {
	rec     *record
	removed bool
	err     error
	// ctxErr is the context's error when Removed was asked.
	ctxErr error
	// synced is closed by sync; newLifecycle syncs it unless a test wants
	// to.
	synced   chan struct{}
	syncOnce sync.Once
}

// Synced implements agent.RemovalWatch.
func (r *fakeRemoval) Synced() <-chan struct{} { return r.synced }

func (r *fakeRemoval) sync() { r.syncOnce.Do(func() { close(r.synced) }) }

// Run implements agent.RemovalWatch.
func (r *fakeRemoval) Run(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

// Removed implements agent.RemovalWatch.
func (r *fakeRemoval) Removed(ctx context.Context) (bool, error) {
	r.rec.add("removal asked")
	r.ctxErr = ctx.Err()
	return r.removed, r.err
}

// fakeProxy is the ZDS server.
type fakeProxy struct{ rec *record }

// Run implements agent.ProxyServer.
func (p *fakeProxy) Run(ctx context.Context) error {
	p.rec.add("zds serves")
	<-ctx.Done()
	p.rec.add("zds stopped")
	return nil
}

// lifecycle is one RunLifecycle under test with fakes for everything.
type lifecycle struct {
	rec     *record
	agent   *fakeAgent
	plugin  *fakePlugin
	removal *fakeRemoval
	cfg     agent.LifecycleConfig
}

func newLifecycle(t *testing.T) *lifecycle {
	t.Helper()
	rec := &record{}
	dir := t.TempDir()
	removal := &fakeRemoval{rec: rec, synced: make(chan struct{})}
	removal.sync()
	return &lifecycle{
		rec: rec, agent: newFakeAgent(rec), plugin: &fakePlugin{rec: rec}, removal: removal,
		cfg: agent.LifecycleConfig{
			PluginSocket: filepath.Join(dir, "cni.sock"),
			ZDSSocket:    filepath.Join(dir, "ztunnel", "ztunnel.sock"),
			MonitorAddr:  freeAddr(t),
		},
	}
}

// start runs the lifecycle; signal cancels its context as SIGTERM does,
// and wait returns its result.
func (l *lifecycle) start(t *testing.T) (signal func(), wait func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- agent.RunLifecycle(ctx, l.cfg, agent.Components{
			Agent: l.agent, Plugin: l.plugin, Removal: l.removal, Proxy: &fakeProxy{rec: l.rec}, Metrics: prometheus.NewRegistry(),
		}, slog.New(slog.DiscardHandler))
	}()
	t.Cleanup(func() { cancel(); <-done })
	var result error
	var once sync.Once
	return cancel, func() error {
		once.Do(func() { result = <-done; done <- result })
		return result
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// assertOrder fails unless every pair's first event came before its
// second, both recorded.
func assertOrder(t *testing.T, got []string, pairs ...[2]string) {
	t.Helper()
	for _, p := range pairs {
		i, j := slices.Index(got, p[0]), slices.Index(got, p[1])
		if i < 0 || j < 0 || i > j {
			t.Errorf("want %q before %q, got %q", p[0], p[1], got)
		}
	}
}

func assertAbsent(t *testing.T, got []string, events ...string) {
	t.Helper()
	for _, e := range events {
		if slices.Contains(got, e) {
			t.Errorf("%q happened, want it not to: %q", e, got)
		}
	}
}

// TestLifecycleStarts: the plugin is installed before anything runs, and
// ZDS is served (its directory created) only once the agent has synced,
// since the node proxy takes the first snapshot as complete; readiness
// follows the sync.
func TestLifecycleStarts(t *testing.T) {
	t.Parallel()
	l := newLifecycle(t)
	l.agent.waitForSync = true
	signal, wait := l.start(t)

	eventually.True(t, "agent and watch run", func() bool { return l.rec.has("agent runs") && l.rec.has("watch runs") })
	if got := l.rec.list()[0]; got != "plugin installed" {
		t.Errorf("first event = %q, want the plugin installed", got)
	}
	if l.rec.has("zds serves") {
		t.Error("ZDS served before the agent synced")
	}
	eventually.True(t, "monitoring port answers", func() bool { return readyz(l.cfg.MonitorAddr) != 0 })
	if got := readyz(l.cfg.MonitorAddr); got != http.StatusServiceUnavailable {
		t.Errorf("/readyz before sync = %d, want 503", got)
	}

	l.agent.sync()
	eventually.True(t, "ZDS served after sync", func() bool { return l.rec.has("zds serves") })
	if _, err := os.Stat(filepath.Dir(l.cfg.ZDSSocket)); err != nil {
		t.Errorf("ZDS socket directory: %v", err)
	}
	if got := readyz(l.cfg.MonitorAddr); got != http.StatusOK {
		t.Errorf("/readyz after sync = %d, want 200", got)
	}
	signal()
	if err := wait(); err != nil {
		t.Errorf("RunLifecycle() = %v, want nil", err)
	}
}

// TestNotReadyUntilUninstallCanBeTold: an agent whose pods are synced is
// still not ready until it watches its DaemonSet: an uninstaller that
// revokes the agent's access first would otherwise leave the plugin in
// every node's chain.
func TestNotReadyUntilUninstallCanBeTold(t *testing.T) {
	t.Parallel()
	l := newLifecycle(t)
	l.removal.synced = make(chan struct{})
	l.removal.syncOnce = sync.Once{}
	signal, wait := l.start(t)
	eventually.True(t, "the agent synced and the monitoring port answers", func() bool {
		return l.rec.has("zds serves") && readyz(l.cfg.MonitorAddr) != 0
	})
	if got := readyz(l.cfg.MonitorAddr); got != http.StatusServiceUnavailable {
		t.Errorf("/readyz before the DaemonSet is watched = %d, want 503", got)
	}
	l.removal.sync()
	if got := readyz(l.cfg.MonitorAddr); got != http.StatusOK {
		t.Errorf("/readyz once the DaemonSet is watched = %d, want 200", got)
	}
	signal()
	if err := wait(); err != nil {
		t.Errorf("RunLifecycle() = %v, want nil", err)
	}
}

// readyz returns the status of /readyz, 0 if it cannot be reached.
func readyz(addr string) int {
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// TestLifecycleStops covers what a SIGTERM does, depending on whether the
// agent's DaemonSet is being deleted.
func TestLifecycleStops(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name       string
		removed    bool
		removedErr error
		wantOrder  [][2]string
		wantAbsent []string
	}{{
		// An upgrade replaces the pod: pods stay enrolled, the plugin
		// stays in the chain (it fails closed, but the next agent is
		// about to answer it).
		name:       "upgrade",
		wantOrder:  [][2]string{{"removal asked", "agent stopped"}, {"removal asked", "watch stopped"}},
		wantAbsent: []string{"plugin removed", "pods un-enrolled"},
	}, {
		name:       "cannot tell",
		removedErr: errors.New("forbidden"),
		wantOrder:  [][2]string{{"removal asked", "agent stopped"}},
		wantAbsent: []string{"plugin removed", "pods un-enrolled"},
	}, {
		// An uninstall: the watch stops before the plugin is removed (or
		// it would put it back); the plugin is removed while the agent's
		// loop still runs; the pods are un-enrolled once the loop and ZDS
		// have stopped (the loop would enroll them again).
		name:    "DaemonSet deleted",
		removed: true,
		wantOrder: [][2]string{
			{"removal asked", "watch stopped"},
			{"watch stopped", "plugin removed"},
			{"plugin removed", "agent stopped"},
			{"agent stopped", "pods un-enrolled"},
			{"zds stopped", "pods un-enrolled"},
		},
	}} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			l := newLifecycle(t)
			l.removal.removed, l.removal.err = tt.removed, tt.removedErr
			signal, wait := l.start(t)
			eventually.True(t, "ZDS served", func() bool { return l.rec.has("zds serves") })
			signal()
			if err := wait(); err != nil {
				t.Errorf("RunLifecycle() = %v, want nil", err)
			}
			got := l.rec.list()
			assertOrder(t, got, tt.wantOrder...)
			assertAbsent(t, got, tt.wantAbsent...)
			for _, e := range []string{"agent stopped", "zds stopped", "watch stopped"} {
				if !slices.Contains(got, e) {
					t.Errorf("%q missing: %q", e, got)
				}
			}
			// The signal has cancelled the caller's context; the
			// question and the clean-up must still get through.
			if l.removal.ctxErr != nil {
				t.Errorf("Removed asked with a done context: %v", l.removal.ctxErr)
			}
			if l.agent.uninstallCtxErr != nil {
				t.Errorf("pods un-enrolled with a done context: %v", l.agent.uninstallCtxErr)
			}
		})
	}
}

func TestLifecycleInstallFailure(t *testing.T) {
	t.Parallel()
	l := newLifecycle(t)
	boom := errors.New("read-only file system")
	l.plugin.installErr = boom
	_, wait := l.start(t)
	if err := wait(); !errors.Is(err, boom) {
		t.Errorf("RunLifecycle() = %v, want %v", err, boom)
	}
	if diff := cmp.Diff([]string{"plugin installed"}, l.rec.list()); diff != "" {
		t.Errorf("events mismatch (-want +got):\n%s", diff)
	}
}

// TestLifecycleNoPrimaryYet: with no primary CNI configuration yet, the
// agent runs and the watch installs the plugin when one appears.
func TestLifecycleNoPrimaryYet(t *testing.T) {
	t.Parallel()
	l := newLifecycle(t)
	l.plugin.installErr = install.ErrNoPrimary
	signal, wait := l.start(t)
	eventually.True(t, "agent and watch run", func() bool { return l.rec.has("agent runs") && l.rec.has("watch runs") })
	signal()
	if err := wait(); err != nil {
		t.Errorf("RunLifecycle() = %v, want nil", err)
	}
}

// TestLifecycleFailingPart: a part that fails ends the lifecycle with its
// error, without taking the node out of the mesh.
func TestLifecycleFailingPart(t *testing.T) {
	t.Parallel()
	l := newLifecycle(t)
	boom := errors.New("informer: forbidden")
	l.agent.runErr = boom
	_, wait := l.start(t)
	if err := wait(); !errors.Is(err, boom) {
		t.Errorf("RunLifecycle() = %v, want %v", err, boom)
	}
	got := l.rec.list()
	assertAbsent(t, got, "removal asked", "plugin removed", "pods un-enrolled", "zds serves")
}

// TestLifecycleUninstall is --uninstall: the plugin out of the chain once
// the agent has found every pod, the agent's loop stopped, then the pods
// un-enrolled; nothing installed, no ZDS.
func TestLifecycleUninstall(t *testing.T) {
	t.Parallel()
	agentErr := errors.New("informer: forbidden")
	pluginErr := errors.New("permission denied")
	for _, tt := range []struct {
		name              string
		runErr, pluginErr error
		want              []string
		wantErr           error
		wantErrText       string
	}{
		{
			name: "ok",
			want: []string{"agent runs", "plugin removed", "agent stopped", "pods un-enrolled"},
		},
		{
			name:        "agent ends before sync",
			runErr:      agentErr,
			want:        []string{"agent runs"},
			wantErr:     agentErr,
			wantErrText: "agent ended before it synced",
		},
		{
			name:        "plugin not removed",
			pluginErr:   pluginErr,
			want:        []string{"agent runs", "plugin removed"},
			wantErr:     pluginErr,
			wantErrText: "remove the plugin",
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			l := newLifecycle(t)
			l.cfg.Uninstall = true
			l.agent.runErr, l.plugin.uninstallErr = tt.runErr, tt.pluginErr
			_, wait := l.start(t)
			err := wait()
			if tt.wantErr == nil && err != nil {
				t.Errorf("RunLifecycle() = %v, want nil", err)
			}
			if tt.wantErr != nil && (!errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.wantErrText)) {
				t.Errorf("RunLifecycle() = %v, want %q wrapping %v", err, tt.wantErrText, tt.wantErr)
			}
			// On an error the agent's loop is stopped as RunLifecycle
			// returns; only the events before it are certain.
			got := slices.DeleteFunc(l.rec.list(), func(e string) bool { return tt.wantErr != nil && e == "agent stopped" })
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("events mismatch (-want +got):\n%s", diff)
			}
		})
	}
}
