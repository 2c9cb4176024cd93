package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// baseControllers are the kube-controller-manager controllers every
// Environment runs: what a mesh control plane's inputs depend on, nothing
// that needs a kubelet, a scheduler or a cloud.
const baseControllers = "endpointslice,endpointslicemirroring,serviceaccount,serviceaccount-token," +
	"namespace,garbagecollector,deployment,replicaset"

// Options configure an Environment. The zero value starts everything on
// loopback.
type Options struct {
	// BinDir holds kube-apiserver and kube-controller-manager. Empty means
	// what internal/tools finds ($CANOPY_KUBE_BIN_DIR, else hack/tools.sh).
	BinDir string
	// Etcd is the etcd binary. Empty means $CANOPY_ETCD, else etcd on PATH.
	Etcd string
	// BindAddress is the address every component listens on; default
	// 127.0.0.1. A local cluster whose nodes live in other network
	// namespaces sets a host address they can reach.
	BindAddress string
	// ServiceClusterIPRange is the Service VIP range; default 10.96.0.0/16.
	ServiceClusterIPRange string
	// Dir holds the components' state and logs. Empty means a new temporary
	// directory, removed by Stop unless logs are kept.
	Dir string
	// ExtraControllers are run besides the base set, e.g. "daemonset" for
	// a cluster with kubelets.
	ExtraControllers []string
	// ControllerManagerArgs are extra kube-controller-manager flags, e.g.
	// "--kube-api-qps=500" for a benchmark that creates thousands of
	// objects (the default of 20 writes per second would make the
	// EndpointSlice controller its bottleneck).
	ControllerManagerArgs []string
	// APIServerArgs are extra kube-apiserver flags.
	APIServerArgs []string
	// Detached starts the components as long-lived processes in their own
	// session that outlive the caller (a local cluster's "up"); otherwise
	// the kernel kills them when the caller dies.
	Detached bool
	// StartTimeout bounds the whole start; default 60s.
	StartTimeout time.Duration
	// Log receives lifecycle messages; default discards them.
	Log *slog.Logger
}

// Environment is a running control plane. Its exported fields are set by
// Start and must not be changed.
type Environment struct {
	// Config is an admin (system:masters) client configuration. Copy it
	// before changing it: rest.CopyConfig.
	Config *rest.Config
	// Client is an admin clientset.
	Client kubernetes.Interface
	// KubeconfigPath is an admin kubeconfig file, for tools and child
	// processes.
	KubeconfigPath string
	// ServiceAccountIssuer is the issuer of service-account tokens.
	ServiceAccountIssuer string
	// KubeletClientCA is the CA (PEM file) of the client certificate the
	// API server presents to kubelets; kubelets require it.
	KubeletClientCA string

	dir        string
	removeDir  bool
	log        *slog.Logger
	procs      []*process // in start order
	detached   bool
	etcdClient string // etcd client URL
	spawn      *spawner
}

// Process is a running component.
type Process struct {
	Name string
	PID  int
}

// Processes returns the components in start order, so that a caller that
// outlives them (a local cluster's state file) can stop them later.
func (e *Environment) Processes() []Process {
	out := make([]Process, 0, len(e.procs))
	for _, p := range e.procs {
		out = append(out, Process{Name: p.Name, PID: p.Cmd.Process.Pid})
	}
	return out
}

