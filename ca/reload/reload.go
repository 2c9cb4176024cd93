// Package reload keeps the CA's key material current while the
// controller runs: it re-reads the CA's Secret (or the plug-in directory)
// every period and, when what it finds differs and loads, hands the new
// Authority to the parts that sign, serve TLS and publish the trust
// bundle. A root rotation (docs/wire-contract.md §6.4) then needs no
// restart. Material that does not load is refused and the current CA
// kept: a half-edited Secret must not stop signing.
package reload

import (
	"bytes"
	"context"
	"crypto/x509"
	"log/slog"
	"sync"
	"time"

	"github.com/canopy-mesh/canopy/ca/pki"
)

// Loader reads the CA's material as it is now.
type Loader func(ctx context.Context, now time.Time) (*pki.Authority, error)

// Watcher holds the current Authority.
type Watcher struct {
	load   Loader
	period time.Duration
	log    *slog.Logger

	mu   sync.Mutex
	cur  *pki.Authority
	subs []func(*pki.Authority)
	// failing records that the last check failed, so one failure is
	// logged once, not every period.
	failing bool
}

// New returns a Watcher starting from initial.
func New(initial *pki.Authority, load Loader, period time.Duration, log *slog.Logger) *Watcher {
	return &Watcher{load: load, period: period, log: log.With("component", "ca-reload"), cur: initial}
}

// Current returns the Authority in use.
func (w *Watcher) Current() *pki.Authority {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cur
}

// OnChange registers f, called with each new Authority in registration
// order. Register before Run.
func (w *Watcher) OnChange(f func(*pki.Authority)) {
	w.mu.Lock()
	w.subs = append(w.subs, f)
	w.mu.Unlock()
}

// Check loads the material once and switches to it if it changed; it
// reports whether it did.
func (w *Watcher) Check(ctx context.Context, now time.Time) (bool, error) {
	next, err := w.load(ctx, now)
	w.mu.Lock()
	if err != nil {
		first := !w.failing
		w.failing = true
		w.mu.Unlock()
		if first {
			w.log.Error("CA material changed but does not load; signing with the current CA", "err", err)
		}
		return false, err
	}
	w.failing = false
	if Same(w.cur, next) {
		w.mu.Unlock()
		return false, nil
	}
	w.cur = next
	subs := append([](func(*pki.Authority)){}, w.subs...)
	w.mu.Unlock()
	_, notAfter := next.Validity()
	w.log.Info("CA changed", "signing", fingerprint(next.Cert), "roots", len(next.Roots), "not_after", notAfter)
	for _, f := range subs {
		f(next)
	}
	return true, nil
}

// Run checks every period until ctx ends.
func (w *Watcher) Run(ctx context.Context) error {
	t := time.NewTicker(w.period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		_, _ = w.Check(ctx, time.Now())
	}
}

// Same reports whether two Authorities sign with the same certificate and
// chain and distribute the same roots. (The key follows the certificate:
// pki.Load checks they match.)
func Same(a, b *pki.Authority) bool {
	return a != nil && b != nil && sameCerts([]*x509.Certificate{a.Cert}, []*x509.Certificate{b.Cert}) &&
		sameCerts(a.Chain, b.Chain) && sameCerts(a.Roots, b.Roots)
}

func sameCerts(a, b []*x509.Certificate) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i].Raw, b[i].Raw) {
			return false
		}
	}
	return true
}

func fingerprint(c *x509.Certificate) string {
	if c == nil {
		return ""
	}
	return c.SerialNumber.Text(16)
}
