package proxy

import (
	"context"
	"crypto/x509"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/canopy-mesh/canopy/ca/pki"
	"github.com/canopy-mesh/canopy/cni/redirect"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/nettest"
	"github.com/canopy-mesh/canopy/internal/workloadtable"
	"github.com/canopy-mesh/canopy/node/caclient"
	"github.com/canopy-mesh/canopy/node/identity"
	"github.com/canopy-mesh/canopy/node/inpod"
	"github.com/canopy-mesh/canopy/workloadapi"
	"github.com/canopy-mesh/canopy/workloadapi/security"
)

// signer signs with a real authority, as the CA would.
type signer struct{ auth *pki.Authority }

func (s signer) Sign(_ context.Context, csrPEM []byte, id workloadapi.Identity, ttl time.Duration) ([]*x509.Certificate, error) {
	csr, err := pki.ParseCSR(csrPEM)
	if err != nil {
		return nil, err
	}
	chain, err := s.auth.Sign(csr, id, ttl, time.Now())
	if err != nil {
		return nil, err
	}
	return caclient.ParseChain(chain)
}

func resource(t *testing.T, typeURL, name string, m proto.Message) *discoveryv3.Resource {
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return &discoveryv3.Resource{Name: name, Resource: &anypb.Any{TypeUrl: typeURL, Value: b}}
}

func workload(uid, sa string, ip netip.Addr) *workloadapi.Workload {
	return &workloadapi.Workload{Uid: uid, Name: sa, Namespace: "apps", ServiceAccount: sa, Addresses: [][]byte{ip.AsSlice()},
		TunnelProtocol: workloadapi.TunnelProtocol_HBONE, Status: workloadapi.WorkloadStatus_HEALTHY, TrustDomain: "cluster.local"}
}

