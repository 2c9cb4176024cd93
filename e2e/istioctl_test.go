package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/canopy-mesh/canopy/ctl"
	"github.com/canopy-mesh/canopy/ctl/cluster"
	"github.com/canopy-mesh/canopy/ctl/view"
	"github.com/canopy-mesh/canopy/internal/testing/ci"
	"github.com/canopy-mesh/canopy/internal/testing/istiod"
	"github.com/canopy-mesh/canopy/node/configdump"
)

// testIstioctl: Istio's own istioctl (the pinned build), with nothing
// but a kubeconfig, finds Canopy's components where it finds Istio's and
// shows what canopyctl shows. For each node proxy, ztunnel-config
// workloads, services, policies and certificates, as tables and as JSON
// (istioctl re-encodes the dump through its own structs), equal
// canopyctl's; proxy-status lists every node proxy, subscribed to both
// ambient types and, per type, SYNCED, as canopyctl proxy-status does.
func testIstioctl(t *testing.T, m *mesh) {
	bins, err := istiod.FindBinaries("")
	if err != nil {
		ci.Unavailable(t, "istioctl: %v", err)
	}
	ic := istioctl{bin: bins.Istioctl, kubeconfig: m.local.State.Kubeconfig, home: t.TempDir()}
	proxies, err := m.c.Pods(t.Context(), system, cluster.NodeProxyApp)
	if err != nil {
		t.Fatal(err)
	}
	if len(proxies) != 2 {
		t.Fatalf("%d node proxies, want one per node", len(proxies))
	}
	// A policy for the policy tables, which match nothing that flows.
	m.applyYAML(t, `
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: istioctl-check, namespace: legacy}
spec:
  action: DENY
  rules: [{from: [{source: {namespaces: [nowhere]}}]}]`)
	defer m.deleteYAML(t, "security.istio.io/v1", "AuthorizationPolicy", "legacy", "istioctl-check")
	for _, p := range proxies {
		poll(t, 30*time.Second, "the policy at "+p.Name, func(ctx context.Context) (bool, error) {
			var out bytes.Buffer
			err := ctl.Policies(ctx, m.c, ctl.ListOptions{ProxyOptions: ctl.ProxyOptions{Namespace: system, Proxy: p.Name}, Filter: "legacy", Output: ctl.JSON}, &out, io.Discard)
			return err == nil && strings.Contains(out.String(), "istioctl-check"), nil
		})
	}

	// No pod named: istioctl picks a pod of daemonset/ztunnel.
	if _, err := ic.run(t, "ztunnel-config", "workloads"); err != nil {
		t.Errorf("istioctl ztunnel-config workloads without a pod: %v", err)
	}
	for i := range proxies {
		p := &proxies[i]
		t.Run(p.Spec.NodeName, func(t *testing.T) { compareNodeProxy(t, m, ic, p) })
	}

	// proxy-status: found by app=istiod, asked over xDS on 15012.
	out, err := ic.run(t, "proxy-status")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("istioctl proxy-status:\n%s", out)
	var canopy strings.Builder
	if err := ctl.ProxyStatus(t.Context(), m.c, ctl.ProxyStatusOptions{Namespace: system}, &canopy); err != nil {
		t.Fatal(err)
	}
	statusCols := []string{"NAME", "CLUSTER", "ISTIOD", "VERSION", "SUBSCRIBED TYPES"}
	got, want := rows(t, out, statusCols...), rows(t, canopy.String(), statusCols...)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("istioctl proxy-status (-canopyctl +istioctl):\n%s", diff)
	}
	ctrl := m.pods(t, system, cluster.Selector(cluster.ControllerApp))[0]
	for _, p := range proxies {
		row := findRow(got, p.Name+"."+system)
		if row == nil {
			t.Errorf("istioctl proxy-status does not list %s.%s", p.Name, system)
			continue
		}
		if row[2] != ctrl.Name || row[4] != "2 (WADS,WDS)" {
			t.Errorf("istioctl proxy-status row %q: want ISTIOD %s and SUBSCRIBED TYPES 2 (WADS,WDS)", row, ctrl.Name)
		}
	}
	// Verbose: a column per type, "SYNCED (age)" for both of every node
	// proxy (the age left out of the comparison).
	out, err = ic.run(t, "proxy-status", "-v", "1")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("istioctl proxy-status -v 1:\n%s", out)
	header, vrows := table(t, out)
	wads, wds := slices.Index(header, "WADS"), slices.Index(header, "WDS")
	if wads < 0 || wds < 0 {
		t.Fatalf("istioctl proxy-status -v 1 has no WADS or WDS column:\n%s", out)
	}
	for _, p := range proxies {
		row := findRow(vrows, p.Name+"."+system)
		if row == nil || !strings.HasPrefix(row[wads], "SYNCED") || !strings.HasPrefix(row[wds], "SYNCED") {
			t.Errorf("istioctl proxy-status -v 1: %s.%s is not SYNCED for WADS and WDS: %q", p.Name, system, row)
		}
	}
}

