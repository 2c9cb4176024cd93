package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/canopy-mesh/canopy/ca/pki"
	"github.com/canopy-mesh/canopy/internal/sockmap"
	"github.com/canopy-mesh/canopy/node/dns"
	"github.com/canopy-mesh/canopy/node/proxy"
)

func TestParseFlags(t *testing.T) {
	dir := t.TempDir()
	a, err := pki.NewSelfSigned("cluster.local", 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "root-cert.pem")
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(root, pki.EncodeCertificates(a.Roots...), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(token, []byte("t"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"--root-cert=" + root, "--token=" + token, "--node-name=n1", "--pod-name=z", "--pod-namespace=istio-system", "--instance-ip=10.0.0.3"}
	c, err := parseFlags(base)
	if err != nil {
		t.Fatal(err)
	}
	if c.caAddr != c.xdsAddr || c.serverName != "canopy-controller.istio-system.svc" || len(c.roots) != 1 || c.limits != proxy.DefaultLimits() {
		t.Errorf("defaults: %+v", c)
	}
	if !c.dnsProxy || c.clusterDomain != "cluster.local" || c.dnsLimits != dns.DefaultLimits() {
		t.Errorf("DNS defaults: proxy %v, domain %q, limits %+v", c.dnsProxy, c.clusterDomain, c.dnsLimits)
	}
	if c.bpfRoot != sockmap.DefaultRoot {
		t.Errorf("--bpf-root defaults to %q, want %q", c.bpfRoot, sockmap.DefaultRoot)
	}
	if c, err := parseFlags(append(append([]string{}, base...), "--bpf-root=")); err != nil || c.bpfRoot != "" {
		t.Errorf("--bpf-root= : %q, %v; want empty (no socket maps)", c.bpfRoot, err)
	}
	// On demand, the table is too partial to answer from: DNS is off
	// unless asked for, which is an error.
	if c, err := parseFlags(append(append([]string{}, base...), "--on-demand")); err != nil || c.dnsProxy {
		t.Errorf("--on-demand: DNS proxy %v, %v; want off", c.dnsProxy, err)
	}
	t.Setenv("ISTIO_META_DNS_CAPTURE", "False")
	if c, err := parseFlags(base); err != nil || c.dnsProxy {
		t.Errorf("ISTIO_META_DNS_CAPTURE=False: DNS proxy %v, %v; want off", c.dnsProxy, err)
	}
	for _, tt := range []struct {
		extra []string
		want  string
	}{
		{[]string{"--xds-address=nohost"}, "--xds-address"},
		{[]string{"--instance-ip=x"}, "--instance-ip"},
		{[]string{"--node-name="}, "--node-name is required"},
		{[]string{"--root-cert=" + filepath.Join(dir, "none")}, "--root-cert"},
		{[]string{"--root-cert=" + token}, "no PEM certificate"},
		{[]string{"--token=" + filepath.Join(dir, "none")}, "--token"},
		{[]string{"--cert-ttl=1s"}, "--cert-ttl"},
		{[]string{"--log-level=loud"}, "--log-level"},
		{[]string{"--handshake-timeout=0s"}, "--handshake-timeout must be positive"},
		{[]string{"--on-demand-timeout=-1s"}, "--on-demand-timeout must be positive"},
		{[]string{"--max-connections-per-pod=0"}, "--max-connections-per-pod"},
		{[]string{"--max-pending-handshakes=0"}, "--max-pending-handshakes"},
		{[]string{"--max-pending-handshakes-per-source=-1"}, "--max-pending-handshakes-per-source"},
		{[]string{"--hbone-idle-timeout=0s"}, "--hbone-idle-timeout must be positive"},
		{[]string{"--dns-max-in-flight=0"}, "--dns-max-in-flight"},
		{[]string{"--on-demand", "--dns-proxy"}, "not with --on-demand"},
		{[]string{"--bpf-root=sys/fs/bpf"}, "--bpf-root"},
	} {
		if _, err := parseFlags(append(append([]string{}, base...), tt.extra...)); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("parseFlags(%v) = %v, want an error containing %q", tt.extra, err, tt.want)
		}
	}
}
