package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/canopy-mesh/canopy/workloadapi"
)

var now = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

func csrPEM(t testing.TB, key crypto.Signer, uris ...string) []byte {
	t.Helper()
	tmpl := &x509.CertificateRequest{Subject: pkix.Name{CommonName: "ignored"}}
	for _, u := range uris {
		parsed, _ := url.Parse(u)
		tmpl.URIs = append(tmpl.URIs, parsed)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

func p256(t testing.TB) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func verifyLeaf(t *testing.T, chain []string, roots []*x509.Certificate) *x509.Certificate {
	t.Helper()
	var certs []*x509.Certificate
	for i, p := range chain {
		if !strings.HasSuffix(p, "\n") {
			t.Errorf("chain element %d does not end in a newline", i)
		}
		c, err := ParseCertificates([]byte(p))
		if err != nil || len(c) != 1 {
			t.Fatalf("chain element %d: %v", i, err)
		}
		certs = append(certs, c[0])
	}
	pool, inter := x509.NewCertPool(), x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("leaf does not verify: %v", err)
	}
	if last := certs[len(certs)-1]; !isSelfSigned(last) {
		t.Error("chain does not end with the root")
	}
	return certs[0]
}

func TestSelfSignedIssuesSPIFFECertificates(t *testing.T) {
	ca, err := NewSelfSigned("cluster.local", 0, now)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := ParseCSR(csrPEM(t, p256(t), "spiffe://cluster.local/ns/kube-system/sa/admin"))
	if err != nil {
		t.Fatal(err)
	}
	id := workloadapi.Identity{TrustDomain: "cluster.local", Namespace: "shop", ServiceAccount: "web"}
	chain, err := ca.Sign(csr, id, DefaultTTL, now)
	if err != nil {
		t.Fatal(err)
	}
	if len(chain) != 2 {
		t.Fatalf("chain has %d certificates, want leaf and root", len(chain))
	}
	leaf := verifyLeaf(t, chain, ca.Roots)
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != id.String() {
		t.Errorf("leaf URIs = %v, want only %s (never the CSR's)", leaf.URIs, id)
	}
	if len(leaf.DNSNames)+len(leaf.EmailAddresses)+len(leaf.IPAddresses) != 0 || leaf.Subject.CommonName != "" {
		t.Errorf("leaf carries names besides the SPIFFE ID: %+v", leaf.Subject)
	}
	if got := leaf.NotAfter.Sub(now); got != DefaultTTL {
		t.Errorf("lifetime = %s, want %s", got, DefaultTTL)
	}
	if leaf.IsCA {
		t.Error("leaf is a CA")
	}
}

func TestSignNeverOutlivesTheCA(t *testing.T) {
	ca, err := NewSelfSigned("cluster.local", time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	csr, _ := ParseCSR(csrPEM(t, p256(t)))
	chain, err := ca.Sign(csr, workloadapi.Identity{TrustDomain: "cluster.local", Namespace: "a", ServiceAccount: "b"}, MaxTTL, now)
	if err != nil {
		t.Fatal(err)
	}
	leaf := verifyLeaf(t, chain, ca.Roots)
	if leaf.NotAfter.After(ca.Cert.NotAfter) {
		t.Errorf("leaf expires %s, after its CA (%s)", leaf.NotAfter, ca.Cert.NotAfter)
	}
}

func TestPlugInIntermediate(t *testing.T) {
	root, err := NewSelfSigned("cluster.local", 0, now)
	if err != nil {
		t.Fatal(err)
	}
	interKey := p256(t)
	serial, _ := randomSerial()
	interDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: "intermediate"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(365 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}, root.Cert, interKey.Public(), root.Key)
	if err != nil {
		t.Fatal(err)
	}
	interPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: interDER})
	keyPEM, _ := EncodeKey(interKey)
	rootPEM := EncodeCertificates(root.Cert)

	ca, err := Load(interPEM, keyPEM, nil, rootPEM, now)
	if err != nil {
		t.Fatal(err)
	}
	csr, _ := ParseCSR(csrPEM(t, p256(t)))
	chain, err := ca.Sign(csr, workloadapi.Identity{TrustDomain: "cluster.local", Namespace: "a", ServiceAccount: "b"}, DefaultTTL, now)
	if err != nil {
		t.Fatal(err)
	}
	if len(chain) != 3 {
		t.Fatalf("chain has %d certificates, want leaf, intermediate, root", len(chain))
	}
	verifyLeaf(t, chain, ca.Roots)

	other, _ := NewSelfSigned("cluster.local", 0, now)
	for _, tt := range []struct {
		name                    string
		cert, key, chain, roots []byte
	}{
		{"key of another certificate", interPEM, mustKey(t, other.Key), nil, rootPEM},
		{"not a CA", []byte(chain[0]), keyPEM, nil, rootPEM},
		{"does not reach the bundle", interPEM, keyPEM, nil, EncodeCertificates(other.Cert)},
		{"empty bundle", interPEM, keyPEM, nil, nil},
		{"garbage certificate", []byte("hello"), keyPEM, nil, rootPEM},
	} {
		if _, err := Load(tt.cert, tt.key, tt.chain, tt.roots, now); err == nil {
			t.Errorf("%s: Load succeeded", tt.name)
		}
	}
}

