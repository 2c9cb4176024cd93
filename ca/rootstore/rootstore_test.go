package rootstore_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"os"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/canopy-mesh/canopy/ca/pki"
	"github.com/canopy-mesh/canopy/ca/rootstore"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
)

var env *testenv.Environment

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

// TestConcurrentFirstStartAgreeAndRestartKeeps starts two CAs at once on an
// empty namespace: exactly one root is created and both use it; a later
// start (a restart) loads the same root.
func TestConcurrentFirstStartAgreeAndRestartKeeps(t *testing.T) {
	testenv.Need(t, env)
	ns := env.Namespace(t, "ca", nil)
	ctx := t.Context()
	var wg sync.WaitGroup
	roots := make([]*x509.Certificate, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, src, err := rootstore.Load(ctx, env.Client, ns, "cluster.local", time.Now())
			if err == nil && src != rootstore.SourceSelfSigned {
				t.Errorf("source = %s", src)
			}
			if err == nil {
				roots[i] = a.Cert
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if !roots[0].Equal(roots[1]) {
		t.Fatal("two concurrent first starts use different roots")
	}
	s, err := env.Client.CoreV1().Secrets(ns).Get(ctx, rootstore.SelfSignedSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if s.Type != rootstore.SecretType || len(s.Data[rootstore.KeyRootCert]) == 0 {
		t.Errorf("secret type %q, keys %v", s.Type, len(s.Data))
	}
	restarted, _, err := rootstore.Load(ctx, env.Client, ns, "cluster.local", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if !restarted.Cert.Equal(roots[0]) {
		t.Error("a restart generated a new root")
	}
}

// TestPlugInCAWins stores an intermediate in cacerts: the CA signs with it
// and chains to the plug-in root.
func TestPlugInCAWins(t *testing.T) {
	testenv.Need(t, env)
	ns := env.Namespace(t, "cacerts", nil)
	ctx := t.Context()
	now := time.Now()
	root, err := pki.NewSelfSigned("cluster.local", 0, now)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "plug-in intermediate"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}, root.Cert, key.Public(), root.Key)
	if err != nil {
		t.Fatal(err)
	}
	inter, _ := x509.ParseCertificate(der)
	keyPEM, _ := pki.EncodeKey(key)
	if _, err := env.Client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: rootstore.PlugInSecret},
		Data: map[string][]byte{
			rootstore.KeyCACert:    pki.EncodeCertificates(inter),
			rootstore.KeyCAKey:     keyPEM,
			rootstore.KeyCertChain: pki.EncodeCertificates(inter, root.Cert),
			rootstore.KeyRootCert:  pki.EncodeCertificates(root.Cert),
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	a, src, err := rootstore.Load(ctx, env.Client, ns, "cluster.local", now)
	if err != nil {
		t.Fatal(err)
	}
	if src != rootstore.SourcePlugIn || !a.Cert.Equal(inter) || !a.Roots[0].Equal(root.Cert) {
		t.Errorf("loaded %s with cert %s", src, a.Cert.Subject)
	}
	if _, err := env.Client.CoreV1().Secrets(ns).Get(context.Background(), rootstore.SelfSignedSecret, metav1.GetOptions{}); err == nil {
		t.Error("a self-signed root was created although cacerts exists")
	}
}

func TestLoadDir(t *testing.T) {
	now := time.Now()
	dir := t.TempDir()
	if _, ok, err := rootstore.LoadDir(dir, now); ok || err != nil {
		t.Fatalf("empty directory: ok %v, err %v", ok, err)
	}
	root, err := pki.NewSelfSigned("cluster.local", 0, now)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := pki.EncodeKey(root.Key)
	for name, b := range map[string][]byte{
		rootstore.KeyCACert: pki.EncodeCertificates(root.Cert), rootstore.KeyCAKey: key,
		rootstore.KeyCertChain: pki.EncodeCertificates(root.Cert), rootstore.KeyRootCert: pki.EncodeCertificates(root.Cert),
	} {
		if err := os.WriteFile(dir+"/"+name, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	a, ok, err := rootstore.LoadDir(dir, now)
	if err != nil || !ok || !a.Cert.Equal(root.Cert) {
		t.Fatalf("LoadDir = %v, %v, %v", a, ok, err)
	}
	if err := os.WriteFile(dir+"/"+rootstore.KeyCAKey, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := rootstore.LoadDir(dir, now); !ok || err == nil {
		t.Errorf("a broken key was accepted: ok %v, err %v", ok, err)
	}
}
