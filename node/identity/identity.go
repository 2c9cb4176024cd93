// Package identity keeps one certificate per local workload identity for the
// node proxy (docs/wire-contract.md §6.2): an ECDSA P-256 key and CSR, signed
// by the CA with ImpersonatedIdentity, renewed at half-life with jitter,
// retried with backoff, and the old certificate kept until it expires when
// renewal fails. Several trusted roots are held at once, so a root rotation
// never breaks a handshake.
package identity

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	mathrand "math/rand/v2"
	"net/url"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// Signer is the CA as the manager uses it: a CSR in, the chain out (leaf
// first, root last).
type Signer interface {
	Sign(ctx context.Context, csrPEM []byte, id workloadapi.Identity, ttl time.Duration) ([]*x509.Certificate, error)
}

// Cert is one identity's certificate and key.
type Cert struct {
	Identity workloadapi.Identity
	// Chain is the leaf and intermediates, without the root.
	Chain []*x509.Certificate
	Key   *ecdsa.PrivateKey
	// Root is the chain's last certificate as the CA returned it.
	Root *x509.Certificate
}

// NotAfter is when the leaf expires.
func (c *Cert) NotAfter() time.Time { return c.Chain[0].NotAfter }

// TLS returns the certificate for crypto/tls.
func (c *Cert) TLS() *tls.Certificate {
	t := &tls.Certificate{PrivateKey: c.Key, Leaf: c.Chain[0]}
	for _, x := range c.Chain {
		t.Certificate = append(t.Certificate, x.Raw)
	}
	return t
}

// Config tunes a Manager.
type Config struct {
	// TTL is the validity asked for (default 24h).
	TTL time.Duration
	// Roots are the trust anchors known from configuration (the mounted
	// root-cert.pem); roots returned by the CA are added.
	Roots []*x509.Certificate
	// RetryMin and RetryMax bound the backoff after a failed renewal
	// (default 1s and 5m).
	RetryMin, RetryMax time.Duration
	Registerer         prometheus.Registerer
	Now                func() time.Time
}

// Manager holds the certificates of the node's identities.
type Manager struct {
	cfg    Config
	signer Signer
	log    *slog.Logger
	expiry *prometheus.GaugeVec
	wake   chan struct{}

	mu      sync.Mutex
	entries map[workloadapi.Identity]*entry
	// configured are the roots of the bundle file (SetRoots replaces
	// them); the roots of the certificates held are trusted beside them.
	configured []*x509.Certificate
}

type entry struct {
	cert *Cert
	// ready is closed when the first certificate arrives (or fails).
	ready   chan struct{}
	err     error
	refs    int
	renewAt time.Time
	retry   time.Duration
}

// usable: the entry holds a certificate that has not expired at now.
func (e *entry) usable(now time.Time) bool {
	return e.cert != nil && e.cert.NotAfter().After(now)
}

// New returns a Manager.
func New(cfg Config, signer Signer, log *slog.Logger) (*Manager, error) {
	if cfg.TTL <= 0 {
		cfg.TTL = 24 * time.Hour
	}
	if cfg.RetryMin <= 0 {
		cfg.RetryMin = time.Second
	}
	if cfg.RetryMax < cfg.RetryMin {
		cfg.RetryMax = max(5*time.Minute, cfg.RetryMin)
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	expiry := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "canopy_node_certificate_expiry_timestamp_seconds",
		Help: "When each local identity's certificate expires (Unix seconds).",
	}, []string{"identity"})
	if err := cfg.Registerer.Register(expiry); err != nil {
		return nil, err
	}
	return &Manager{cfg: cfg, signer: signer, log: log.With("component", "identity"), expiry: expiry,
		wake: make(chan struct{}, 1), entries: map[workloadapi.Identity]*entry{}, configured: cfg.Roots}, nil
}

