package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/canopy-mesh/canopy/ctl"
	"github.com/canopy-mesh/canopy/ctl/view"
	"github.com/canopy-mesh/canopy/node/configdump"
)

// serviceEntry is a mesh host that only the node proxy can resolve:
// CoreDNS has never heard of it, and its address is one the controller
// allocates (240.240.0.0/16).
const serviceEntry = `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: echo-external
  namespace: demo
spec:
  hosts: [echo.canopy.example]
  location: MESH_INTERNAL
  resolution: STATIC
  ports:
  - {number: 80, name: http, protocol: HTTP, targetPort: 8080}
  workloadSelector:
    labels: {app: echo}
`

// testDNS: with DNS capture on by default, a meshed pod's DNS is answered
// by the node proxy inside the pod: a ServiceEntry host resolves to its
// allocated address and carries traffic over HBONE, a Service's short
// name resolves, and a name that is not the mesh's (a pod record of
// CoreDNS's) goes on to the pod's own resolver.
func testDNS(t *testing.T, m *mesh) {
	m.applyYAML(t, serviceEntry)
	// Deferred, not a Cleanup: the test's context is over by then.
	defer m.deleteYAML(t, "networking.istio.io/v1", "ServiceEntry", "demo", "echo-external")
	client := m.pods(t, "demo", "app=client")[0]
	resolve := func(ctx context.Context, name string) (string, error) {
		b, err := m.c.Get(ctx, &client, 8080, "/resolve?name="+url.QueryEscape(name))
		return strings.TrimSpace(string(b)), err
	}
	// The host has an IPv4 and an IPv6 address: the lookup returns both.
	var vip, last string
	poll(t, 60*time.Second, "the ServiceEntry host resolves to an allocated address", func(ctx context.Context) (bool, error) {
		got, err := resolve(ctx, "echo.canopy.example")
		last = fmt.Sprint(got, err)
		for _, a := range strings.Fields(got) {
			if strings.HasPrefix(a, "240.240.") {
				vip = a
			}
		}
		return err == nil && vip != "", nil
	})
	t.Logf("echo.canopy.example resolves to %s (last lookup: %s)", vip, last)
	if body, err := m.fetch(t, &client, "http://echo.canopy.example/"); err != nil || !strings.Contains(body, `"name":"echo-`) {
		t.Fatalf("client -> echo.canopy.example: %v %s", err, body)
	}
	poll(t, 30*time.Second, "the ServiceEntry's connection carried over mTLS", func(ctx context.Context) (bool, error) {
		var out strings.Builder
		if err := ctl.Traffic(ctx, m.c, ctl.TrafficOptions{Namespace: system, Output: "json"}, &out, io.Discard); err != nil {
			return false, nil
		}
		var conns []view.Connection
		if err := json.Unmarshal([]byte(out.String()), &conns); err != nil {
			return false, err
		}
		return hasConn(conns, "source", "demo/client", "demo/echo", "mutual_tls"), nil
	})

	svc, err := resolve(t.Context(), "echo")
	if err != nil || len(strings.Fields(svc)) == 0 || net.ParseIP(strings.Fields(svc)[0]) == nil || strings.Contains(svc, vip) {
		t.Errorf("the Service's short name: %q, %v", svc, err)
	}
	podRecord := strings.ReplaceAll(client.Status.PodIP, ".", "-") + ".demo.pod.cluster.local"
	if got, err := resolve(t.Context(), podRecord); err != nil || got != client.Status.PodIP {
		t.Errorf("CoreDNS's pod record %s: %q, %v; want it forwarded and answered %s", podRecord, got, err, client.Status.PodIP)
	}

	// canopyctl dns shows what the pod was answered, and the resolver the
	// rest went to: the cluster's, from the pod's own resolv.conf.
	var out strings.Builder
	if err := ctl.DNS(t.Context(), m.c, ctl.DNSOptions{Namespace: system, Pod: "demo/" + client.Name, Output: ctl.JSON}, &out); err != nil {
		t.Fatal(err)
	}
	var v configdump.DNSView
	if err := json.Unmarshal([]byte(out.String()), &v); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, n := range v.Names {
		if n.Name == "echo.canopy.example" && contains(n.Addresses, vip) {
			found = true
		}
	}
	if !found || v.ResolversFrom != "pod" || len(v.Resolvers) == 0 {
		t.Errorf("canopyctl dns: %s", out.String())
	}
	var table strings.Builder
	_ = ctl.DNS(t.Context(), m.c, ctl.DNSOptions{Namespace: system, Pod: "demo/" + client.Name}, &table)
	t.Logf("canopyctl dns demo/%s:\n%s", client.Name, table.String())
}