// Start runs etcd, kube-apiserver and kube-controller-manager, installs the
// CRDs of the chart (deploy/charts/canopy/crds), and returns when the API server is ready, serves the
// CRDs and the controllers have created the default service account. On error everything started is stopped again. An error
// that wraps ErrUnavailable means a prerequisite is missing.
func Start(ctx context.Context, opts Options) (_ *Environment, err error) {
	opts = withDefaults(opts)
	bins, err := findBinaries(opts)
	if err != nil {
		return nil, err
	}
	e := &Environment{dir: opts.Dir, log: opts.Log, detached: opts.Detached, spawn: newSpawner()}
	if e.dir == "" {
		if e.dir, err = os.MkdirTemp("", "canopy-testenv-"); err != nil {
			return nil, fmt.Errorf("create state directory: %w", err)
		}
		e.removeDir = true
	} else if err := os.MkdirAll(e.dir, 0o755); err != nil {
		return nil, fmt.Errorf("create state directory: %w", err)
	}
	defer func() {
		if err != nil {
			if stopErr := e.stop(true); stopErr != nil {
				err = errors.Join(err, stopErr)
			}
			err = fmt.Errorf("%w (state and logs kept in %s)", err, e.dir)
		}
	}()

	ctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()
	ports, err := freePorts(opts.BindAddress, 3)
	if err != nil {
		return nil, err
	}
	if err := e.startEtcd(ctx, bins.etcd, opts.BindAddress, ports[0], ports[1]); err != nil {
		return nil, err
	}
	if err := e.startAPIServer(ctx, bins.apiserver, opts, ports[2]); err != nil {
		return nil, err
	}
	if err := installCRDs(ctx, e.Config); err != nil {
		return nil, fmt.Errorf("install CRDs: %w", err)
	}
	controllers := strings.Join(append([]string{baseControllers}, opts.ExtraControllers...), ",")
	if err := e.startControllerManager(ctx, bins.controllerManager, controllers, opts.ControllerManagerArgs); err != nil {
		return nil, err
	}
	e.log.Info("test environment ready", "server", e.Config.Host, "dir", e.dir)
	return e, nil
}

func withDefaults(o Options) Options {
	if o.BindAddress == "" {
		o.BindAddress = "127.0.0.1"
	}
	if o.ServiceClusterIPRange == "" {
		o.ServiceClusterIPRange = "10.96.0.0/16"
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = 60 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return o
}

// Dir returns the directory of the components' state and logs
// (<component>.log).
func (e *Environment) Dir() string { return e.dir }

// Stop ends every component, the last started first. It removes the state
// directory if Start created it, unless keepLogs is set.
func (e *Environment) Stop(keepLogs bool) error { return e.stop(keepLogs) }

func (e *Environment) stop(keepLogs bool) error {
	var errs []error
	for i := len(e.procs) - 1; i >= 0; i-- {
		if err := e.procs[i].Stop(10 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	e.procs = nil
	if e.spawn != nil {
		e.spawn.close()
		e.spawn = nil
	}
	if e.removeDir && !keepLogs {
		if err := os.RemoveAll(e.dir); err != nil {
			errs = append(errs, fmt.Errorf("remove state directory: %w", err))
		}
	}
	return errors.Join(errs...)
}

func (e *Environment) start(name, path string, args ...string) (*process, error) {
	var p *process
	var err error
	e.spawn.do(func() { p, err = startProcess(name, path, filepath.Join(e.dir, name+".log"), e.detached, args...) })
	if err != nil {
		return nil, err
	}
	e.procs = append(e.procs, p)
	e.log.Debug("started component", "component", name, "pid", p.Cmd.Process.Pid)
	return p, nil
}

func (e *Environment) startEtcd(ctx context.Context, path, host string, clientPort, peerPort int) error {
	e.etcdClient = "http://" + net.JoinHostPort(host, strconv.Itoa(clientPort))
	peer := "http://" + net.JoinHostPort(host, strconv.Itoa(peerPort))
	p, err := e.start("etcd", path,
		"--name=canopy",
		"--data-dir="+filepath.Join(e.dir, "etcd"),
		"--listen-client-urls="+e.etcdClient,
		"--advertise-client-urls="+e.etcdClient,
		"--listen-peer-urls="+peer,
		"--initial-advertise-peer-urls="+peer,
		"--initial-cluster=canopy="+peer,
	)
	if err != nil {
		return err
	}
	client := &http.Client{Timeout: time.Second}
	return p.WaitFor(ctx, 100*time.Millisecond, func(ctx context.Context) error {
		return httpOK(ctx, client, e.etcdClient+"/health", nil)
	})
}

func (e *Environment) startAPIServer(ctx context.Context, path string, opts Options, port int) error {
	keyPath, pubPath, err := writeServiceAccountKeys(e.dir)
	if err != nil {
		return err
	}
	token, tokenFile, err := writeAdminToken(e.dir)
	if err != nil {
		return err
	}
	certDir := filepath.Join(e.dir, "apiserver")
	kubeletCA, kubeletCert, kubeletKey, err := writeKubeletClientCredentials(e.dir)
	if err != nil {
		return err
	}
	e.KubeletClientCA = kubeletCA
	e.ServiceAccountIssuer = "https://kubernetes.default.svc.cluster.local"
	p, err := e.start("kube-apiserver", path, append([]string{
		"--etcd-servers=" + e.etcdClient,
		"--bind-address=" + opts.BindAddress,
		"--advertise-address=" + opts.BindAddress,
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + certDir,
		"--token-auth-file=" + tokenFile,
		"--authorization-mode=RBAC",
		"--service-account-key-file=" + pubPath,
		"--service-account-signing-key-file=" + keyPath,
		"--service-account-issuer=" + e.ServiceAccountIssuer,
		"--service-cluster-ip-range=" + opts.ServiceClusterIPRange,
		"--allow-privileged=true",
		"--kubelet-client-certificate=" + kubeletCert,
		"--kubelet-client-key=" + kubeletKey,
		// Nodes' host names resolve nowhere here.
		"--kubelet-preferred-address-types=InternalIP",
		// With no kubelets and a loopback address there is nothing for
		// the "kubernetes" Service's endpoints to point at; newer
		// releases refuse a loopback advertise address without this.
		"--endpoint-reconciler-type=none",
		"--profiling=false",
	}, opts.APIServerArgs...)...)
	if err != nil {
		return err
	}

	// The serving certificate appears in cert-dir while the server starts;
	// until then, readiness is polled without verification (the token is
	// not sent).
	host := "https://" + net.JoinHostPort(opts.BindAddress, strconv.Itoa(port))
	insecure := &http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: insecureTLS()}}
	if err := p.WaitFor(ctx, 100*time.Millisecond, func(ctx context.Context) error {
		return httpOK(ctx, insecure, host+"/readyz", nil)
	}); err != nil {
		return err
	}
	caData, err := os.ReadFile(filepath.Join(certDir, "apiserver.crt"))
	if err != nil {
		return fmt.Errorf("read API server certificate: %w", err)
	}
	e.Config = &rest.Config{
		Host:            host,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: caData},
		QPS:             -1, // tests create objects in bursts; no client-side limit
	}
	if e.Client, err = kubernetes.NewForConfig(e.Config); err != nil {
		return fmt.Errorf("admin client: %w", err)
	}
	// Verify the real, verified path end to end once.
	if err := p.WaitFor(ctx, 100*time.Millisecond, func(ctx context.Context) error {
		body, err := e.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			return err
		}
		if string(body) != "ok" {
			return fmt.Errorf("readyz: %s", body)
		}
		return nil
	}); err != nil {
		return err
	}
	e.KubeconfigPath = filepath.Join(e.dir, "admin.kubeconfig")
	return writeKubeconfig(e.KubeconfigPath, e.Config)
}