// Add keeps id's certificate current until a matching Remove; the first
// Add starts fetching it.
func (m *Manager) Add(id workloadapi.Identity) {
	m.mu.Lock()
	e := m.entries[id]
	if e == nil {
		e = &entry{ready: make(chan struct{})}
		m.entries[id] = e
		go m.fetch(id, e)
	}
	e.refs++
	m.mu.Unlock()
}

// Remove drops one reference; the certificate is forgotten with the last.
func (m *Manager) Remove(id workloadapi.Identity) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.entries[id]; e != nil {
		if e.refs--; e.refs <= 0 {
			delete(m.entries, id)
			m.expiry.DeleteLabelValues(id.String())
		}
	}
}

// Get waits for id's certificate (Add must have been called).
func (m *Manager) Get(ctx context.Context, id workloadapi.Identity) (*Cert, error) {
	m.mu.Lock()
	e := m.entries[id]
	m.mu.Unlock()
	if e == nil {
		return nil, fmt.Errorf("no local workload has identity %s", id)
	}
	select {
	case <-e.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if e.cert == nil {
		return nil, fmt.Errorf("certificate for %s: %w", id, e.err)
	}
	return e.cert, nil
}

// Roots returns a pool of every trusted root: the bundle's, and the root
// each held certificate chains to (during a rotation the CA may sign with
// a root the bundle file has not shown yet).
func (m *Manager) Roots() *x509.CertPool {
	pool := x509.NewCertPool()
	for _, r := range m.TrustedRoots() {
		pool.AddCert(r)
	}
	return pool
}

// TrustedRoots lists the roots Roots holds, without duplicates.
func (m *Manager) TrustedRoots() []*x509.Certificate {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := append([]*x509.Certificate(nil), m.configured...)
	for _, e := range m.entries {
		if e.cert != nil && e.cert.Root != nil && !containsCert(out, e.cert.Root) {
			out = append(out, e.cert.Root)
		}
	}
	return out
}

// SetRoots replaces the bundle's roots (the file changed): new roots are
// trusted from the next handshake, removed ones no longer are, unless a
// held certificate still chains to one.
func (m *Manager) SetRoots(roots []*x509.Certificate) {
	m.mu.Lock()
	m.configured = append([]*x509.Certificate(nil), roots...)
	m.mu.Unlock()
}

// fetch gets a certificate for a new entry.
func (m *Manager) fetch(id workloadapi.Identity, e *entry) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cert, err := m.issue(ctx, id)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.record(id, e, cert, err)
	close(e.ready)
	m.poke()
}

func (m *Manager) poke() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// record stores a (re)issuance outcome; callers hold m.mu.
func (m *Manager) record(id workloadapi.Identity, e *entry, cert *Cert, err error) {
	now := m.cfg.Now()
	if err != nil {
		e.err = err
		e.retry = nextRetry(e.retry, m.cfg.RetryMin, m.cfg.RetryMax)
		e.renewAt = now.Add(e.retry)
		if e.cert != nil && now.After(e.cert.NotAfter()) {
			e.cert = nil // expired: no certificate beats a dead one
		}
		m.log.Warn("certificate request failed; keeping the current one", "identity", id.String(), "err", err, "retry_in", e.retry)
		return
	}
	if !cert.NotAfter().After(now) {
		// An expired leaf (a CA past its own expiry issues those) is no
		// certificate: keep what we have and retry with backoff rather
		// than renewing in a loop.
		m.record(id, e, nil, fmt.Errorf("the CA issued a certificate that expired at %s", cert.NotAfter().UTC().Format(time.RFC3339)))
		return
	}
	e.cert, e.err = cert, nil
	e.renewAt = renewalAt(cert.Chain[0].NotBefore, cert.NotAfter(), now, mathrand.Int64N)
	if e.renewAt.Equal(now) {
		// Valid, but already past its half-life (a CA with little life
		// left, a clock ahead of the CA's): use it and renew soon, backing
		// off so a CA that keeps answering this way is not asked in a loop.
		e.retry = nextRetry(e.retry, m.cfg.RetryMin, m.cfg.RetryMax)
		e.renewAt = now.Add(e.retry)
		m.log.Warn("certificate is past its renewal time when issued", "identity", id.String(),
			"not_after", cert.NotAfter().UTC().Format(time.RFC3339), "retry_in", e.retry)
	} else {
		e.retry = 0
	}
	m.expiry.WithLabelValues(id.String()).Set(float64(cert.NotAfter().Unix()))
}