// compareNodeProxy compares what istioctl and canopyctl show of one node
// proxy.
func compareNodeProxy(t *testing.T, m *mesh, ic istioctl, p *corev1.Pod) {
	target := p.Name + "." + system
	proxy := ctl.ProxyOptions{Namespace: system, Proxy: p.Name}
	for _, c := range []struct {
		what string
		cols []string
		run  func(out io.Writer) error
	}{
		{"workloads", []string{"NAMESPACE", "POD NAME", "ADDRESS", "NODE", "WAYPOINT", "PROTOCOL"}, func(out io.Writer) error {
			return ctl.Workloads(t.Context(), m.c, ctl.WorkloadsOptions{ProxyOptions: proxy}, out, io.Discard)
		}},
		{"services", []string{"NAMESPACE", "SERVICE NAME", "SERVICE VIP", "WAYPOINT", "ENDPOINTS"}, func(out io.Writer) error {
			return ctl.Services(t.Context(), m.c, ctl.ListOptions{ProxyOptions: proxy}, out, io.Discard)
		}},
		{"policies", []string{"NAMESPACE", "POLICY NAME", "ACTION", "SCOPE"}, func(out io.Writer) error {
			return ctl.Policies(t.Context(), m.c, ctl.ListOptions{ProxyOptions: proxy}, out, io.Discard)
		}},
	} {
		out, err := ic.run(t, "ztunnel-config", c.what, target)
		if err != nil {
			t.Errorf("istioctl ztunnel-config %s: %v", c.what, err)
			continue
		}
		t.Logf("istioctl ztunnel-config %s %s:\n%s", c.what, target, out)
		var canopy bytes.Buffer
		if err := c.run(&canopy); err != nil {
			t.Fatal(err)
		}
		got, want := rows(t, out, c.cols...), rows(t, canopy.String(), c.cols...)
		if len(got) == 0 {
			t.Errorf("istioctl ztunnel-config %s shows no rows", c.what)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("istioctl ztunnel-config %s (-canopyctl +istioctl):\n%s", c.what, diff)
		}
	}

	// Certificates: istioctl by --node (the ztunnel pod on that node);
	// canopyctl's table has the node first and the time left last.
	out, err := ic.run(t, "ztunnel-config", "certificates", "--node", p.Spec.NodeName)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("istioctl ztunnel-config certificates --node %s:\n%s", p.Spec.NodeName, out)
	var canopy bytes.Buffer
	if err := ctl.Certificates(t.Context(), m.c, ctl.CertificatesOptions{Namespace: system, Node: p.Spec.NodeName}, &canopy, io.Discard); err != nil {
		t.Fatal(err)
	}
	certCols := []string{"CERTIFICATE NAME", "TYPE", "STATUS", "VALID CERT", "SERIAL NUMBER", "NOT AFTER", "NOT BEFORE"}
	var want [][]string
	for _, r := range rows(t, canopy.String(), append(append([]string{"NODE"}, certCols...), "EXPIRES IN")...) {
		want = append(want, r[1:len(r)-1])
	}
	got := rows(t, out, certCols...)
	// A node proxy holds certificates for the meshed pods of its node
	// (at least a leaf and a root each); the sample app may run on one
	// node only.
	if meshedPodOn(t, m, p.Spec.NodeName) && len(got) < 2 {
		t.Errorf("istioctl ztunnel-config certificates shows %d certificates on a node with meshed pods", len(got))
	}
	for _, r := range got {
		if r[3] != "true" {
			t.Errorf("istioctl shows a certificate that is not valid now: %q", r)
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("istioctl ztunnel-config certificates (-canopyctl +istioctl):\n%s", diff)
	}

	compareJSON(t, m, ic, p)
}

// compareJSON: istioctl's -o json, which decodes the dump into its
// structs and encodes those, against canopyctl's -o json, over the
// fields istioctl's structs have.
func compareJSON(t *testing.T, m *mesh, ic istioctl, p *corev1.Pod) {
	target := p.Name + "." + system
	proxy := ctl.ProxyOptions{Namespace: system, Proxy: p.Name}

	var gotW, wantW []configdump.Workload
	ic.decode(t, &gotW, "ztunnel-config", "workloads", target, "-o", "json")
	canopyJSON(t, &wantW, func(out io.Writer) error {
		return ctl.Workloads(t.Context(), m.c, ctl.WorkloadsOptions{ProxyOptions: proxy, Output: ctl.JSON}, out, io.Discard)
	})
	for i := range gotW {
		w := &gotW[i]
		// istioctl writes its zero values for these.
		if w.AppTunnel != nil && *w.AppTunnel == (configdump.ApplicationTunnel{}) {
			w.AppTunnel = nil
		}
		if w.Locality != nil && *w.Locality == (configdump.Locality{}) {
			w.Locality = nil
		}
	}
	for i := range wantW {
		w := &wantW[i]
		// Not in istioctl's struct.
		w.NetworkMode, w.Services, w.NativeTunnel = "", nil, false
		for _, g := range []*configdump.Gateway{w.Waypoint, w.NetworkGateway} {
			if g != nil {
				g.HboneMtlsPort = 0
			}
		}
	}
	sortBy(gotW, func(w configdump.Workload) string { return w.UID })
	sortBy(wantW, func(w configdump.Workload) string { return w.UID })
	if diff := cmp.Diff(wantW, gotW); diff != "" {
		t.Errorf("istioctl ztunnel-config workloads -o json (-canopyctl +istioctl):\n%s", diff)
	}
	for _, w := range gotW {
		if w.ClusterID == "" || w.Capacity == 0 || w.TrustDomain == "" || w.ServiceAccount == "" {
			t.Errorf("istioctl shows workload %s/%s without clusterId, capacity, trustDomain or serviceAccount: %+v", w.Namespace, w.Name, w)
		}
	}

	var gotS, wantS []configdump.Service
	ic.decode(t, &gotS, "ztunnel-config", "services", target, "-o", "json")
	canopyJSON(t, &wantS, func(out io.Writer) error {
		return ctl.Services(t.Context(), m.c, ctl.ListOptions{ProxyOptions: proxy, Output: ctl.JSON}, out, io.Discard)
	})
	for _, ss := range [][]configdump.Service{gotS, wantS} {
		for i := range ss {
			s := &ss[i]
			if len(s.SubjectAltNames) == 0 {
				s.SubjectAltNames = nil // istioctl leaves an empty list out
			}
			if s.Waypoint != nil {
				s.Waypoint.HboneMtlsPort = 0
			}
			for k, e := range s.Endpoints {
				e.Status = "" // not in istioctl's endpoint
				s.Endpoints[k] = e
			}
		}
	}
	sortBy(gotS, func(s configdump.Service) string { return s.Namespace + "/" + s.Hostname })
	sortBy(wantS, func(s configdump.Service) string { return s.Namespace + "/" + s.Hostname })
	if diff := cmp.Diff(wantS, gotS); diff != "" {
		t.Errorf("istioctl ztunnel-config services -o json (-canopyctl +istioctl):\n%s", diff)
	}

	var gotC []configdump.CertState
	var wantC []view.NodeCertificates
	ic.decode(t, &gotC, "ztunnel-config", "certificates", "--node", p.Spec.NodeName, "-o", "json")
	canopyJSON(t, &wantC, func(out io.Writer) error {
		return ctl.Certificates(t.Context(), m.c, ctl.CertificatesOptions{Namespace: system, Node: p.Spec.NodeName, Output: ctl.JSON}, out, io.Discard)
	})
	if len(wantC) != 1 {
		t.Fatalf("canopyctl certificates --node %s: %d node proxies", p.Spec.NodeName, len(wantC))
	}
	if diff := cmp.Diff(wantC[0].Certs, gotC); diff != "" {
		t.Errorf("istioctl ztunnel-config certificates -o json (-canopyctl +istioctl):\n%s", diff)
	}
	for _, c := range gotC {
		for _, x := range append(slices.Clone(c.CertChain), c.RootCerts...) {
			if _, err := configdump.ParsePEM(x.PEM); err != nil {
				t.Errorf("istioctl shows a certificate of %s whose pem does not decode: %v", c.Identity, err)
			}
		}
	}
}

// istioctl runs Istio's istioctl against the cluster, with a HOME of its
// own (it writes its configuration and caches there).
type istioctl struct{ bin, kubeconfig, home string }

func (ic istioctl) run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, ic.bin, append(args, "--kubeconfig", ic.kubeconfig)...)
	cmd.Env = append(os.Environ(), "HOME="+ic.home)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("istioctl %s: %w\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

func (ic istioctl) decode(t *testing.T, v any, args ...string) {
	t.Helper()
	out, err := ic.run(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("decode istioctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func canopyJSON(t *testing.T, v any, run func(io.Writer) error) {
	t.Helper()
	var out bytes.Buffer
	if err := run(&out); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(out.Bytes(), v); err != nil {
		t.Fatalf("decode canopyctl's JSON: %v\n%s", err, out.String())
	}
}

func sortBy[T any](xs []T, key func(T) string) {
	slices.SortFunc(xs, func(a, b T) int { return strings.Compare(key(a), key(b)) })
}

// rows parses an aligned table (istioctl's and canopyctl's tabwriter
// output) whose header is exactly cols, cutting each line at the
// columns' starts in the header; the rows are sorted.
func rows(t *testing.T, out string, cols ...string) [][]string {
	t.Helper()
	header, rs := table(t, out)
	if !slices.Equal(header, cols) {
		t.Fatalf("table header %q, want %q:\n%s", header, cols, out)
	}
	slices.SortFunc(rs, func(a, b []string) int { return slices.Compare(a, b) })
	return rs
}

// table parses an aligned table: its header's column names (cut where a
// name starts after two spaces or more, or one space when the next word
// starts a known column) and its rows, cut at the same places.
func table(t *testing.T, out string) ([]string, [][]string) {
	t.Helper()
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) == 0 || lines[0] == "" {
		t.Fatalf("no table in %q", out)
	}
	h := lines[0]
	var starts []int
	for i := range len(h) {
		if h[i] != ' ' && (i == 0 || h[i-1] == ' ') && !continuesName(h, i) {
			starts = append(starts, i)
		}
	}
	cut := func(line string) []string {
		cells := make([]string, len(starts))
		for j, s := range starts {
			end := len(line)
			if j+1 < len(starts) {
				end = min(starts[j+1], len(line))
			}
			if s < end {
				cells[j] = strings.TrimSpace(line[s:end])
			}
		}
		return cells
	}
	var rs [][]string
	for _, l := range lines[1:] {
		if strings.TrimSpace(l) != "" {
			rs = append(rs, cut(l))
		}
	}
	return cut(h), rs
}

// continuesName reports whether the word at h[i] is the second word of a
// two-word column name ("POD NAME", "SERVICE VIP", "VALID CERT", ...)
// rather than a column of its own: one space before it, and the pair is
// a name istioctl or canopyctl prints.
func continuesName(h string, i int) bool {
	if i < 2 || h[i-2] == ' ' {
		return false
	}
	prev := strings.LastIndexByte(h[:i-1], ' ') + 1
	next := strings.IndexByte(h[i:], ' ')
	if next < 0 {
		next = len(h) - i
	}
	switch h[prev:i-1] + " " + h[i:i+next] {
	case "POD NAME", "SERVICE NAME", "SERVICE VIP", "POLICY NAME", "CERTIFICATE NAME", "VALID CERT", "SERIAL NUMBER",
		"NOT AFTER", "NOT BEFORE", "EXPIRES IN", "SUBSCRIBED TYPES", "SERVICE ACCOUNT", "NOT SENT":
		return true
	}
	return false
}

// meshedPodOn reports whether a pod of the sample app's ambient
// namespace runs on node.
func meshedPodOn(t *testing.T, m *mesh, node string) bool {
	t.Helper()
	for _, p := range m.pods(t, "demo", "") {
		if p.Spec.NodeName == node {
			return true
		}
	}
	return false
}

func findRow(rs [][]string, name string) []string {
	for _, r := range rs {
		if len(r) > 0 && r[0] == name {
			return r
		}
	}
	return nil
}