func (e *Environment) startControllerManager(ctx context.Context, path, controllers string, extra []string) error {
	args := append([]string{
		"--kubeconfig=" + e.KubeconfigPath,
		"--controllers=" + controllers,
		"--service-account-private-key-file=" + filepath.Join(e.dir, "sa.key"),
		"--root-ca-file=" + filepath.Join(e.dir, "apiserver", "apiserver.crt"),
		"--leader-elect=false",
		"--secure-port=0",
	}, extra...)
	p, err := e.start("kube-controller-manager", path, args...)
	if err != nil {
		return err
	}
	// The serviceaccount controller creating default/default shows the
	// controllers run and can write.
	return p.WaitFor(ctx, 100*time.Millisecond, func(ctx context.Context) error {
		_, err := e.Client.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return errors.New("service account default/default not created yet")
		}
		return err
	})
}

// ConfigWithToken returns a copy of the admin configuration that
// authenticates with token instead, e.g. a service account's.
func (e *Environment) ConfigWithToken(token string) *rest.Config {
	c := rest.AnonymousClientConfig(e.Config)
	c.BearerToken = token
	return c
}

func writeKubeconfig(path string, c *rest.Config) error {
	const name = "canopy-testenv"
	kc := clientcmdapi.NewConfig()
	kc.Clusters[name] = &clientcmdapi.Cluster{Server: c.Host, CertificateAuthorityData: c.CAData}
	kc.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: c.BearerToken}
	kc.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
	kc.CurrentContext = name
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	return nil
}

func httpOK(ctx context.Context, c *http.Client, url string, header http.Header) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

// freePorts returns n distinct free TCP ports on host. The ports are free
// when returned, not reserved: another process could take one before the
// component binds it, which Start reports as a component failure.
func freePorts(host string, n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, fmt.Errorf("find a free port on %s: %w", host, err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
