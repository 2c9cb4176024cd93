package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/canopy-mesh/canopy/ctl"
	"github.com/canopy-mesh/canopy/ctl/view"
	"github.com/canopy-mesh/canopy/internal/echogrpc"
)

const (
	grpcNS     = "grpc-demo"
	grpcTarget = "xds:///echo-grpc.grpc-demo.svc.cluster.local:7070"
)

// testProxylessGRPC: the proxyless gRPC sample (deploy/examples/grpc.yaml)
// in a namespace labelled for injection. canopy-controller's webhook gives
// every pod Istio's grpc-agent template, whose proxyv2 image the local
// cluster runs as Istio's own pilot-agent: it gets each pod's certificate
// from Canopy's CA and proxies xDS from canopy-controller to the app,
// canopy-echo's gRPC mode on grpc-go's xDS client and server. Calls from
// the client pod carry mutual TLS with its identity, split 80/20 across
// two versions by a VirtualService; the intruder's calls are refused by an
// AuthorizationPolicy that the server enforces; canopyctl shows the pods
// as proxyless and their agents SYNCED.
func testProxylessGRPC(t *testing.T, m *mesh) {
	m.apply(t, "deploy/examples/grpc.yaml")
	for _, d := range []string{"echo-grpc-v1", "echo-grpc-v2", "client", "intruder"} {
		m.waitDeployment(t, grpcNS, d)
	}
	pods := m.pods(t, grpcNS, "")
	if len(pods) != 4 {
		t.Fatalf("%d ready pods in %s, want 4", len(pods), grpcNS)
	}
	for i := range pods {
		checkGRPCAgentInjected(t, &pods[i])
	}

	client := m.pods(t, grpcNS, "app=client")[0]
	// The first call waits for the client's xDS (listener, routes,
	// clusters, endpoints) and the servers' listeners.
	poll(t, time.Minute, "a first proxyless call", func(ctx context.Context) (bool, error) {
		rs, err := grpcCalls(ctx, m, &client, 1)
		return err == nil && rs[0].Code == "OK", nil
	})
	const n = 200
	rs, err := grpcCalls(t.Context(), m, &client, n)
	if err != nil {
		t.Fatal(err)
	}
	versions := map[string]int{}
	wantPeer := "spiffe://cluster.local/ns/" + grpcNS + "/sa/client"
	for _, r := range rs {
		if r.Code != "OK" {
			t.Fatalf("client -> echo-grpc: %s %s", r.Code, r.Error)
		}
		if !r.Secure || r.PeerPrincipal != wantPeer {
			t.Fatalf("echo-grpc saw the client as %q (TLS %v), want %s over mutual TLS", r.PeerPrincipal, r.Secure, wantPeer)
		}
		versions[r.Version]++
	}
	t.Logf("%d calls: %v", n, versions)
	// 80/20 over 200 calls: v1 expects 160 with a standard deviation of
	// 5.7; 130 to 190 is more than five of them either way.
	if versions["v1"] < 130 || versions["v1"] > 190 || versions["v1"]+versions["v2"] != n {
		t.Errorf("calls by version %v, want about 160 v1 and 40 v2 (VirtualService weights 80/20)", versions)
	}

	intruder := m.pods(t, grpcNS, "app=intruder")[0]
	rs, err = grpcCalls(t.Context(), m, &intruder, 5)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if r.Code != "PermissionDenied" {
			t.Errorf("intruder -> echo-grpc: %s %q, want PermissionDenied from the deny-intruder policy", r.Code, r.Error)
		}
	}

	// canopyctl: the pods are proxyless workloads, their agents SYNCED.
	var table strings.Builder
	if err := ctl.Workloads(t.Context(), m.c, ctl.WorkloadsOptions{ProxyOptions: ctl.ProxyOptions{Namespace: system}, Filter: view.WorkloadFilter{Namespace: grpcNS}}, &table, io.Discard); err != nil {
		t.Fatal(err)
	}
	t.Logf("canopyctl workloads -n %s:\n%s", grpcNS, table.String())
	for _, p := range pods {
		if !hasRowWith(table.String(), p.Name, "TCP (proxyless)") {
			t.Errorf("canopyctl workloads does not mark %s as TCP (proxyless)", p.Name)
		}
	}
	poll(t, 30*time.Second, "every proxyless agent SYNCED", func(ctx context.Context) (bool, error) {
		var out bytes.Buffer
		if err := ctl.ProxyStatus(ctx, m.c, ctl.ProxyStatusOptions{Namespace: system, Output: ctl.JSON}, &out); err != nil {
			return false, err
		}
		var cs []view.ControllerStatus
		if err := json.Unmarshal(out.Bytes(), &cs); err != nil {
			return false, err
		}
		synced := map[string]bool{}
		for _, c := range cs {
			for _, p := range c.Proxies {
				ok := len(p.Types) > 0
				for _, ty := range p.Types {
					ok = ok && ty.Status == "SYNCED"
				}
				synced[p.ProxyID] = ok
			}
		}
		for _, p := range pods {
			if !synced[p.Name+"."+grpcNS] {
				t.Logf("%s.%s not SYNCED yet", p.Name, grpcNS)
				return false, nil
			}
		}
		return true, nil
	})
}