func mustKey(t *testing.T, k crypto.Signer) []byte {
	b, err := EncodeKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSelfSignedRoundTrip(t *testing.T) {
	ca, err := NewSelfSigned("example.org", 0, now)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := EncodeCertificates(ca.Cert)
	loaded, err := Load(certPEM, mustKey(t, ca.Key), nil, certPEM, now)
	if err != nil {
		t.Fatal(err)
	}
	if !loaded.Cert.Equal(ca.Cert) {
		t.Error("loaded a different certificate")
	}
}

func TestTTLRange(t *testing.T) {
	r := TTLRange{Default: time.Hour, Min: time.Minute, Max: 2 * time.Hour}
	for _, tt := range []struct {
		in   int64
		want time.Duration
	}{
		{0, time.Hour}, {-5, time.Hour}, {1800, 30 * time.Minute},
		{1, time.Minute}, {59, time.Minute}, {60, time.Minute},
		{7200, 2 * time.Hour}, {7201, 2 * time.Hour}, {1 << 62, 2 * time.Hour},
	} {
		if got := r.Clamp(tt.in); got != tt.want {
			t.Errorf("Clamp(%d) = %s, want %s", tt.in, got, tt.want)
		}
	}
	if err := DefaultTTLRange.Validate(); err != nil {
		t.Errorf("default range: %v", err)
	}
	for _, bad := range []TTLRange{
		{Default: time.Hour, Max: time.Hour},
		{Default: time.Hour, Min: 2 * time.Hour, Max: 3 * time.Hour},
		{Default: 3 * time.Hour, Min: time.Hour, Max: 2 * time.Hour},
	} {
		if bad.Validate() == nil {
			t.Errorf("%+v validated", bad)
		}
	}
}

func TestParseCSR(t *testing.T) {
	rsa2048, _ := rsa.GenerateKey(rand.Reader, 2048)
	rsa1024, _ := rsa.GenerateKey(rand.Reader, 1024)
	_, ed, _ := ed25519.GenerateKey(rand.Reader)
	p224, _ := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	good := csrPEM(t, p256(t))
	tampered := func() []byte {
		block, _ := pem.Decode(good)
		der := append([]byte(nil), block.Bytes...)
		der[len(der)-5] ^= 0xff // inside the signature
		return pem.EncodeToMemory(&pem.Block{Type: block.Type, Bytes: der})
	}()
	for _, tt := range []struct {
		name string
		in   []byte
		want error
	}{
		{"ecdsa p256", good, nil},
		{"rsa 2048", csrPEM(t, rsa2048), nil},
		{"ed25519", csrPEM(t, ed), nil},
		{"rsa 1024", csrPEM(t, rsa1024), ErrCSRKeyRejected},
		{"ecdsa p224", csrPEM(t, p224), ErrCSRKeyRejected},
		{"bad signature", tampered, ErrCSRSignature},
		{"not PEM", []byte("not a csr"), ErrCSRMalformed},
		{"certificate instead", EncodeCertificates(mustSelfSigned(t).Cert), ErrCSRMalformed},
		{"trailing data", append(append([]byte(nil), good...), []byte("junk")...), ErrCSRMalformed},
		{"garbage DER", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: []byte{0x30, 0x03, 1, 2, 3}}), ErrCSRMalformed},
		{"too large", make([]byte, MaxCSRSize+1), ErrCSRTooLarge},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseCSR(tt.in)
			if tt.want == nil && err != nil || tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("ParseCSR() error = %v, want %v", err, tt.want)
			}
		})
	}
}

