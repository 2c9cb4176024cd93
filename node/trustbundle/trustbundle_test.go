package trustbundle

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/canopy-mesh/canopy/ca/pki"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
)

func newCA(t *testing.T) *pki.Authority {
	t.Helper()
	a, err := pki.NewSelfSigned("cluster.local", 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestParse(t *testing.T) {
	a, b := newCA(t), newCA(t)
	for _, tt := range []struct {
		name    string
		in      string
		want    int
		wantErr string
	}{
		{"one", string(pki.EncodeCertificates(a.Cert)), 1, ""},
		{"two, with a key block between", string(pki.EncodeCertificates(a.Cert)) + "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n" + string(pki.EncodeCertificates(b.Cert)), 2, ""},
		{"empty", "", 0, "no PEM certificate"},
		{"garbage", "not pem", 0, "no PEM certificate"},
		{"a broken certificate", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", 0, "certificate 1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Parse = %v, want an error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || len(got) != tt.want {
				t.Fatalf("Parse = %d certificates, %v; want %d", len(got), err, tt.want)
			}
		})
	}
}

// TestRotation: the file changes from the old root to both and then to
// the new one; each change reaches onChange and the server check, and a
// broken update keeps the last good bundle.
func TestRotation(t *testing.T) {
	oldCA, newCA := newCA(t), newCA(t)
	path := filepath.Join(t.TempDir(), "root-cert.pem")
	write := func(b []byte) {
		// As a ConfigMap volume does: a new file renamed into place.
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write(pki.EncodeCertificates(oldCA.Cert))
	changes := make(chan int, 8)
	b, err := Load(path, func(r []*x509.Certificate) { changes <- len(r) }, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go b.Run(ctx, 10*time.Millisecond)

	serverFrom := func(a *pki.Authority) error { return handshake(t, a, b) }
	if err := serverFrom(oldCA); err != nil {
		t.Fatalf("server of the old root: %v", err)
	}
	if err := serverFrom(newCA); err == nil {
		t.Fatal("a server of a root not in the bundle was accepted")
	}

	write(append(pki.EncodeCertificates(oldCA.Cert), pki.EncodeCertificates(newCA.Cert)...))
	if n := <-changes; n != 2 {
		t.Fatalf("after adding the new root, %d roots", n)
	}
	if err := serverFrom(newCA); err != nil {
		t.Fatalf("server of the new root during the rotation: %v", err)
	}

	write([]byte("-----BEGIN CERTIFICATE-----\ntruncated"))
	time.Sleep(50 * time.Millisecond)
	if got := len(b.Roots()); got != 2 {
		t.Fatalf("a broken update left %d roots, want the last good 2", got)
	}

	write(pki.EncodeCertificates(newCA.Cert))
	eventually.True(t, "the old root is dropped", func() bool { return len(b.Roots()) == 1 })
	if err := serverFrom(oldCA); err == nil {
		t.Error("a server of the removed root is still accepted")
	}
	if err := serverFrom(newCA); err != nil {
		t.Errorf("server of the new root after the rotation: %v", err)
	}
}

// handshake runs a TLS handshake against a server whose certificate a
// issued, the client checking it with the bundle.
func handshake(t *testing.T, a *pki.Authority, b *Bundle) error {
	t.Helper()
	cert, err := a.IssueServing([]string{"canopy-controller.istio-system.svc"}, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	sc, cc := net.Pipe()
	defer sc.Close()
	defer cc.Close()
	go func() {
		_ = tls.Server(sc, &tls.Config{Certificates: []tls.Certificate{*cert}}).Handshake()
		sc.Close()
	}()
	client := tls.Client(cc, &tls.Config{ServerName: "canopy-controller.istio-system.svc", InsecureSkipVerify: true,
		VerifyPeerCertificate: b.VerifyServer("canopy-controller.istio-system.svc")})
	return client.Handshake()
}
