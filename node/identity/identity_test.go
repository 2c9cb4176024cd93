package identity

import (
	"context"
	"crypto/x509"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/canopy-mesh/canopy/ca/pki"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/node/caclient"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// ca signs with a real authority; fail makes it refuse, and lie makes it
// sign another identity.
type ca struct {
	mu    sync.Mutex
	auth  *pki.Authority
	now   func() time.Time
	fail  bool
	lie   bool
	calls int
}

func (c *ca) Sign(_ context.Context, csrPEM []byte, id workloadapi.Identity, ttl time.Duration) ([]*x509.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	if c.fail {
		return nil, errors.New("CA unavailable")
	}
	if c.lie {
		id.ServiceAccount = "someone-else"
	}
	csr, err := pki.ParseCSR(csrPEM)
	if err != nil {
		return nil, err
	}
	chain, err := c.auth.Sign(csr, id, ttl, c.now())
	if err != nil {
		return nil, err
	}
	return caclient.ParseChain(chain)
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

var web = workloadapi.Identity{TrustDomain: "cluster.local", Namespace: "apps", ServiceAccount: "web"}

func setup(t *testing.T) (*Manager, *ca, *clock, *prometheus.Registry) {
	t.Helper()
	clk := &clock{t: time.Now()}
	auth, err := pki.NewSelfSigned("cluster.local", 0, clk.now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	signer := &ca{auth: auth, now: clk.now}
	reg := prometheus.NewRegistry()
	m, err := New(Config{TTL: time.Hour, RetryMin: time.Millisecond, RetryMax: 4 * time.Millisecond, Registerer: reg, Now: clk.now}, signer, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return m, signer, clk, reg
}

func TestIssueAndRenew(t *testing.T) {
	m, signer, clk, reg := setup(t)
	m.Add(web)
	first, err := m.Get(t.Context(), web)
	if err != nil {
		t.Fatal(err)
	}
	if got := first.Chain[0].URIs[0].String(); got != "spiffe://cluster.local/ns/apps/sa/web" {
		t.Errorf("leaf identity %s", got)
	}
	if first.Root == nil || !m.Roots().Equal(rootsOf(first.Root)) {
		t.Error("the CA's root is not trusted")
	}
	if v := testutil.ToFloat64(m.expiry.WithLabelValues(web.String())); v != float64(first.NotAfter().Unix()) {
		t.Errorf("expiry metric %v", v)
	}
	_ = reg

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go m.Run(ctx)

	// Past half-life: renewed.
	clk.add(40 * time.Minute)
	m.poke()
	eventually.True(t, "renewed at half-life", func() bool {
		c, _ := m.Get(t.Context(), web)
		return c != nil && c != first
	})

	// Renewal failing: the current certificate stays, retried with backoff.
	cur, _ := m.Get(t.Context(), web)
	signer.mu.Lock()
	signer.fail = true
	before := signer.calls
	signer.mu.Unlock()
	clk.add(40 * time.Minute)
	m.poke()
	eventually.True(t, "retried", func() bool {
		clk.add(5 * time.Millisecond) // the backoff runs on the fake clock
		m.poke()
		signer.mu.Lock()
		defer signer.mu.Unlock()
		return signer.calls >= before+2
	})
	if c, err := m.Get(t.Context(), web); err != nil || c != cur {
		t.Errorf("during failed renewals Get = %v, %v; want the current certificate", c, err)
	}
	// Once it has expired it is dropped rather than served.
	clk.add(time.Hour)
	m.poke()
	eventually.True(t, "expired certificate dropped", func() bool { _, err := m.Get(t.Context(), web); return err != nil })

	// The CA comes back: a new certificate.
	signer.mu.Lock()
	signer.fail = false
	signer.mu.Unlock()
	eventually.True(t, "recovered", func() bool {
		clk.add(5 * time.Millisecond)
		m.poke()
		c, err := m.Get(t.Context(), web)
		return err == nil && c.NotAfter().After(clk.now())
	})

	m.Remove(web)
	if _, err := m.Get(t.Context(), web); err == nil {
		t.Error("Get after the last Remove succeeded")
	}
}

func TestWrongIdentityIsRefused(t *testing.T) {
	m, signer, _, _ := setup(t)
	signer.lie = true
	m.Add(web)
	if _, err := m.Get(t.Context(), web); err == nil {
		t.Fatal("a certificate for another identity was accepted")
	}
}

// TestMissing: an identity counts as missing (and Has says no) until its
// certificate is issued, through a CA outage and the retries after it.
func TestMissing(t *testing.T) {
	m, signer, clk, _ := setup(t)
	if got := m.Missing(); got != 0 {
		t.Fatalf("Missing() with no identity = %d", got)
	}
	signer.mu.Lock()
	signer.fail = true
	signer.mu.Unlock()
	m.Add(web)
	if _, err := m.Get(t.Context(), web); err == nil {
		t.Fatal("a certificate while the CA refuses")
	}
	if got := m.Missing(); got != 1 || m.Has(web) {
		t.Errorf("after a refusal: Missing() = %d, want 1; Has = %v", got, m.Has(web))
	}
	signer.mu.Lock()
	signer.fail = false
	signer.mu.Unlock()
	go m.Run(t.Context())
	// The retry is due on the manager's clock, which the test moves.
	eventually.True(t, "the retry issues the certificate", func() bool {
		clk.add(time.Second)
		m.poke()
		return m.Missing() == 0
	})
	if !m.Has(web) {
		t.Error("the certificate is issued: Has says no")
	}
	m.Remove(web)
	if got := m.Missing(); got != 0 {
		t.Errorf("Missing() after Remove = %d", got)
	}
}

func rootsOf(c *x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(c)
	return p
}

// An expired CA issues leaves that expired before they were valid; the
// manager must refuse them (no certificate, a clear error), retry with
// backoff rather than in a loop, and never panic.
func TestExpiredCAIssuesNothingUsable(t *testing.T) {
	m, signer, clk, _ := setup(t)
	expired, err := pki.NewSelfSigned("cluster.local", time.Hour, clk.now().Add(-3*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	signer.mu.Lock()
	signer.auth = expired
	signer.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go m.Run(ctx)
	m.Add(web)
	_, err = m.Get(ctx, web)
	if err == nil || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("Get = %v, want an error about an expired certificate", err)
	}
	// RetryMax is 4 ms: in 200 ms a loop would ask thousands of times,
	// backoff about fifty.
	time.Sleep(200 * time.Millisecond)
	signer.mu.Lock()
	calls := signer.calls
	signer.mu.Unlock()
	if calls > 100 {
		t.Errorf("the CA was asked %d times in 200ms: renewal is looping", calls)
	}
}

// TestSetRoots: the bundle's roots are replaced, not added to; the root a
// held certificate chains to stays trusted beside them.
func TestSetRoots(t *testing.T) {
	m, signer, clk, _ := setup(t)
	other, err := pki.NewSelfSigned("cluster.local", 0, clk.now())
	if err != nil {
		t.Fatal(err)
	}
	m.SetRoots([]*x509.Certificate{other.Cert})
	if got := m.TrustedRoots(); len(got) != 1 || !got[0].Equal(other.Cert) {
		t.Fatalf("trusted after SetRoots: %d roots", len(got))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go m.Run(ctx)
	m.Add(web)
	if _, err := m.Get(ctx, web); err != nil {
		t.Fatal(err)
	}
	signer.mu.Lock()
	caRoot := signer.auth.Cert
	signer.mu.Unlock()
	if got := m.TrustedRoots(); len(got) != 2 || !got[1].Equal(caRoot) {
		t.Fatalf("with a certificate held: %d roots, want the bundle's and the CA's", len(got))
	}
	m.SetRoots(nil)
	if got := m.TrustedRoots(); len(got) != 1 || !got[0].Equal(caRoot) {
		t.Errorf("after the bundle dropped its root: %d roots, want only the held certificate's", len(got))
	}
}
