package main_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/canopy-mesh/canopy/ca/pki"
	"github.com/canopy-mesh/canopy/ca/rootstore"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/node/configdump"
)

// mirrorConfigMap writes key of a ConfigMap to path whenever it changes,
// until ctx ends: what the kubelet does for a mounted ConfigMap.
func mirrorConfigMap(ctx context.Context, t *testing.T, namespace, name, key, path string) {
	last := ""
	for ctx.Err() == nil {
		cm, err := env.Client.CoreV1().ConfigMaps(namespace).Get(ctx, name, metav1.GetOptions{})
		if err == nil && cm.Data[key] != last && cm.Data[key] != "" {
			tmp := path + ".tmp"
			if os.WriteFile(tmp, []byte(cm.Data[key]), 0o644) == nil && os.Rename(tmp, path) == nil {
				last = cm.Data[key]
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// rotateRoot runs the README's root rotation on the self-signed CA while
// a client keeps calling across the two node proxies: add a new root to
// the bundle, sign with it, wait for every leaf to be re-issued under it,
// remove the old root. No component restarts, and no call fails.
func rotateRoot(t *testing.T, sys, secure string, admins map[string]string, call func() string) {
	t.Helper()
	ctx := t.Context()
	secrets := env.Client.CoreV1().Secrets(sys)
	newCA, err := pki.NewSelfSigned("cluster.local", 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	newKey, err := pki.EncodeKey(newCA.Key)
	if err != nil {
		t.Fatal(err)
	}
	newRoot := pki.EncodeCertificates(newCA.Cert)
	edit := func(f func(data map[string][]byte)) {
		s, err := secrets.Get(ctx, rootstore.SelfSignedSecret, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		f(s.Data)
		if _, err := secrets.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	var calls, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			calls.Add(1)
			if call() != "across the mesh" {
				failed.Add(1)
			}
		}
	})
	defer func() {
		close(stop)
		wg.Wait()
		t.Logf("root rotation: %d calls, %d failed", calls.Load(), failed.Load())
		if failed.Load() != 0 {
			t.Errorf("%d of %d calls failed during the root rotation", failed.Load(), calls.Load())
		}
	}()

	// 1. Both roots in the bundle.
	var oldRoot []byte
	edit(func(d map[string][]byte) {
		oldRoot = d[rootstore.KeyRootCert]
		d[rootstore.KeyRootCert] = append(append([]byte{}, oldRoot...), newRoot...)
	})
	eventually.Within(t, settle, "both roots reach the node proxies", func() bool {
		return allDumps(t, admins, func(d dump) bool { return d.trusts(newCA.Cert) })
	})
	// 2. Sign with the new root.
	edit(func(d map[string][]byte) {
		d[rootstore.KeyCACert], d[rootstore.KeyCAKey] = newRoot, newKey
	})
	eventually.Within(t, settle, "the controller serves a certificate of the new root", func() bool {
		c, err := tls.Dial("tcp", secure, &tls.Config{InsecureSkipVerify: true})
		if err != nil {
			return false
		}
		defer c.Close()
		chain := c.ConnectionState().PeerCertificates
		return chain[0].CheckSignatureFrom(newCA.Cert) == nil
	})
	eventually.Within(t, 3*time.Minute, "every workload certificate is re-issued under the new root", func() bool {
		return allDumps(t, admins, func(d dump) bool { return d.leavesFrom(newCA.Cert) })
	})
	// 3. The old root leaves the bundle.
	edit(func(d map[string][]byte) { d[rootstore.KeyRootCert] = newRoot })
	eventually.Within(t, settle, "the old root leaves the node proxies", func() bool {
		return allDumps(t, admins, func(d dump) bool { return d.roots() == 1 })
	})
	// Calls keep working on the new root alone.
	for range 5 {
		if got := call(); got != "across the mesh" {
			t.Fatalf("call after the rotation = %q", got)
		}
	}
}

// dump is the part of a node proxy's config dump the rotation reads.
type dump struct {
	Certificates []struct {
		CertChain []struct{ PEM string }
		RootCerts []struct{ PEM string }
	}
	TrustedRoots []struct{ PEM string }
}

// parsePEM decodes a dumped certificate (base64 of its PEM text); nil if
// it is not one.
func parsePEM(s string) *x509.Certificate {
	c, _ := configdump.ParsePEM(s)
	return c
}

func (d dump) trusts(root *x509.Certificate) bool {
	for _, r := range d.TrustedRoots {
		if c := parsePEM(r.PEM); c != nil && c.Equal(root) {
			return true
		}
	}
	return false
}

func (d dump) roots() int { return len(d.TrustedRoots) }

func (d dump) leavesFrom(root *x509.Certificate) bool {
	if len(d.Certificates) == 0 {
		return false
	}
	for _, c := range d.Certificates {
		if len(c.CertChain) == 0 {
			return false
		}
		leaf := parsePEM(c.CertChain[0].PEM)
		if leaf == nil || leaf.CheckSignatureFrom(root) != nil {
			return false
		}
	}
	return true
}

// allDumps reports whether every node proxy's config dump satisfies ok.
func allDumps(t *testing.T, admins map[string]string, ok func(dump) bool) bool {
	t.Helper()
	for _, addr := range admins {
		resp, err := http.Get("http://" + addr + "/config_dump")
		if err != nil {
			return false
		}
		var d dump
		err = json.NewDecoder(resp.Body).Decode(&d)
		resp.Body.Close()
		if err != nil || !ok(d) {
			return false
		}
	}
	return true
}