func mustSelfSigned(t testing.TB) *Authority {
	ca, err := NewSelfSigned("cluster.local", 0, now)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func FuzzParseCSR(f *testing.F) {
	f.Add(csrPEM(f, p256(f)))
	f.Add([]byte("-----BEGIN CERTIFICATE REQUEST-----\nMIIB\n-----END CERTIFICATE REQUEST-----\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		csr, err := ParseCSR(b)
		if err != nil {
			if !errors.Is(err, ErrCSRMalformed) && !errors.Is(err, ErrCSRSignature) &&
				!errors.Is(err, ErrCSRKeyRejected) && !errors.Is(err, ErrCSRTooLarge) {
				t.Fatalf("unclassified error: %v", err)
			}
			return
		}
		if csr.CheckSignature() != nil {
			t.Fatal("accepted a CSR whose signature does not verify")
		}
	})
}

// BenchmarkSign signs ECDSA P-256 leaves with the self-signed RSA root.
func BenchmarkSign(b *testing.B) {
	ca := mustSelfSigned(b)
	csr, err := ParseCSR(csrPEM(b, p256(b)))
	if err != nil {
		b.Fatal(err)
	}
	id := workloadapi.Identity{TrustDomain: "cluster.local", Namespace: "shop", ServiceAccount: "web"}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ca.Sign(csr, id, DefaultTTL, now); err != nil {
			b.Fatal(err)
		}
	}
}

// TestSignRefusedOutsideTheCAsValidity: a CA whose certificate has expired
// (or is not valid yet) issues nothing, instead of leaves that are
// already expired.
func TestSignRefusedOutsideTheCAsValidity(t *testing.T) {
	ca, err := NewSelfSigned("cluster.local", time.Hour, now) // valid from now-1m to now+1h
	if err != nil {
		t.Fatal(err)
	}
	csr, _ := ParseCSR(csrPEM(t, p256(t)))
	id := workloadapi.Identity{TrustDomain: "cluster.local", Namespace: "a", ServiceAccount: "b"}
	for _, tt := range []struct {
		name string
		at   time.Time
		want error
	}{
		{"expired", now.Add(2 * time.Hour), ErrCAExpired},
		{"at its expiry", now.Add(time.Hour), ErrCAExpired},
		{"not yet valid", now.Add(-time.Hour), ErrCANotYetValid},
	} {
		t.Run(tt.name, func(t *testing.T) {
			chain, err := ca.Sign(csr, id, DefaultTTL, tt.at)
			if err == nil {
				leaf, _ := ParseCertificates([]byte(chain[0]))
				t.Errorf("signed a leaf valid %s to %s", leaf[0].NotBefore, leaf[0].NotAfter)
			} else if !errors.Is(err, tt.want) {
				t.Errorf("Sign() = %v, want %v", err, tt.want)
			}
			if _, err := ca.IssueServing([]string{"ca.example"}, time.Hour, tt.at); !errors.Is(err, tt.want) {
				t.Errorf("IssueServing() = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestUsable(t *testing.T) {
	root, err := NewSelfSigned("cluster.local", 24*time.Hour, now) // now-1m to now+24h
	if err != nil {
		t.Fatal(err)
	}
	// An intermediate that outlives its root: the root's end is the CA's.
	interKey := p256(t)
	serial, _ := randomSerial()
	interDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: "intermediate"},
		NotBefore: now, NotAfter: now.Add(365 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}, root.Cert, interKey.Public(), root.Key)
	if err != nil {
		t.Fatal(err)
	}
	inter, err := Load(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: interDER}), mustKey(t, interKey), nil, EncodeCertificates(root.Cert), now)
	if err != nil {
		t.Fatal(err)
	}
	if nb, na := inter.Validity(); !nb.Equal(now) || !na.Equal(root.Cert.NotAfter) {
		t.Errorf("Validity() = %s, %s; want the intermediate's start and the root's end", nb, na)
	}
	for _, tt := range []struct {
		name    string
		at      time.Time
		minLeaf time.Duration
		want    error
	}{
		{"valid", now.Add(time.Hour), 10 * time.Minute, nil},
		{"before the intermediate", now.Add(-30 * time.Second), 0, ErrCANotYetValid},
		{"less than a leaf's minimum left", now.Add(24*time.Hour - 5*time.Minute), 10 * time.Minute, ErrCAExpiring},
		{"exactly the minimum left", now.Add(24*time.Hour - 10*time.Minute), 10 * time.Minute, nil},
		{"after the root", now.Add(25 * time.Hour), 0, ErrCAExpired},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if err := inter.Usable(tt.at, tt.minLeaf); !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Errorf("Usable() = %v, want %v", err, tt.want)
			}
		})
	}
	// A leaf signed near the end is cut at the root's end.
	csr, _ := ParseCSR(csrPEM(t, p256(t)))
	chain, err := inter.Sign(csr, workloadapi.Identity{TrustDomain: "cluster.local", Namespace: "a", ServiceAccount: "b"}, DefaultTTL, now.Add(23*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := ParseCertificates([]byte(chain[0]))
	if !leaf[0].NotAfter.Equal(root.Cert.NotAfter) {
		t.Errorf("leaf ends %s, want the root's end %s", leaf[0].NotAfter, root.Cert.NotAfter)
	}
}
