package pki

import (
	"crypto/x509"
	"testing"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// TestRootRotation walks the rotation of the README: with both roots in
// the bundle, certificates of the old and of the new root verify, so
// workloads can be re-issued one by one; once the old root leaves the
// bundle, only the new one's do.
func TestRootRotation(t *testing.T) {
	oldCA, newCA := mustSelfSigned(t), mustSelfSigned(t)
	id := workloadapi.Identity{TrustDomain: "cluster.local", Namespace: "shop", ServiceAccount: "web"}
	issue := func(ca *Authority) *x509.Certificate {
		csr, err := ParseCSR(csrPEM(t, p256(t)))
		if err != nil {
			t.Fatal(err)
		}
		chain, err := ca.Sign(csr, id, DefaultTTL, now)
		if err != nil {
			t.Fatal(err)
		}
		c, _ := ParseCertificates([]byte(chain[0]))
		return c[0]
	}
	verifies := func(leaf *x509.Certificate, bundle ...*x509.Certificate) bool {
		pool := x509.NewCertPool()
		for _, r := range bundle {
			pool.AddCert(r)
		}
		_, err := leaf.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		return err == nil
	}

	// Step 1: the bundle gains the new root; the CA still signs with the
	// old one. Step 2: the CA signs with the new root, the bundle keeps
	// both: the CA loads with a two-root bundle.
	both := append(EncodeCertificates(oldCA.Cert), EncodeCertificates(newCA.Cert)...)
	newKey, _ := EncodeKey(newCA.Key)
	rotating, err := Load(EncodeCertificates(newCA.Cert), newKey, nil, both, now)
	if err != nil {
		t.Fatalf("load the new root with a two-root bundle: %v", err)
	}
	oldLeaf, newLeaf := issue(oldCA), issue(rotating)
	if !verifies(oldLeaf, rotating.Roots...) || !verifies(newLeaf, rotating.Roots...) {
		t.Fatal("during the rotation both generations must verify against the bundle")
	}
	// Step 3: every workload re-issued, the old root leaves the bundle.
	if verifies(oldLeaf, newCA.Cert) {
		t.Error("an old-root certificate verifies after the old root left the bundle")
	}
	if !verifies(newLeaf, newCA.Cert) {
		t.Error("a new-root certificate does not verify after the rotation")
	}
}
