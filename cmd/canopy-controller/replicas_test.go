package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/canopy-mesh/canopy/ca/pki"
	"github.com/canopy-mesh/canopy/ca/rootcm"
	"github.com/canopy-mesh/canopy/ca/rootstore"
	"github.com/canopy-mesh/canopy/internal/testing/canopy"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// The replicas' lease timing: the chart's defaults but for a shorter
// retry period. A hand-over by release takes about a retry period; one
// by expiry takes most of a lease duration.
const (
	replicaLeaseDuration = 15 * time.Second
	replicaRetryPeriod   = time.Second
)

// TestReplicasHandOver runs two controller replicas, started at once
// against a CA namespace holding nothing yet, under a node proxy:
//
//   - one root: both replicas serve with the root in the one Secret and
//     the published ConfigMap, and exactly one of them leads;
//   - the proxy, connected to the leader, is moved to the other replica
//     by stopping the leader: it reconnects with initial_resource_versions
//     and is told to remove nothing, sent nothing changed (nothing at
//     all), and at no point lacks a resource;
//   - the other replica takes the writers over well within the lease
//     duration (the stopped one released the Lease), and a namespace
//     created after the hand-over gets its root ConfigMap;
//   - a replica started again follows: it does not take the Lease back.
func TestReplicasHandOver(t *testing.T) {
	testenv.Need(t, env)
	if testing.Short() {
		t.Skip("builds and runs the controller")
	}
	ctx := t.Context()
	bin, err := canopy.Build(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	fx := writeRestartFixture(t)
	sys := env.Namespace(t, "canopy-system", nil)
	plain := map[string]string{"controller-a": freeAddr(t), "controller-b": freeAddr(t)}
	start := func(id string) *canopy.Controller {
		t.Helper()
		return startController(t, bin, sys, id, "--xds-addr="+plain[id], "--push-quiet=20ms", "--push-max-delay=200ms",
			fmt.Sprintf("--leader-lease-duration=%s", replicaLeaseDuration), fmt.Sprintf("--leader-retry-period=%s", replicaRetryPeriod))
	}
	// At once, on an empty namespace: both may find no CA Secret and
	// race to create one.
	replicas := map[string]*canopy.Controller{"controller-a": start("controller-a"), "controller-b": start("controller-b")}
	for id, c := range replicas {
		if err := c.WaitReady(ctx, settle); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
	}

	t.Run("one root", func(t *testing.T) {
		secret, err := env.Client.CoreV1().Secrets(sys).Get(ctx, rootstore.SelfSignedSecret, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		stored, err := pki.ParseCertificates(secret.Data[rootstore.KeyRootCert])
		if err != nil || len(stored) != 1 {
			t.Fatalf("the Secret's root-cert.pem: %d certificates, %v", len(stored), err)
		}
		published := publishedRoots(t, sys)
		if len(published) != 1 || !published[0].Equal(stored[0]) {
			t.Errorf("ConfigMap %s holds %d certificates, want the Secret's root alone", rootcm.ConfigMapName, len(published))
		}
		// Each replica's serving certificate chains to that root: neither
		// signs with a root of its own that lost the race.
		pool := x509.NewCertPool()
		pool.AddCert(stored[0])
		for id, c := range replicas {
			conn, err := tls.Dial("tcp", c.SecureAddr, &tls.Config{RootCAs: pool, ServerName: "canopy-controller." + sys + ".svc", MinVersion: tls.VersionTLS12})
			if err != nil {
				t.Errorf("%s does not serve under the stored root: %v", id, err)
				continue
			}
			conn.Close()
		}
	})

	var lead, follow string
	eventually.Within(t, settle, "exactly one replica leads", func() bool {
		lead, follow = "", ""
		for id, c := range replicas {
			switch leaderGauge(c) {
			case 1:
				lead = id
			case 0:
				follow = id
			}
		}
		return lead != "" && follow != ""
	})
	t.Logf("%s leads, %s follows", lead, follow)

	// The proxy is given both replicas, the leader first: pick_first
	// connects to it, and to the other once it is gone.
	r := manual.NewBuilderWithScheme("replicas")
	r.InitialState(resolver.State{Addresses: []resolver.Address{{Addr: plain[lead]}, {Addr: plain[follow]}}})
	v := newView(fx.ours)
	runProxy(t, sys, dialFast(t, r.Scheme()+":///canopy-controller", grpc.WithResolvers(r)), v)
	eventually.Within(t, settle, "proxy holds the fixture and is sent nothing more", func() bool {
		return v.holds(fx.names) && v.quietFor(quiet)
	})
	if !proxyConnected(t, replicas[lead]) || proxyConnected(t, replicas[follow]) {
		t.Fatalf("the proxy is not connected to the leader %s alone", lead)
	}
	held := v.snapshot()
	t.Logf("the proxy holds %d addresses and %d authorizations of the fixture",
		len(held[workloadapi.AddressTypeURL]), len(held[workloadapi.AuthorizationTypeURL]))

	mark := v.restart(held)
	stopped := time.Now()
	if err := replicas[lead].Stop(); err != nil {
		t.Logf("stop %s: %v", lead, err)
	}

	t.Run("the other replica takes the writers over", func(t *testing.T) {
		eventually.Within(t, settle, follow+" leads", func() bool { return leaderGauge(replicas[follow]) == 1 })
		took := time.Since(stopped)
		t.Logf("%s leads %s after %s was stopped", follow, took.Round(time.Millisecond), lead)
		// Stop waits for the process to end, and the gauge is scraped: a
		// few retry periods' slack, still far from the expiry of a Lease
		// left held.
		if limit := replicaLeaseDuration / 2; took >= limit {
			t.Errorf("hand-over took %s, want under %s: the stopped leader did not release the Lease", took, limit)
		}
		ns := env.Namespace(t, "after-handover", nil)
		if _, err := canopy.RootPool(ctx, env.Client, ns, settle); err != nil {
			t.Errorf("the new leader does not write: %v", err)
		}
	})

	t.Run("proxy reconnects to the other replica unchanged", func(t *testing.T) {
		eventually.Within(t, settle, "proxy answered by "+follow+" and sent nothing more", func() bool {
			return v.answeredSince(mark) && v.quietFor(quiet)
		})
		if !proxyConnected(t, replicas[follow]) {
			t.Errorf("the proxy was answered, but not by %s", follow)
		}
		removed, changed, resent, gaps := v.since(mark)
		t.Logf("after the move: %d removed, %d changed, %d resent unchanged, %d gaps", len(removed), len(changed), len(resent), len(gaps))
		for _, c := range []struct {
			what  string
			names []string
		}{{"removed", removed}, {"changed", changed}, {"resent unchanged", resent}, {"missing at some point", gaps}} {
			if len(c.names) > 0 {
				t.Errorf("%d of the fixture's resources %s after the move, e.g. %q", len(c.names), c.what, c.names[:min(5, len(c.names))])
			}
		}
	})

	t.Run("a replica started again follows", func(t *testing.T) {
		again := startController(t, bin, sys, lead+"-again", "--xds-addr="+freeAddr(t),
			fmt.Sprintf("--leader-lease-duration=%s", replicaLeaseDuration), fmt.Sprintf("--leader-retry-period=%s", replicaRetryPeriod))
		if err := again.WaitReady(ctx, settle); err != nil {
			t.Fatal(err)
		}
		// Ready means its tables are loaded; its first campaign (at once)
		// found the Lease held.
		if got := leaderGauge(again); got != 0 {
			t.Errorf("the restarted replica's leader gauge = %v, want 0", got)
		}
		if got := leaderGauge(replicas[follow]); got != 1 {
			t.Errorf("%s's leader gauge = %v, want 1", follow, got)
		}
	})
}

// publishedRoots parses the root ConfigMap of ns, waiting for it.
func publishedRoots(t *testing.T, ns string) []*x509.Certificate {
	t.Helper()
	var certs []*x509.Certificate
	eventually.Within(t, settle, "the root ConfigMap in "+ns, func() bool {
		cm, err := env.Client.CoreV1().ConfigMaps(ns).Get(t.Context(), rootcm.ConfigMapName, metav1.GetOptions{})
		if err != nil {
			return false
		}
		certs, err = pki.ParseCertificates([]byte(cm.Data[rootcm.Key]))
		return err == nil
	})
	return certs
}

// leaderGauge scrapes canopy_controller_leader from c's metrics: 1, 0, or
// -1 when it cannot be read.
func leaderGauge(c *canopy.Controller) float64 {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.MonitoringAddr+"/metrics", nil)
	if err != nil {
		return -1
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "canopy_controller_leader{") {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(line[strings.LastIndex(line, " ")+1:], &v); err == nil {
			return v
		}
	}
	return -1
}

// proxyConnected reports whether c's log says a proxy connected to it.
func proxyConnected(t *testing.T, c *canopy.Controller) bool {
	t.Helper()
	b, err := os.ReadFile(c.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		var entry struct{ Msg string }
		if json.Unmarshal([]byte(line), &entry) == nil && entry.Msg == "proxy connected" {
			return true
		}
	}
	return false
}
