package controlplane_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/canopy-mesh/canopy/internal/testing/canopy"
	"github.com/canopy-mesh/canopy/internal/testing/ci"
	"github.com/canopy-mesh/canopy/internal/testing/istiod"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
)

const (
	// systemNamespace is istiod's namespace and both control planes'
	// root namespace.
	systemNamespace = "istio-system"
	// canopyNamespace holds Canopy's CA Secret and root ConfigMap.
	canopyNamespace = "canopy-system"
	// startTimeout bounds each controller's start until it is ready.
	startTimeout = 3 * time.Minute
	// idleTimeout bounds each wait for the controllers to be at rest.
	idleTimeout = 2 * time.Minute
)

// Push tuning, the same for both controllers. Both wait for the tables to
// be unchanged for debounceQuiet before pushing, and push at the latest
// debounceMax after the first change: canopy-controller's defaults
// (--push-quiet, --push-max-delay); istiod's PILOT_DEBOUNCE_AFTER default
// is the same 100 ms, its PILOT_DEBOUNCE_MAX (default 10 s) is set to
// 1 s. istiod debounces endpoint changes too (PILOT_ENABLE_EDS_DEBOUNCE,
// default on), as Canopy does.
const (
	debounceQuiet = "100ms"
	debounceMax   = "1s"
)

// keep reports whether logs are to be kept even when the benchmark
// passes, as the test environment's are (CANOPY_TESTENV_KEEP).
func keep() bool {
	v, err := strconv.ParseBool(os.Getenv(testenv.EnvKeep))
	return err == nil && v
}

// side is one control plane under comparison, as its clients and the
// benchmark see it.
type side struct {
	name string
	pid  int
	// dial connects a proxy of namespace ns and service account account
	// (clientAccount or podAccount) and returns the headers its streams
	// carry.
	dial func(ns, account string) (*grpc.ClientConn, metadata.MD, error)
	// metricsURL and connectedMetric give the number of open xDS
	// streams.
	metricsURL, connectedMetric string
	logPath                     string
	exited                      func() (bool, error)
	// debugAddr serves canopy-controller's debug views, when profiles
	// are asked for (profile_test.go).
	debugAddr string
}

// connected is the number of xDS streams the side has open.
func (s *side) connected(ctx context.Context) (int, error) {
	v, err := gauge(ctx, s.metricsURL, s.connectedMetric)
	return int(v), err
}

// alive fails when the side's process has ended.
func (s *side) alive() error {
	if done, err := s.exited(); done {
		return fmt.Errorf("%s exited (%v); log: %s", s.name, err, s.logPath)
	}
	return nil
}

// controlPlanes are canopy-controller and istiod watching one API server
// that holds a mesh.
type controlPlanes struct {
	env    *testenv.Environment
	istio  istioclient.Interface
	mesh   mesh
	canopy *side
	istiod *side
}

// sides returns both sides, canopy first in even rounds and istiod first
// in odd ones, so that neither always runs on a machine the other has
// just loaded.
func (cp *controlPlanes) sides(round int) []*side {
	if round%2 == 0 {
		return []*side{cp.canopy, cp.istiod}
	}
	return []*side{cp.istiod, cp.canopy}
}

