package canopy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/canopy-mesh/canopy/ca/rootcm"
	"github.com/canopy-mesh/canopy/internal/testing/childproc"
)

// pkg is canopy-controller's main package.
const pkg = "github.com/canopy-mesh/canopy/cmd/canopy-controller"

// Build compiles canopy-controller from the tree into dir and returns the
// binary's path. It must run inside the Canopy module (go test's working
// directory is).
func Build(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "canopy-controller")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
		return "", fmt.Errorf("build canopy-controller: %w\n%s", err, out)
	}
	return bin, nil
}

// Options configure Start.
type Options struct {
	// Binary is what Build returned. Required.
	Binary string
	// Kubeconfig is an admin kubeconfig of the API server. Required.
	Kubeconfig string
	// CANamespace holds the CA's Secret and is where the controller's
	// root ConfigMap is read from by Dial; it must exist. Required.
	CANamespace string
	// Dir holds the log, canopy-controller.log, and the (absent) plug-in
	// CA directory, so that the controller signs with a self-signed root
	// of its own. Required.
	Dir string
	// ID is the controller's name in proxy status; default
	// canopy-under-test.
	ID string
	// Args are further flags, after the defaults (a later flag wins),
	// e.g. "--push-quiet=20ms".
	Args []string
}

// Controller is a running canopy-controller.
type Controller struct {
	// SecureAddr serves the CA and xDS over TLS.
	SecureAddr string
	// MonitoringAddr serves /readyz and /metrics.
	MonitoringAddr string
	// LogPath is the controller's combined output.
	LogPath string

	proc *childproc.Process
}

// Start runs the controller. It does not wait until it is ready: see
// Ready and WaitReady.
func Start(opts Options) (*Controller, error) {
	if opts.Binary == "" || opts.Kubeconfig == "" || opts.CANamespace == "" || opts.Dir == "" {
		return nil, errors.New("canopy: Binary, Kubeconfig, CANamespace and Dir are required")
	}
	if opts.ID == "" {
		opts.ID = "canopy-under-test"
	}
	addrs, err := freeAddrs(2)
	if err != nil {
		return nil, err
	}
	c := &Controller{SecureAddr: addrs[0], MonitoringAddr: addrs[1], LogPath: filepath.Join(opts.Dir, "canopy-controller.log")}
	args := append([]string{"--kubeconfig=" + opts.Kubeconfig, "--monitoring-addr=" + c.MonitoringAddr, "--debug-addr=",
		"--secure-addr=" + c.SecureAddr, "--webhook-addr=", "--ca-namespace=" + opts.CANamespace,
		"--cacerts-dir=" + filepath.Join(opts.Dir, "cacerts"), "--id=" + opts.ID}, opts.Args...)
	cmd := exec.Command(opts.Binary, args...)
	cmd.SysProcAttr = sysProcAttr()
	if c.proc, err = childproc.Start("canopy-controller", cmd, c.LogPath); err != nil {
		return nil, err
	}
	return c, nil
}

// PID is the controller's process ID, e.g. to read its memory from /proc.
func (c *Controller) PID() int { return c.proc.Cmd.Process.Pid }

// Ready checks /readyz once.
func (c *Controller) Ready(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.MonitoringAddr+"/readyz", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/readyz: %s", resp.Status)
	}
	return nil
}

// WaitReady polls Ready until it succeeds, the controller exits or
// timeout passes; the error then carries the log's tail.
func (c *Controller) WaitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return c.proc.WaitFor(ctx, 100*time.Millisecond, c.Ready)
}

// Exited reports whether the controller has ended, and how.
func (c *Controller) Exited() (bool, error) { return c.proc.Exited() }

// Stop ends the controller: SIGTERM, then SIGKILL after five seconds.
func (c *Controller) Stop() error { return c.proc.Stop(5 * time.Second) }

// RootPool waits (up to timeout) until the controller has published its
// root certificate in namespace ns and returns it as a pool.
func RootPool(ctx context.Context, client kubernetes.Interface, ns string, timeout time.Duration) (*x509.CertPool, error) {
	var root *corev1.ConfigMap
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		var err error
		root, err = client.CoreV1().ConfigMaps(ns).Get(ctx, rootcm.ConfigMapName, metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		return nil, fmt.Errorf("wait for the root ConfigMap %s/%s: %w", ns, rootcm.ConfigMapName, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(root.Data[rootcm.Key])) {
		return nil, fmt.Errorf("no certificate in ConfigMap %s/%s", ns, rootcm.ConfigMapName)
	}
	return pool, nil
}

// Credentials verify the controller of CA namespace ns with roots, under
// the name its serving certificate carries.
func Credentials(roots *x509.CertPool, ns string) credentials.TransportCredentials {
	return credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: "canopy-controller." + ns + ".svc", MinVersion: tls.VersionTLS12})
}

// Dial connects (lazily, as grpc.NewClient does) to the controller's TLS
// port with Credentials.
func (c *Controller) Dial(roots *x509.CertPool, ns string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	return grpc.NewClient(c.SecureAddr, append([]grpc.DialOption{grpc.WithTransportCredentials(Credentials(roots, ns))}, opts...)...)
}

// freeAddrs finds n free loopback TCP addresses. They are free when
// returned, not reserved.
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