// packets counts TCP packets to a port arriving in a netns (nft counter).
func packets(t *testing.T, ns string, port int) int {
	out := nettest.In(t, ns, func() ([]byte, error) {
		return exec.Command("nft", "list", "chain", "inet", "canopy-test", "count").CombinedOutput()
	})
	m := regexp.MustCompile(`iifname != "lo" tcp dport ` + strconv.Itoa(port) + ` counter packets (\d+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("no counter for %d in\n%s", port, out)
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

// TestPodToPodThroughHBONE: two enrolled pods, each with the proxy's
// sockets, talk through HBONE with mTLS; what crosses the link is TLS to
// 15008, never the app's plaintext port; policies decide by the client's
// SPIFFE identity.
// mesh is two enrolled pods (client and server) on a veth pair, served
// by one proxy, with an echo app on the server's 8080.
type mesh struct {
	pair               nettest.Pair
	clientNS, serverNS string
	clientW, serverW   *workloadapi.Workload
	table              *workloadtable.Table
	auth               *pki.Authority
	proxy              *Proxy
	reg                *prometheus.Registry
	// pods are the proxy's presence in each namespace, by path.
	pods map[string]*inpod.Pod
	// peers receives the address each app connection came from.
	peers chan string
}

// newMesh builds the mesh; configure runs on the proxy before it serves
// the pods.
func newMesh(t *testing.T, subnet string, configure ...func(*Proxy)) *mesh {
	t.Helper()
	return newMeshOn(t, nettest.NewPair(t, netip.MustParsePrefix(subnet)), configure...)
}

// newMeshOn builds the mesh on a pair; the pods of a dual-stack pair are
// dual-stack workloads and the app listens on both families.
func newMeshOn(t *testing.T, pair nettest.Pair, configure ...func(*Proxy)) *mesh {
	t.Helper()
	m := &mesh{pair: pair, clientNS: pair.A, serverNS: pair.B, pods: map[string]*inpod.Pod{}, peers: make(chan string, 64)}
	for _, ns := range []string{m.clientNS, m.serverNS} {
		if err := (redirect.Nftables{}).Enroll(ns, redirect.DefaultPodConfig()); err != nil {
			t.Fatal(err)
		}
	}
	// Count what arrives at the server pod, before any capture.
	script := "table inet canopy-test {\n chain count {\n  type filter hook prerouting priority -400; policy accept;\n  iifname != \"lo\" tcp dport 8080 counter\n  iifname != \"lo\" tcp dport 15008 counter\n }\n}\n"
	if out := nettest.In(t, m.serverNS, func() ([]byte, error) {
		cmd := exec.Command("nft", "-f", "-")
		cmd.Stdin = strings.NewReader(script)
		return cmd.CombinedOutput()
	}); len(out) > 0 {
		t.Fatalf("nft: %s", out)
	}

	var err error
	if m.auth, err = pki.NewSelfSigned("cluster.local", 0, time.Now().Add(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	m.clientW, m.serverW = workload("c", "client", pair.AddrA), workload("s", "server", pair.AddrB)
	if pair.AddrA6.IsValid() {
		m.clientW.Addresses = append(m.clientW.Addresses, pair.AddrA6.AsSlice())
		m.serverW.Addresses = append(m.serverW.Addresses, pair.AddrB6.AsSlice())
	}
	m.table = workloadtable.New()
	m.table.Apply(workloadapi.AddressTypeURL, []*discoveryv3.Resource{
		resource(t, workloadapi.AddressTypeURL, "c", &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: m.clientW}}),
		resource(t, workloadapi.AddressTypeURL, "s", &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: m.serverW}}),
	}, nil)
	m.proxy, m.reg, m.pods = m.newProxy(t, configure...)
	// The server app echoes, on each family the pair has.
	networks := []string{"tcp4"}
	if pair.AddrB6.IsValid() {
		networks = append(networks, "tcp6")
	}
	for _, network := range networks {
		app := nettest.In(t, m.serverNS, func() (net.Listener, error) { return net.Listen(network, ":8080") })
		t.Cleanup(func() { app.Close() })
		go m.echo(app)
	}
	return m
}

// newProxy starts a node proxy serving both pods, with its own
// certificates, metrics and in-pod listeners; a second call is a second
// proxy on the node beside the first, as during an upgrade. configure
// runs on it before it serves the pods.
func (m *mesh) newProxy(t *testing.T, configure ...func(*Proxy)) (*Proxy, *prometheus.Registry, map[string]*inpod.Pod) {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	certs, err := identity.New(identity.Config{}, signer{m.auth}, log)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []*workloadapi.Workload{m.clientW, m.serverW} {
		certs.Add(workloadapi.WorkloadIdentity(w))
	}
	reg := prometheus.NewRegistry()
	p, err := New(m.table, certs, "Kubernetes", reg, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	go p.Run(t.Context())
	for _, f := range configure {
		f(p)
	}
	pods := map[string]*inpod.Pod{}
	for _, x := range []struct {
		ns string
		w  *workloadapi.Workload
	}{{m.clientNS, m.clientW}, {m.serverNS, m.serverW}} {
		f, err := os.Open(x.ns)
		if err != nil {
			t.Fatal(err)
		}
		pod, err := inpod.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pod.Close() })
		pods[x.ns] = pod
		p.ServePod(pod, x.w)
	}
	return p, reg, pods
}

// echo serves an echo app on l, reporting each client's address.
func (m *mesh) echo(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		select {
		case m.peers <- c.RemoteAddr().(*net.TCPAddr).IP.String():
		default:
		}
		go func() { _, _ = io.Copy(c, c); c.Close() }()
	}
}

// waitIdle waits until the proxy holds no open inbound connection.
func (m *mesh) waitIdle(t *testing.T) {
	t.Helper()
	eventually.True(t, "no open inbound connection", func() bool {
		m.proxy.live.mu.Lock()
		defer m.proxy.live.mu.Unlock()
		return len(m.proxy.live.m) == 0
	})
}

// call sends a message from the client pod to the server's echo app and
// returns the answer.
func (m *mesh) call(t *testing.T) (string, error) {
	return m.send(t, m.clientNS, m.pair.AddrB.String()+":8080", "hello through the mesh")
}

// send connects from inside ns to addr, writes msg, half-closes and reads
// the answer to the end.
func (m *mesh) send(t *testing.T, ns, addr, msg string) (string, error) {
	t.Helper()
	type dialed struct {
		c   net.Conn
		err error
	}
	d := nettest.In(t, ns, func() (dialed, error) {
		c, err := net.DialTimeout("tcp", addr, 3*time.Second)
		return dialed{c, err}, nil
	})
	if d.err != nil {
		return "", d.err
	}
	c := d.c
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(msg)); err != nil {
		return "", err
	}
	_ = c.(*net.TCPConn).CloseWrite()
	b, err := io.ReadAll(c)
	return string(b), err
}

func TestPodToPodThroughHBONE(t *testing.T) {
	m := newMesh(t, "10.221.0.0/24")
	p, table, pair, serverNS, peers := m.proxy, m.table, m.pair, m.serverNS, m.peers
	call := func() (string, error) { return m.call(t) }

	t.Run("echo crosses as TLS to 15008 only", func(t *testing.T) {
		got, err := call()
		if err != nil || got != "hello through the mesh" {
			t.Fatalf("echo = %q, %v", got, err)
		}
		if n := packets(t, serverNS, 8080); n != 0 {
			t.Errorf("%d packets to the app port crossed the link", n)
		}
		if n := packets(t, serverNS, 15008); n == 0 {
			t.Error("no packets to 15008")
		}
		if got := <-peers; got != pair.AddrA.String() {
			t.Errorf("the app saw the connection from %s, want the client pod %s", got, pair.AddrA)
		}
	})

	t.Run("both ends count the connection with identities", func(t *testing.T) {
		count := func(reporter, peer string) float64 {
			return testutil.ToFloat64(p.metrics.sent.WithLabelValues(reporter, "", "apps", "spiffe://cluster.local/ns/apps/sa/client",
				"", "apps", "spiffe://cluster.local/ns/apps/sa/server", "tcp", "-", peer))
		}
		deadline := time.Now().Add(5 * time.Second)
		for count("destination", "mutual_tls") == 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if got := count("source", "mutual_tls"); got < float64(len("hello through the mesh")) {
			t.Errorf("source sent bytes = %v", got)
		}
		if got := count("destination", "mutual_tls"); got < float64(len("hello through the mesh")) {
			t.Errorf("destination sent bytes = %v", got)
		}
	})

	allowOnly := func(principal string) {
		pol := &security.Authorization{Name: "only", Namespace: "apps", Scope: security.Scope_NAMESPACE, Action: security.Action_ALLOW,
			Rules: []*security.Rule{{Clauses: []*security.Clause{{Matches: []*security.Match{{Principals: []*security.StringMatch{
				{MatchType: &security.StringMatch_Exact{Exact: principal}}}}}}}}}}
		table.Apply(workloadapi.AuthorizationTypeURL, []*discoveryv3.Resource{resource(t, workloadapi.AuthorizationTypeURL, "apps/only", pol)}, nil)
	}
	t.Run("ALLOW by the client's SPIFFE identity", func(t *testing.T) {
		allowOnly("cluster.local/ns/apps/sa/client")
		if got, err := call(); got != "hello through the mesh" {
			t.Errorf("allowed call = %q, %v", got, err)
		}
	})
	t.Run("another identity is denied", func(t *testing.T) {
		// The last call's stream may still be closing on the server side;
		// the policy below would close it too and count a second DENY.
		m.waitIdle(t)
		denied := p.metrics.closed.WithLabelValues("destination", "", "apps", "spiffe://cluster.local/ns/apps/sa/client",
			"", "apps", "spiffe://cluster.local/ns/apps/sa/server", "tcp", "DENY", "mutual_tls")
		before := testutil.ToFloat64(denied)
		allowOnly("cluster.local/ns/apps/sa/someone-else")
		if got, _ := call(); got != "" {
			t.Errorf("denied call echoed %q", got)
		}
		// The refusal is counted before the client sees the stream close.
		if got := testutil.ToFloat64(denied) - before; got != 1 {
			t.Errorf("closed connections with response_flags DENY grew by %v, want 1", got)
		}
	})

	t.Run("after the server's GOAWAY the pool reconnects", func(t *testing.T) {
		allowOnly("cluster.local/ns/apps/sa/client")
		inbound := func() int {
			p.mu.Lock()
			defer p.mu.Unlock()
			return len(p.inbound)
		}
		if inbound() == 0 {
			t.Fatal("no inbound HBONE connection to drain")
		}
		// What a draining destination proxy does to them.
		p.mu.Lock()
		for sc := range p.inbound {
			sc.GoAway()
		}
		p.mu.Unlock()
		deadline := time.Now().Add(5 * time.Second)
		for inbound() != 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := inbound(); n != 0 {
			t.Fatalf("%d inbound HBONE connections left after the drain", n)
		}
		if got, err := call(); got != "hello through the mesh" {
			t.Errorf("call after the drain = %q, %v", got, err)
		}
	})
}