// checkGRPCAgentInjected checks what the webhook gave a pod of the sample:
// the grpc-agent template's agent container on Istio's proxyv2 image, the
// bootstrap for the app, no init container (no redirection), and no
// ambient enrollment.
func checkGRPCAgentInjected(t *testing.T, p *corev1.Pod) {
	t.Helper()
	if p.Annotations["sidecar.istio.io/status"] == "" {
		t.Errorf("%s: no sidecar.istio.io/status: not injected", p.Name)
	}
	if v := p.Annotations["ambient.istio.io/redirection"]; v != "" {
		t.Errorf("%s: ambient.istio.io/redirection=%s: a pod with an agent must stay out of ambient", p.Name, v)
	}
	if len(p.Spec.InitContainers) != 0 {
		t.Errorf("%s: init containers %v, want none (grpc-agent redirects nothing)", p.Name, p.Spec.InitContainers)
	}
	if got := view.Dataplane(p); got != "proxyless" {
		t.Errorf("%s: dataplane %q, want proxyless", p.Name, got)
	}
	var agent, app *corev1.Container
	for i := range p.Spec.Containers {
		if c := &p.Spec.Containers[i]; c.Name == "istio-proxy" {
			agent = c
		} else {
			app = c
		}
	}
	if agent == nil || app == nil {
		t.Fatalf("%s: containers %v, want the app and istio-proxy", p.Name, p.Spec.Containers)
	}
	if !strings.HasPrefix(agent.Image, "istio/proxyv2:") {
		t.Errorf("%s: istio-proxy image %s, want istio/proxyv2", p.Name, agent.Image)
	}
	bootstrap := false
	for _, e := range app.Env {
		bootstrap = bootstrap || (e.Name == "GRPC_XDS_BOOTSTRAP" && e.Value != "")
	}
	if !bootstrap {
		t.Errorf("%s: the app has no GRPC_XDS_BOOTSTRAP", p.Name)
	}
}

// grpcCalls has pod make n gRPC calls to the sample's echo-grpc (canopy-echo's
// GET /grpc, reached by port-forward).
func grpcCalls(ctx context.Context, m *mesh, pod *corev1.Pod, n int) ([]echogrpc.Result, error) {
	body, err := m.c.Get(ctx, pod, 8080, fmt.Sprintf("/grpc?n=%d&target=%s", n, url.QueryEscape(grpcTarget)))
	if err != nil {
		return nil, err
	}
	var rs []echogrpc.Result
	if err := json.Unmarshal(body, &rs); err != nil {
		return nil, fmt.Errorf("decode %q: %w", body, err)
	}
	if len(rs) != n {
		return nil, fmt.Errorf("%d results, want %d", len(rs), n)
	}
	return rs, nil
}

// hasRowWith reports whether a line of table has name as a column and ends
// with suffix.
func hasRowWith(table, name, suffix string) bool {
	for _, line := range strings.Split(table, "\n") {
		if strings.Contains(" "+line+" ", " "+name+" ") && strings.HasSuffix(strings.TrimSpace(line), suffix) {
			return true
		}
	}
	return false
}
