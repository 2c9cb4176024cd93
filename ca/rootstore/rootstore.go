// Package rootstore keeps the CA's key material (docs/wire-contract.md §6.4):
// plug-in files, a plug-in CA from Secret cacerts when it exists, else the
// self-signed root of Secret istio-ca-secret, generated on first start.
// Replicas that start together race on creating the Secret; exactly one wins
// and every replica uses its root.
package rootstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/canopy-mesh/canopy/ca/pki"
)

// Secret names, type and keys of wire contract §6.4.
const (
	SelfSignedSecret = "istio-ca-secret"
	PlugInSecret     = "cacerts"
	SecretType       = corev1.SecretType("istio.io/ca-root")

	KeyCACert    = "ca-cert.pem"
	KeyCAKey     = "ca-key.pem"
	KeyRootCert  = "root-cert.pem"
	KeyCertChain = "cert-chain.pem"
	KeyKey       = "key.pem"
)

// Source says where the CA came from.
type Source string

const (
	SourcePlugInDir  Source = "plug-in (files)"
	SourcePlugIn     Source = "plug-in (Secret cacerts)"
	SourceSelfSigned Source = "self-signed (Secret istio-ca-secret)"
)

// Secret names the Secret the CA came from: cacerts for a plug-in CA
// (files are normally that Secret mounted), else istio-ca-secret.
func (s Source) Secret() string {
	if s == SourceSelfSigned {
		return SelfSignedSecret
	}
	return PlugInSecret
}

// Load returns the CA of namespace: the plug-in CA of Secret cacerts when
// it exists, else the self-signed root of Secret istio-ca-secret, created
// with a new root for trustDomain when missing. An empty trustDomain
// creates nothing (a reload: a Secret deleted while the controller runs
// must not become a new root that no proxy trusts).
func Load(ctx context.Context, client kubernetes.Interface, namespace, trustDomain string, now time.Time) (*pki.Authority, Source, error) {
	secrets := client.CoreV1().Secrets(namespace)
	plug, err := secrets.Get(ctx, PlugInSecret, metav1.GetOptions{})
	switch {
	case err == nil:
		a, err := fromPlugIn(plug, now)
		if err != nil {
			return nil, "", fmt.Errorf("plug-in CA in Secret %s/%s: %w", namespace, PlugInSecret, err)
		}
		return a, SourcePlugIn, nil
	case !apierrors.IsNotFound(err):
		return nil, "", fmt.Errorf("read Secret %s/%s: %w", namespace, PlugInSecret, err)
	}

	existing, err := secrets.Get(ctx, SelfSignedSecret, metav1.GetOptions{})
	if apierrors.IsNotFound(err) && trustDomain != "" {
		existing, err = create(ctx, client, namespace, trustDomain, now)
	}
	if err != nil {
		return nil, "", fmt.Errorf("read Secret %s/%s: %w", namespace, SelfSignedSecret, err)
	}
	a, err := fromSelfSigned(existing, now)
	if err != nil {
		return nil, "", fmt.Errorf("self-signed CA in secret %s/%s: %w", namespace, SelfSignedSecret, err)
	}
	return a, SourceSelfSigned, nil
}

// create generates a root and stores it; when another replica created the
// Secret first, it returns that one instead.
func create(ctx context.Context, client kubernetes.Interface, namespace, trustDomain string, now time.Time) (*corev1.Secret, error) {
	a, err := pki.NewSelfSigned(trustDomain, 0, now)
	if err != nil {
		return nil, err
	}
	key, err := pki.EncodeKey(a.Key)
	if err != nil {
		return nil, err
	}
	cert := pki.EncodeCertificates(a.Cert)
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: SelfSignedSecret, Namespace: namespace},
		Type:       SecretType,
		Data: map[string][]byte{
			KeyCACert: cert, KeyCAKey: key, KeyRootCert: cert,
			KeyCertChain: {}, KeyKey: {},
		},
	}
	created, err := client.CoreV1().Secrets(namespace).Create(ctx, s, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		// Another replica won the race: use its root.
		return client.CoreV1().Secrets(namespace).Get(ctx, SelfSignedSecret, metav1.GetOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("create Secret %s/%s: %w", namespace, SelfSignedSecret, err)
	}
	return created, nil
}

// LoadDir returns the plug-in CA of a directory holding the cacerts files
// (ca-cert.pem, ca-key.pem, cert-chain.pem, root-cert.pem), as mounted at
// ./etc/cacerts; ok is false when the directory has no ca-cert.pem.
func LoadDir(dir string, now time.Time) (a *pki.Authority, ok bool, err error) {
	read := func(name string) []byte {
		b, _ := os.ReadFile(filepath.Join(dir, name))
		return b
	}
	cert := read(KeyCACert)
	if len(cert) == 0 {
		return nil, false, nil
	}
	a, err = pki.Load(cert, read(KeyCAKey), chainAbove(cert, read(KeyCertChain)), read(KeyRootCert), now)
	if err != nil {
		return nil, true, fmt.Errorf("plug-in CA in %s: %w", dir, err)
	}
	return a, true, nil
}

func fromSelfSigned(s *corev1.Secret, now time.Time) (*pki.Authority, error) {
	cert, key := s.Data[KeyCACert], s.Data[KeyCAKey]
	if len(cert) == 0 || len(key) == 0 {
		return nil, errors.New("missing " + KeyCACert + " or " + KeyCAKey)
	}
	roots := s.Data[KeyRootCert]
	if len(roots) == 0 {
		roots = cert
	}
	return pki.Load(cert, key, nil, roots, now)
}

// fromPlugIn reads cacerts in either of its forms: ca-cert.pem, ca-key.pem,
// cert-chain.pem and root-cert.pem, or tls.crt, tls.key and ca.crt.
func fromPlugIn(s *corev1.Secret, now time.Time) (*pki.Authority, error) {
	d := s.Data
	if len(d[KeyCACert]) > 0 {
		return pki.Load(d[KeyCACert], d[KeyCAKey], chainAbove(d[KeyCACert], d[KeyCertChain]), d[KeyRootCert], now)
	}
	if len(d[corev1.TLSCertKey]) > 0 {
		certs, err := pki.ParseCertificates(d[corev1.TLSCertKey])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", corev1.TLSCertKey, err)
		}
		if len(certs) == 0 {
			return nil, fmt.Errorf("%s: no certificate", corev1.TLSCertKey)
		}
		return pki.Load(pki.EncodeCertificates(certs[0]), d[corev1.TLSPrivateKeyKey], pki.EncodeCertificates(certs[1:]...), d["ca.crt"], now)
	}
	return nil, errors.New("neither " + KeyCACert + " nor " + corev1.TLSCertKey + " present")
}

// chainAbove returns the certificates of cert-chain.pem above the CA
// certificate: Istio's cert-chain.pem may start with the CA certificate
// itself. A chain that does not parse is left to Load to reject.
func chainAbove(caCert, chain []byte) []byte {
	certs, err := pki.ParseCertificates(chain)
	if err != nil {
		return chain
	}
	ca, err := pki.ParseCertificates(caCert)
	if err == nil && len(ca) == 1 && len(certs) > 0 && certs[0].Equal(ca[0]) {
		certs = certs[1:]
	}
	return pki.EncodeCertificates(certs...)
}
