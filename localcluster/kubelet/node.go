package kubelet

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/node"
	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NodeInfo describes the Node object a kubelet registers.
type NodeInfo struct {
	Name    string
	IP      string
	PodCIDR string
	// Labels are added to the well-known ones (hostname, os, arch), e.g.
	// topology.kubernetes.io/region and zone.
	Labels         map[string]string
	KubeletVersion string
	// Taints are the taints the node registers with (a kubelet's
	// --register-with-taints); later changes of the node's taints are
	// someone else's.
	Taints []corev1.Taint `json:"taints,omitempty"`
}

// NodeTemplate returns the Node a kubelet registers and keeps up to date.
func NodeTemplate(info NodeInfo) *corev1.Node {
	labels := map[string]string{
		corev1.LabelHostname:   info.Name,
		corev1.LabelOSStable:   runtime.GOOS,
		corev1.LabelArchStable: runtime.GOARCH,
	}
	for k, v := range info.Labels {
		labels[k] = v
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("8"),
		corev1.ResourceMemory: resource.MustParse("16Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: info.Name, Labels: labels},
		Spec:       corev1.NodeSpec{PodCIDR: info.PodCIDR, Taints: info.Taints},
		Status: corev1.NodeStatus{
			Phase:       corev1.NodePending,
			Capacity:    capacity,
			Allocatable: capacity,
			Addresses: []corev1.NodeAddress{
				{Type: corev1.NodeInternalIP, Address: info.IP},
				{Type: corev1.NodeHostName, Address: info.Name},
			},
			NodeInfo: corev1.NodeSystemInfo{
				OperatingSystem:         runtime.GOOS,
				Architecture:            runtime.GOARCH,
				KubeletVersion:          info.KubeletVersion,
				KernelVersion:           kernelRelease(),
				OSImage:                 "canopy-local",
				ContainerRuntimeVersion: "canopy-local://processes",
			},
			Conditions: []corev1.NodeCondition{
				{Type: corev1.NodeReady, Status: corev1.ConditionFalse},
				{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse},
				{Type: corev1.NodeDiskPressure, Status: corev1.ConditionFalse},
				{Type: corev1.NodePIDPressure, Status: corev1.ConditionFalse},
				{Type: corev1.NodeNetworkUnavailable, Status: corev1.ConditionFalse},
			},
		},
	}
	if info.PodCIDR != "" {
		n.Spec.PodCIDRs = []string{info.PodCIDR}
	}
	return n
}

// kernelRelease is the running kernel's release, as uname -r prints it.
func kernelRelease() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// KubeletPort is where the kubelet serves logs and port-forward to the API
// server, as a kubelet does.
const KubeletPort = 10250

// selfSignedServing is the kubelet's serving certificate. The API server
// does not verify kubelets' certificates unless told a CA, so a
// self-signed one serves (as a kubelet without serving-certificate
// bootstrap has).
func selfSignedServing(ip string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "canopy-local-kubelet"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP(ip)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("kubelet serving certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// Run registers the node and runs its pods until ctx ends. The node turns
// Ready once virtual-kubelet's controllers run.
func Run(ctx context.Context, cfg Config, info NodeInfo) error {
	p, err := NewProvider(cfg)
	if err != nil {
		return err
	}
	template := NodeTemplate(info)
	opts := []nodeutil.NodeOpt{
		nodeutil.WithClient(cfg.Client),
		func(c *nodeutil.NodeConfig) error {
			c.NodeSpec = *template
			c.NumWorkers = 4
			// The provider resolves environment references itself, when
			// a container starts: virtual-kubelet's resolution, done
			// before, knows no pod IP and fails on status.podIP.
			c.SkipDownwardAPIResolution = true
			return nil
		},
	}
	if cfg.ClientCAFile != "" {
		serving, err := selfSignedServing(info.IP)
		if err != nil {
			return err
		}
		mux := http.NewServeMux()
		template.Status.DaemonEndpoints.KubeletEndpoint.Port = KubeletPort
		opts = append(opts,
			nodeutil.WithTLSConfig(nodeutil.WithCAFromPath(cfg.ClientCAFile), func(c *tls.Config) error {
				c.Certificates = []tls.Certificate{serving}
				c.ClientAuth = tls.RequireAndVerifyClientCert
				return nil
			}),
			nodeutil.AttachProviderRoutes(mux),
			func(c *nodeutil.NodeConfig) error {
				c.HTTPListenAddr = net.JoinHostPort(info.IP, strconv.Itoa(KubeletPort))
				c.Handler = mux
				return nil
			})
	}
	n, err := nodeutil.NewNode(info.Name,
		func(nodeutil.ProviderConfig) (nodeutil.Provider, node.NodeProvider, error) { return p, nil, nil },
		opts...)
	if err != nil {
		return fmt.Errorf("create virtual-kubelet node: %w", err)
	}
	if err := n.Run(ctx); err != nil && ctx.Err() == nil {
		return fmt.Errorf("run node %s: %w", info.Name, err)
	}
	return nil
}
