// Package trustbundle keeps the node proxy's trusted roots as its root
// bundle file says (the mounted istio-ca-root-cert ConfigMap): read at
// start, re-read when the file changes, so a root rotation reaches the
// proxy without a restart and a root removed from the bundle stops being
// trusted. A bundle that does not parse is refused and the last good one
// kept: a half-written update must not drop every root.
package trustbundle

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// Parse reads every CERTIFICATE block of a PEM bundle; other blocks are
// skipped. A bundle without a certificate is an error.
func Parse(b []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %w", len(out)+1, err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no PEM certificate")
	}
	return out, nil
}

// Bundle is the current set of roots from one file.
type Bundle struct {
	path string
	log  *slog.Logger
	// onChange is called with the new roots after each change.
	onChange func([]*x509.Certificate)

	mu    sync.Mutex
	roots []*x509.Certificate
	sum   [sha256.Size]byte
}

// Load reads the bundle at path; onChange (may be nil) hears of later
// changes found by Run.
func Load(path string, onChange func([]*x509.Certificate), log *slog.Logger) (*Bundle, error) {
	b := &Bundle{path: path, log: log, onChange: onChange}
	if _, err := b.reload(); err != nil {
		return nil, err
	}
	return b, nil
}

// Roots returns the current roots.
func (b *Bundle) Roots() []*x509.Certificate {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.roots
}

// Pool returns the current roots as a pool.
func (b *Bundle) Pool() *x509.CertPool {
	pool := x509.NewCertPool()
	for _, r := range b.Roots() {
		pool.AddCert(r)
	}
	return pool
}

// reload reads the file and reports whether the roots changed.
func (b *Bundle) reload() (bool, error) {
	raw, err := os.ReadFile(b.path)
	if err != nil {
		return false, fmt.Errorf("root bundle %s: %w", b.path, err)
	}
	sum := sha256.Sum256(raw)
	b.mu.Lock()
	same := sum == b.sum
	b.mu.Unlock()
	if same {
		return false, nil
	}
	roots, err := Parse(raw)
	if err != nil {
		return false, fmt.Errorf("root bundle %s: %w", b.path, err)
	}
	b.mu.Lock()
	b.roots, b.sum = roots, sum
	b.mu.Unlock()
	return true, nil
}

// Run re-reads the file every interval until ctx ends. Polling, rather
// than file events, follows a mounted ConfigMap's symlink swap and any
// editor's rename alike; the file is small.
func (b *Bundle) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		changed, err := b.reload()
		if err != nil {
			b.log.Error("root bundle not reloaded; keeping the current roots", "err", err)
			continue
		}
		if changed {
			roots := b.Roots()
			b.log.Info("root bundle changed", "roots", len(roots), "fingerprints", fingerprints(roots))
			if b.onChange != nil {
				b.onChange(roots)
			}
		}
	}
}

func fingerprints(certs []*x509.Certificate) []string {
	out := make([]string, len(certs))
	for i, c := range certs {
		sum := sha256.Sum256(c.Raw)
		out[i] = fmt.Sprintf("%x", sum[:8])
	}
	return out
}

// VerifyServer returns a tls.Config VerifyPeerCertificate for a client
// that checks the server's chain against the bundle's roots at the time
// of each handshake, and its name against serverName. It stands in for
// RootCAs, which a tls.Config reads once.
func (b *Bundle) VerifyServer(serverName string) func(rawCerts [][]byte, _ [][]*x509.Certificate) error {
	return func(rawCerts [][]byte, _ [][]*x509.Certificate) error {
		if len(rawCerts) == 0 {
			return errors.New("server presented no certificate")
		}
		certs := make([]*x509.Certificate, len(rawCerts))
		for i, raw := range rawCerts {
			c, err := x509.ParseCertificate(raw)
			if err != nil {
				return fmt.Errorf("server certificate: %w", err)
			}
			certs[i] = c
		}
		inter := x509.NewCertPool()
		for _, c := range certs[1:] {
			inter.AddCert(c)
		}
		_, err := certs[0].Verify(x509.VerifyOptions{Roots: b.Pool(), Intermediates: inter, DNSName: serverName})
		return err
	}
}