// startControlPlanes starts a test environment, writes m to it and runs
// both controllers against it, until b ends. canopy-controller is built
// from the tree while the mesh is written. Logs land in a directory that
// is removed unless b fails.
func startControlPlanes(b *testing.B, m mesh) *controlPlanes {
	b.Helper()
	ctx := b.Context()
	bins, err := istiod.FindBinaries("")
	if errors.Is(err, istiod.ErrUnavailable) {
		ci.Unavailable(b, "%v", err)
	} else if err != nil {
		b.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "canopy-bench-controlplane-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if b.Failed() || keep() {
			b.Logf("controller logs kept in %s", dir)
			return
		}
		os.RemoveAll(dir)
	})

	built := make(chan error, 1)
	canopyBin := ""
	go func() {
		var err error
		canopyBin, err = canopy.Build(ctx, dir)
		built <- err
	}()

	start := time.Now()
	env, err := testenv.Start(ctx, testenv.Options{
		// The EndpointSlice controller writes a slice per Service; at
		// its default 20 requests per second it would take a minute.
		ControllerManagerArgs: []string{"--kube-api-qps=1000", "--kube-api-burst=2000"},
	})
	if errors.Is(err, testenv.ErrUnavailable) {
		<-built
		ci.Unavailable(b, "%v", err)
	} else if err != nil {
		<-built
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := env.Stop(b.Failed() || keep()); err != nil {
			b.Errorf("stop test environment: %v", err)
		}
		if b.Failed() || keep() {
			b.Logf("test environment logs kept in %s", env.Dir())
		}
	})
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS = -1 // no client-side limit: the fixture writes in bursts
	istio, err := istioclient.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	for ns, labels := range map[string]map[string]string{systemNamespace: {"topology.istio.io/network": "net-1"}, canopyNamespace: nil} {
		if _, err := env.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: labels}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	if err := m.write(ctx, env.Client, istio); err != nil {
		<-built
		b.Fatalf("write the mesh: %v", err)
	}
	b.Logf("mesh of %d Services, %d endpoints and %d client pods written in %s", m.Services, m.Services*m.EndpointsPerService, m.Clients, time.Since(start).Round(100*time.Millisecond))
	if err := <-built; err != nil {
		b.Fatal(err)
	}

	start = time.Now()
	args := []string{
		"--push-quiet=" + debounceQuiet, "--push-max-delay=" + debounceMax,
		// Admission limits are not what is measured: 100 clients
		// connect at once, ten per service account.
		"--xds-streams-per-second=0", "--xds-max-streams-per-caller=0",
	}
	debugAddr := ""
	if profileDir() != "" {
		if debugAddr, err = freeLoopbackAddr(); err != nil {
			b.Fatal(err)
		}
		args = append(args, "--debug-addr="+debugAddr)
	}
	cc, err := canopy.Start(canopy.Options{Binary: canopyBin, Kubeconfig: env.KubeconfigPath, CANamespace: canopyNamespace, Dir: dir, ID: "canopy-bench",
		Args: args})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := cc.Stop(); err != nil {
			b.Errorf("stop canopy-controller: %v", err)
		}
	})
	ref, err := istiod.Start(ctx, istiod.Options{Binary: bins.PilotDiscovery, Kubeconfig: env.KubeconfigPath, Namespace: systemNamespace, Dir: dir,
		StartTimeout: startTimeout,
		Env: []string{
			"PILOT_DEBOUNCE_AFTER=" + debounceQuiet, "PILOT_DEBOUNCE_MAX=" + debounceMax,
			// Its default admits 25 streams per second on 2 cores (and
			// refuses those that wait over a second); effectively off,
			// as Canopy's is.
			"PILOT_MAX_REQUESTS_PER_SECOND=100000",
		}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := ref.Stop(); err != nil {
			b.Errorf("stop istiod: %v", err)
		}
	})
	if err := cc.WaitReady(ctx, startTimeout); err != nil {
		b.Fatal(err)
	}
	b.Logf("both controllers ready in %s", time.Since(start).Round(100*time.Millisecond))

	roots, err := canopy.RootPool(ctx, env.Client, canopyNamespace, time.Minute)
	if err != nil {
		b.Fatal(err)
	}
	tokens := map[string]string{} // namespace/account → token
	for n := range m.Namespaces {
		ns := m.namespace(n)
		for _, sa := range []string{clientAccount, podAccount} {
			if tokens[ns+"/"+sa], err = env.Token(ctx, ns, sa, testenv.TokenOptions{Audiences: []string{"istio-ca"}, Expiration: 2 * time.Hour}); err != nil {
				b.Fatal(err)
			}
		}
	}
	cp := &controlPlanes{env: env, istio: istio, mesh: m}
	cp.canopy = &side{
		name: "canopy", pid: cc.PID(), logPath: cc.LogPath, exited: cc.Exited, debugAddr: debugAddr,
		metricsURL: "http://" + cc.MonitoringAddr + "/metrics", connectedMetric: "canopy_xds_connected_proxies",
		dial: func(ns, account string) (*grpc.ClientConn, metadata.MD, error) {
			token, ok := tokens[ns+"/"+account]
			if !ok {
				return nil, nil, fmt.Errorf("no token for %s/%s", ns, account)
			}
			conn, err := cc.Dial(roots, canopyNamespace)
			return conn, metadata.Pairs("authorization", "Bearer "+token, "clusterid", "Kubernetes"), err
		},
	}
	cp.istiod = &side{
		name: "istiod", pid: ref.PID(), logPath: ref.LogPath, exited: ref.Exited,
		metricsURL: "http://" + ref.MonitoringAddr + "/metrics", connectedMetric: "pilot_xds",
		// The plaintext port authenticates nobody.
		dial: func(string, string) (*grpc.ClientConn, metadata.MD, error) {
			conn, err := grpc.NewClient(ref.XDSAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			return conn, metadata.MD{}, err
		},
	}
	took, err := waitIdle(ctx, idleTimeout, cp.canopy.pid, cp.istiod.pid)
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("both controllers at rest after another %s", took.Round(100*time.Millisecond))
	return cp
}