func containsCert(list []*x509.Certificate, c *x509.Certificate) bool {
	for _, x := range list {
		if x.Equal(c) {
			return true
		}
	}
	return false
}

// Run renews certificates until ctx ends.
func (m *Manager) Run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		next := m.renewDue(ctx)
		wait := time.Hour
		if !next.IsZero() {
			wait = max(next.Sub(m.cfg.Now()), 0)
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-m.wake:
		}
	}
}

// renewDue renews what is due and returns when the next renewal is.
func (m *Manager) renewDue(ctx context.Context) time.Time {
	m.mu.Lock()
	due := map[workloadapi.Identity]*entry{}
	var next time.Time
	now := m.cfg.Now()
	for id, e := range m.entries {
		select {
		case <-e.ready:
		default:
			continue // first fetch in flight
		}
		if !e.renewAt.After(now) {
			due[id] = e
		} else if next.IsZero() || e.renewAt.Before(next) {
			next = e.renewAt
		}
	}
	m.mu.Unlock()
	for id, e := range due {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		cert, err := m.issue(rctx, id)
		cancel()
		m.mu.Lock()
		m.record(id, e, cert, err)
		if next.IsZero() || e.renewAt.Before(next) {
			next = e.renewAt
		}
		m.mu.Unlock()
	}
	return next
}

// issue makes a key and CSR and has the CA sign it; the leaf must hold
// exactly id.
func (m *Manager) issue(ctx context.Context, id workloadapi.Identity) (*Cert, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	uri, err := url.Parse(id.String())
	if err != nil {
		return nil, err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{URIs: []*url.URL{uri}, SignatureAlgorithm: x509.ECDSAWithSHA256}, key)
	if err != nil {
		return nil, fmt.Errorf("create CSR: %w", err)
	}
	chain, err := m.signer.Sign(ctx, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), id, m.cfg.TTL)
	if err != nil {
		return nil, err
	}
	if len(chain) == 0 {
		return nil, errors.New("the CA returned no certificate")
	}
	leaf := chain[0]
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != id.String() {
		return nil, fmt.Errorf("the CA issued %v, want exactly %s", leaf.URIs, id)
	}
	if pub, ok := leaf.PublicKey.(*ecdsa.PublicKey); !ok || !pub.Equal(&key.PublicKey) {
		return nil, errors.New("the CA's certificate is not for the key asked for")
	}
	c := &Cert{Identity: id, Key: key, Chain: chain}
	if len(chain) > 1 {
		c.Root = chain[len(chain)-1]
		c.Chain = chain[:len(chain)-1]
	}
	return c, nil
}

// Has reports whether id has a usable certificate now.
func (m *Manager) Has(id workloadapi.Identity) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.entries[id]
	return e != nil && e.usable(m.cfg.Now())
}

// Missing is the number of identities asked for (Add) that have no
// usable certificate now: not issued yet, refused, or expired without a
// renewal. A node proxy is ready to take over its pods' traffic only when
// it is 0.
func (m *Manager) Missing() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, e := range m.entries {
		if !e.usable(m.cfg.Now()) {
			n++
		}
	}
	return n
}

// Current returns the certificates held now, one per identity that has
// one.
func (m *Manager) Current() []*Cert {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*Cert
	for _, e := range m.entries {
		if e.cert != nil {
			out = append(out, e.cert)
		}
	}
	return out
}
