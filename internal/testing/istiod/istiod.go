package istiod

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/canopy-mesh/canopy/internal/testing/childproc"
)

// Options configure Start.
type Options struct {
	// Binary is pilot-discovery; empty means FindBinaries("").
	Binary string
	// Kubeconfig is an admin kubeconfig of the API server istiod watches.
	Kubeconfig string
	// Namespace is istiod's own namespace (POD_NAMESPACE), which must
	// exist; default istio-system. It is also where istiod reads the
	// network label.
	Namespace string
	// Dir is istiod's working directory: its mesh configuration and its
	// log, istiod.log. Required (a test's t.TempDir()).
	Dir string
	// MeshConfig is the mesh configuration (YAML); empty means Istio's
	// defaults (root namespace istio-system, trust domain cluster.local).
	MeshConfig string
	// ClusterID is istiod's cluster; default Kubernetes.
	ClusterID string
	// Env holds extra environment variables (NAME=value), applied after
	// the defaults, e.g. to turn an Istio feature flag on.
	Env []string
	// StartTimeout bounds each start attempt until istiod is ready;
	// default 90s (istiod waits for every informer to sync).
	StartTimeout time.Duration
}

// Istiod is a running pilot-discovery.
type Istiod struct {
	// XDSAddr is the plaintext gRPC port (15010's counterpart): ADS
	// without authentication.
	XDSAddr string
	// HTTPAddr serves /ready and istiod's /debug/ views.
	HTTPAddr string
	// MonitoringAddr serves /metrics.
	MonitoringAddr string
	// LogPath is istiod's combined output.
	LogPath string

	proc *childproc.Process
}

// defaultEnv turns on ambient mode and off everything that writes to the
// cluster beyond what serving xDS needs: the CA (and with it the root
// ConfigMaps and istiod's own serving certificate), the webhook patchers,
// injection and leader election (one istiod runs).
func defaultEnv(namespace string) []string {
	return []string{
		"PILOT_ENABLE_AMBIENT=true",
		"POD_NAMESPACE=" + namespace,
		"POD_NAME=istiod-reference",
		"ENABLE_CA_SERVER=false",
		"PILOT_CERT_PROVIDER=none",
		"ENABLE_LEADER_ELECTION=false",
		"INJECT_ENABLED=false",
		"INJECTION_WEBHOOK_CONFIG_NAME=",
		"VALIDATION_WEBHOOK_CONFIG_NAME=",
	}
}

// Start runs istiod and waits until its /ready answers 200. Ports are free
// ones on loopback; since they are found, not reserved, a start that loses
// a port to another process is tried again (three attempts).
func Start(ctx context.Context, opts Options) (*Istiod, error) {
	if opts.Kubeconfig == "" || opts.Dir == "" {
		return nil, errors.New("istiod: Kubeconfig and Dir are required")
	}
	if opts.Binary == "" {
		b, err := FindBinaries("")
		if err != nil {
			return nil, err
		}
		opts.Binary = b.PilotDiscovery
	}
	if opts.Namespace == "" {
		opts.Namespace = "istio-system"
	}
	if opts.ClusterID == "" {
		opts.ClusterID = "Kubernetes"
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 90 * time.Second
	}
	mesh := filepath.Join(opts.Dir, "mesh.yaml")
	networks := filepath.Join(opts.Dir, "meshNetworks.yaml")
	if err := os.WriteFile(mesh, []byte(opts.MeshConfig), 0o644); err != nil {
		return nil, fmt.Errorf("write mesh config: %w", err)
	}
	if err := os.WriteFile(networks, []byte("networks: {}\n"), 0o644); err != nil {
		return nil, fmt.Errorf("write mesh networks: %w", err)
	}
	const attempts = 3
	var err error
	for i := 1; i <= attempts; i++ {
		var d *Istiod
		if d, err = start(ctx, opts, mesh, networks); err == nil {
			return d, nil
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, err
}

func start(ctx context.Context, opts Options, mesh, networks string) (*Istiod, error) {
	addrs, err := freeAddrs(3)
	if err != nil {
		return nil, err
	}
	d := &Istiod{XDSAddr: addrs[0], HTTPAddr: addrs[1], MonitoringAddr: addrs[2], LogPath: filepath.Join(opts.Dir, "istiod.log")}
	cmd := exec.Command(opts.Binary, "discovery",
		"--kubeconfig="+opts.Kubeconfig,
		"--meshConfig="+mesh,
		"--networksConfig="+networks,
		"--clusterID="+opts.ClusterID,
		"--grpcAddr="+d.XDSAddr,
		"--httpAddr="+d.HTTPAddr,
		"--monitoringAddr="+d.MonitoringAddr,
		// No TLS xDS and no webhook server: both need istiod's own
		// certificate, which comes from the CA that is off.
		"--secureGRPCAddr=",
		"--httpsAddr=",
	)
	cmd.Dir = opts.Dir
	cmd.Env = append(append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + opts.Dir}, defaultEnv(opts.Namespace)...), opts.Env...)
	cmd.SysProcAttr = sysProcAttr()
	if d.proc, err = childproc.Start("istiod", cmd, d.LogPath); err != nil {
		return nil, err
	}
	if err := d.waitReady(ctx, opts.StartTimeout); err != nil {
		_ = d.Stop()
		return nil, err
	}
	return d, nil
}

func (d *Istiod) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	client := &http.Client{Timeout: 2 * time.Second}
	return d.proc.WaitFor(ctx, 200*time.Millisecond, func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+d.HTTPAddr+"/ready", nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/ready: %s", resp.Status)
		}
		return nil
	})
}

// PID is istiod's process ID, e.g. to read its memory from /proc.
func (d *Istiod) PID() int { return d.proc.Cmd.Process.Pid }

// Exited reports whether istiod has ended, and how.
func (d *Istiod) Exited() (bool, error) { return d.proc.Exited() }

// Stop ends istiod: SIGTERM, then SIGKILL after five seconds. Istio drains
// for its --shutdownDuration; a test has nothing to drain.
func (d *Istiod) Stop() error { return d.proc.Stop(5 * time.Second) }

// freeAddrs finds n free loopback TCP addresses.
func freeAddrs(n int) ([]string, error) {
	var addrs []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		addrs = append(addrs, l.Addr().String())
		defer l.Close()
	}
	return addrs, nil
}
