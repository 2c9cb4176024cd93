package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"time"
)

// writeServiceAccountKeys writes the RSA key pair the API server signs and
// verifies service-account tokens with, and the controller manager signs
// legacy token secrets with.
func writeServiceAccountKeys(dir string) (keyPath, pubPath string, err error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", "", fmt.Errorf("generate service-account key: %w", err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return "", "", fmt.Errorf("marshal service-account public key: %w", err)
	}
	keyPath = filepath.Join(dir, "sa.key")
	pubPath = filepath.Join(dir, "sa.pub")
	if err := writePEM(keyPath, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(key)); err != nil {
		return "", "", err
	}
	if err := writePEM(pubPath, "PUBLIC KEY", pub); err != nil {
		return "", "", err
	}
	return keyPath, pubPath, nil
}

func writePEM(path, blockType string, der []byte) error {
	b := pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der})
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// writeAdminToken writes the API server's static token file with one user,
// "canopy-admin" in group system:masters, and returns the token.
func writeAdminToken(dir string) (token, path string, err error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", "", fmt.Errorf("generate admin token: %w", err)
	}
	token = hex.EncodeToString(b)
	path = filepath.Join(dir, "tokens.csv")
	line := token + `,canopy-admin,canopy-admin,"system:masters"` + "\n"
	if err := os.WriteFile(path, []byte(line), 0o600); err != nil {
		return "", "", fmt.Errorf("write token file: %w", err)
	}
	return token, path, nil
}

// writeKubeletClientCredentials writes a CA and the client certificate the
// API server presents to kubelets (logs, port-forward), so that kubelets
// can require it.
func writeKubeletClientCredentials(dir string) (caPath, certPath, keyPath string, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", "", fmt.Errorf("generate kubelet client CA key: %w", err)
	}
	now := time.Now()
	ca := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "canopy-testenv-kubelet-client-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return "", "", "", fmt.Errorf("sign kubelet client CA: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", "", fmt.Errorf("generate kubelet client key: %w", err)
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver-kubelet-client"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		return "", "", "", fmt.Errorf("sign kubelet client certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", "", err
	}
	caPath = filepath.Join(dir, "kubelet-client-ca.crt")
	certPath = filepath.Join(dir, "kubelet-client.crt")
	keyPath = filepath.Join(dir, "kubelet-client.key")
	for _, f := range []struct {
		path, typ string
		der       []byte
	}{{caPath, "CERTIFICATE", caDER}, {certPath, "CERTIFICATE", leafDER}, {keyPath, "EC PRIVATE KEY", keyDER}} {
		if err := writePEM(f.path, f.typ, f.der); err != nil {
			return "", "", "", err
		}
	}
	return caPath, certPath, keyPath, nil
}
