package chart_test

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/canopy-mesh/canopy/deploy/charts"
	"github.com/canopy-mesh/canopy/internal/chart"
	"github.com/canopy-mesh/canopy/internal/kubeapply"
	"github.com/canopy-mesh/canopy/internal/testing/golden"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
)

var env *testenv.Environment

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

func render(t *testing.T, opts chart.Options) *chart.Rendered {
	t.Helper()
	r, err := chart.Render(charts.Canopy(), opts)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	return r
}

// TestRenderGolden pins what the default values and a revision's release
// render to, so a template change shows up in review as a manifest diff.
func TestRenderGolden(t *testing.T) {
	for _, tt := range []struct {
		file string
		set  []string
	}{
		{"default.golden.yaml", nil},
		{"revision.golden.yaml", []string{"revision=canary"}},
	} {
		t.Run(tt.file, func(t *testing.T) {
			r := render(t, chart.Options{Namespace: "istio-system", Version: "1.2.3", Set: tt.set})
			var b strings.Builder
			for _, o := range r.Objects {
				y, err := yaml.Marshal(o.Object)
				if err != nil {
					t.Fatal(err)
				}
				b.WriteString("---\n")
				b.Write(y)
			}
			golden.Check(t, tt.file, []byte(b.String()))
		})
	}
}

func TestRenderShape(t *testing.T) {
	r := render(t, chart.Options{Namespace: "canopy-system", Version: "v0.9.0", Set: []string{"image.hub=example/mesh"}})
	var got []string
	images := map[string]string{}
	for _, o := range r.Objects {
		got = append(got, kubeapply.Describe(o))
		if o.GetKind() == "Deployment" || o.GetKind() == "DaemonSet" {
			cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
			images[o.GetName()] = cs[0].(map[string]any)["image"].(string)
		}
	}
	want := []string{
		"ServiceAccount canopy-system/canopy-cni-agent",
		"ServiceAccount canopy-system/canopy-controller",
		"ServiceAccount canopy-system/canopy-node",
		"ClusterRole canopy-cni-agent-canopy-system",
		"ClusterRole canopy-controller-canopy-system",
		"ClusterRoleBinding canopy-cni-agent-canopy-system",
		"ClusterRoleBinding canopy-controller-canopy-system",
		"Role canopy-system/canopy-cni-agent",
		"Role canopy-system/canopy-controller",
		"RoleBinding canopy-system/canopy-cni-agent",
		"RoleBinding canopy-system/canopy-controller",
		"Service canopy-system/canopy-controller",
		"PodDisruptionBudget canopy-system/canopy-controller",
		"Deployment canopy-system/canopy-controller",
		"DaemonSet canopy-system/canopy-cni-agent",
		"DaemonSet canopy-system/ztunnel",
		"MutatingWebhookConfiguration istio-sidecar-injector",
		"ValidatingWebhookConfiguration istio-validator-canopy-system",
		"ValidatingWebhookConfiguration istiod-default-validator",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("objects (-want +got):\n%s", diff)
	}
	wantImages := map[string]string{
		"canopy-controller": "example/mesh/canopy-controller:v0.9.0",
		"canopy-cni-agent":  "example/mesh/canopy-cni-agent:v0.9.0",
		"ztunnel":           "example/mesh/canopy-node:v0.9.0", // the DaemonSet is named as Istio's node proxy
	}
	if diff := cmp.Diff(wantImages, images); diff != "" {
		t.Errorf("images (-want +got):\n%s", diff)
	}
	if len(r.CRDs) < 3 {
		t.Errorf("%d CRDs, want Istio's and the Gateway API's", len(r.CRDs))
	}
}

// TestComponentImageTags: a component's imageTag overrides image.tag for
// its image and its version label only, so that an upgrade can move one
// component at a time.
func TestComponentImageTags(t *testing.T) {
	for _, tt := range []struct {
		name string
		set  []string
		want map[string]string
	}{
		{"chart version", nil, map[string]string{"canopy-controller": "v0.9.0", "canopy-cni-agent": "v0.9.0", "ztunnel": "v0.9.0"}},
		{"image.tag", []string{"image.tag=v1"}, map[string]string{"canopy-controller": "v1", "canopy-cni-agent": "v1", "ztunnel": "v1"}},
		{"the node proxy alone", []string{"image.tag=v1", "node.imageTag=v2"}, map[string]string{"canopy-controller": "v1", "canopy-cni-agent": "v1", "ztunnel": "v2"}},
		{"each its own", []string{"controller.imageTag=c", "cniAgent.imageTag=a", "node.imageTag=n"}, map[string]string{"canopy-controller": "c", "canopy-cni-agent": "a", "ztunnel": "n"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := render(t, chart.Options{Namespace: "istio-system", Version: "v0.9.0", Set: tt.set})
			got := map[string]string{}
			for _, o := range r.Objects {
				if o.GetKind() != "Deployment" && o.GetKind() != "DaemonSet" {
					continue
				}
				cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
				image := cs[0].(map[string]any)["image"].(string)
				tag := image[strings.LastIndex(image, ":")+1:]
				labels, _, _ := unstructured.NestedStringMap(o.Object, "spec", "template", "metadata", "labels")
				if v := labels["app.kubernetes.io/version"]; v != tag {
					t.Errorf("%s: image tag %q, version label %q", o.GetName(), tag, v)
				}
				got[o.GetName()] = tag
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("image tags (-want +got):\n%s", diff)
			}
		})
	}
	if _, err := chart.Render(charts.Canopy(), chart.Options{Namespace: "istio-system", Set: []string{"node.imageTag=bad tag"}}); err == nil {
		t.Error("node.imageTag=\"bad tag\" rendered; want the schema to refuse it")
	}
}

// TestNodeProxyHandOver: the node proxy's DaemonSet rolls with a surge
// (the new proxy ready beside the old one before the old one stops),
// nothing in its pod keeps two of them off one node, and the kubelet
// gives a stopping proxy its drain period and 5s more.
func TestNodeProxyHandOver(t *testing.T) {
	for _, tt := range []struct {
		name      string
		set       []string
		wantDrain string
		wantGrace float64
	}{
		{"defaults", nil, "--drain-period=20s", 30},
		{"a longer drain with its grace", []string{"node.drainPeriodSeconds=120", "node.terminationGracePeriodSeconds=125"}, "--drain-period=120s", 125},
		{"no drain", []string{"node.drainPeriodSeconds=0", "node.terminationGracePeriodSeconds=5"}, "--drain-period=0s", 5},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := render(t, chart.Options{Namespace: "istio-system", Set: tt.set})
			i := slices.IndexFunc(r.Objects, func(o *unstructured.Unstructured) bool { return o.GetKind() == "DaemonSet" && o.GetName() == "ztunnel" })
			if i < 0 {
				t.Fatal("no node proxy DaemonSet")
			}
			ds := r.Objects[i].Object
			strategy, _, _ := unstructured.NestedMap(ds, "spec", "updateStrategy")
			// Decoded as JSON: numbers are float64.
			if diff := cmp.Diff(map[string]any{"type": "RollingUpdate", "rollingUpdate": map[string]any{"maxSurge": 1.0, "maxUnavailable": 0.0}}, strategy); diff != "" {
				t.Errorf("updateStrategy (-want +got):\n%s", diff)
			}
			spec, _, _ := unstructured.NestedMap(ds, "spec", "template", "spec")
			if spec["hostNetwork"] == true {
				t.Error("hostNetwork: two proxies on a node would fight for the ports")
			}
			if grace := spec["terminationGracePeriodSeconds"]; grace != tt.wantGrace {
				t.Errorf("terminationGracePeriodSeconds = %v, want %v", grace, tt.wantGrace)
			}
			containers, _, _ := unstructured.NestedSlice(spec, "containers")
			c := containers[0].(map[string]any)
			args, _, _ := unstructured.NestedStringSlice(c, "args")
			if !slices.Contains(args, tt.wantDrain) {
				t.Errorf("args %q, want %s", args, tt.wantDrain)
			}
			ports, _, _ := unstructured.NestedSlice(c, "ports")
			for _, p := range ports {
				if _, ok := p.(map[string]any)["hostPort"]; ok {
					t.Errorf("port %v binds a host port: a second proxy on the node could not start", p)
				}
			}
		})
	}
}

// TestControllerReplicas: the controller runs as several replicas that
// roll one at a time with a surge (never fewer ready than asked for),
// prefer different nodes, are kept from being evicted all at once by a
// budget (only when there are several), and may renew their revision's
// Lease and no other.
func TestControllerReplicas(t *testing.T) {
	for _, tt := range []struct {
		name         string
		set          []string
		wantReplicas float64
		wantPDB      bool
		wantLease    string
		wantRev      string
	}{
		{"defaults", nil, 2, true, "canopy-controller", "default"},
		{"one replica, no budget", []string{"controller.replicas=1"}, 1, false, "canopy-controller", "default"},
		{"three", []string{"controller.replicas=3"}, 3, true, "canopy-controller", "default"},
		{"a revision has its own lease", []string{"revision=canary"}, 2, true, "canopy-controller-canary", "canary"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := render(t, chart.Options{Namespace: "istio-system", Set: tt.set})
			find := func(kind, name string) *unstructured.Unstructured {
				i := slices.IndexFunc(r.Objects, func(o *unstructured.Unstructured) bool { return o.GetKind() == kind && o.GetName() == name })
				if i < 0 {
					return nil
				}
				return r.Objects[i]
			}
			// A revision's objects carry its name.
			name := "canopy-controller"
			if tt.wantRev != "default" {
				name += "-" + tt.wantRev
			}
			d := find("Deployment", name)
			if d == nil {
				t.Fatal("no controller Deployment")
			}
			spec, _, _ := unstructured.NestedMap(d.Object, "spec")
			if spec["replicas"] != tt.wantReplicas {
				t.Errorf("replicas = %v, want %v", spec["replicas"], tt.wantReplicas)
			}
			// Decoded as JSON: numbers are float64.
			if diff := cmp.Diff(map[string]any{"type": "RollingUpdate", "rollingUpdate": map[string]any{"maxSurge": 1.0, "maxUnavailable": 0.0}}, spec["strategy"]); diff != "" {
				t.Errorf("strategy (-want +got):\n%s", diff)
			}
			anti, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "affinity", "podAntiAffinity", "preferredDuringSchedulingIgnoredDuringExecution")
			wantAnti := []any{map[string]any{"weight": 100.0, "podAffinityTerm": map[string]any{
				"topologyKey":   "kubernetes.io/hostname",
				"labelSelector": map[string]any{"matchLabels": map[string]any{"app": "istiod", "istio.io/rev": tt.wantRev}},
			}}}
			if diff := cmp.Diff(wantAnti, anti); diff != "" {
				t.Errorf("preferred pod anti-affinity (-want +got):\n%s", diff)
			}
			containers, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
			args, _, _ := unstructured.NestedStringSlice(containers[0].(map[string]any), "args")
			if want := "--leader-election-lease=" + tt.wantLease; !slices.Contains(args, want) {
				t.Errorf("args %q lack %s", args, want)
			}
			pdb := find("PodDisruptionBudget", name)
			if (pdb != nil) != tt.wantPDB {
				t.Errorf("PodDisruptionBudget rendered: %v, want %v", pdb != nil, tt.wantPDB)
			}
			if pdb != nil {
				if got, _, _ := unstructured.NestedFieldNoCopy(pdb.Object, "spec", "maxUnavailable"); got != 1.0 {
					t.Errorf("PodDisruptionBudget maxUnavailable = %v, want 1 (one replica keeps serving)", got)
				}
			}
			role := find("Role", name)
			if role == nil {
				t.Fatal("no controller Role")
			}
			rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
			var leaseRules []any
			for _, rule := range rules {
				if groups, _ := rule.(map[string]any)["apiGroups"].([]any); slices.Contains(groups, any("coordination.k8s.io")) {
					leaseRules = append(leaseRules, rule)
				}
			}
			wantRules := []any{
				map[string]any{"apiGroups": []any{"coordination.k8s.io"}, "resources": []any{"leases"}, "verbs": []any{"create"}},
				map[string]any{"apiGroups": []any{"coordination.k8s.io"}, "resources": []any{"leases"}, "resourceNames": []any{tt.wantLease}, "verbs": []any{"get", "update"}},
			}
			if diff := cmp.Diff(wantRules, leaseRules); diff != "" {
				t.Errorf("Role rules on leases (-want +got):\n%s", diff)
			}
		})
	}
}

// TestBadValuesRejected: the schema turns mistakes away with the path of
// the value, before anything reaches a cluster.
func TestBadValuesRejected(t *testing.T) {
	for _, tt := range []struct {
		name string
		set  string
		want string
	}{
		{"unknown backend", "cniAgent.backend=bpf", "/cniAgent/backend"},
		{"bad duration", "controller.pushQuiet=fast", "/controller/pushQuiet"},
		{"misspelt key", "node.certTtl=1h", "certTtl"},
		{"zero replicas", "controller.replicas=0", "/controller/replicas"},
		{"bad log level", "node.logLevel=trace", "/node/logLevel"},
		{"relative CNI dir", "cniAgent.cniConfDir=etc/cni", "/cniAgent/cniConfDir"},
		{"bad set syntax", "controller.replicas", "controller.replicas"},
		{"drain period as a duration", "node.drainPeriodSeconds=5s", "/node/drainPeriodSeconds"},
		{"the former drain value", "node.drainPeriod=5s", "drainPeriod"},
		{"no time to stop after the drain", "node.drainPeriodSeconds=26", "node.terminationGracePeriodSeconds (30) must be at least node.drainPeriodSeconds (26) + 5"},
		{"revision named default", "revision=default", "/revision"},
		{"revision not a DNS label", "revision=Canary", "/revision"},
		{"revision too long for the Service name", "revision=" + strings.Repeat("a", 46), "/revision"},
		{"node proxies on a bad revision", "node.controllerRevision=1.2", "/node/controllerRevision"},
		{"the injector's former revision value", "injection.revision=canary", "revision"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := chart.Render(charts.Canopy(), chart.Options{Namespace: "istio-system", Set: []string{tt.set}})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Render(--set %s) = %v, want an error naming %q", tt.set, err, tt.want)
			}
		})
	}
	if _, err := chart.Render(charts.Canopy(), chart.Options{}); err == nil {
		t.Error("Render without a namespace succeeded")
	}
}

// TestAcceptedByAPIServer applies every rendered object and CRD as a
// server-side dry run: schema, defaulting, validation and admission of a
// real API server.
func TestAcceptedByAPIServer(t *testing.T) {
	testenv.Need(t, env)
	ns := env.Namespace(t, "chart", nil)
	r := render(t, chart.Options{Namespace: ns, Version: "0.0.0-test"})
	canary := render(t, chart.Options{Namespace: ns, Version: "0.0.0-test", Set: []string{"revision=canary"}})
	a, err := kubeapply.New(env.Config, kubeapply.Options{DryRun: true, FieldManager: "chart-test"})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Apply(t.Context(), append(r.CRDs, r.Objects...)); err != nil {
		t.Fatal(err)
	}
	if err := a.Apply(t.Context(), canary.Objects); err != nil {
		t.Fatalf("a revision's release: %v", err)
	}
}

// controllerPorts returns the controller's container args, container
// ports and Service ports of a render (of any revision).
func controllerPorts(t *testing.T, r *chart.Rendered) (args []string, container, service []int64) {
	t.Helper()
	for _, o := range r.Objects {
		if o.GetLabels()["app.kubernetes.io/name"] != "canopy-controller" {
			continue
		}
		switch o.GetKind() {
		case "Deployment":
			cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
			c := cs[0].(map[string]any)
			for _, a := range c["args"].([]any) {
				args = append(args, a.(string))
			}
			for _, p := range c["ports"].([]any) {
				container = append(container, int64(p.(map[string]any)["containerPort"].(float64)))
			}
		case "Service":
			ps, _, _ := unstructured.NestedSlice(o.Object, "spec", "ports")
			for _, p := range ps {
				service = append(service, int64(p.(map[string]any)["port"].(float64)))
			}
		}
	}
	return args, container, service
}

// TestPlaintextXDS: plaintext xDS (15010) carries bearer tokens in clear
// text. It is off by default; on, it listens on the pod's loopback and is
// not exposed; only remote: true exposes it.
func TestPlaintextXDS(t *testing.T) {
	for _, tt := range []struct {
		name               string
		set                []string
		wantArgs           []string
		container, service []int64
	}{
		{"off by default", nil, nil, []int64{15012, 15014, 15017}, []int64{15012, 15014, 443}},
		{"on, loopback", []string{"controller.plaintextXDS.enabled=true"}, []string{"--xds-addr=127.0.0.1:15010"}, []int64{15012, 15014, 15017}, []int64{15012, 15014, 443}},
		{"on, remote", []string{"controller.plaintextXDS.enabled=true", "controller.plaintextXDS.remote=true"},
			[]string{"--xds-addr=:15010", "--xds-plaintext-remote"}, []int64{15010, 15012, 15014, 15017}, []int64{15010, 15012, 15014, 443}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			args, container, service := controllerPorts(t, render(t, chart.Options{Namespace: "istio-system", Set: tt.set}))
			var got []string
			for _, a := range args {
				if strings.HasPrefix(a, "--xds-addr") || strings.HasPrefix(a, "--xds-plaintext") {
					got = append(got, a)
				}
			}
			if diff := cmp.Diff(tt.wantArgs, got); diff != "" {
				t.Errorf("plaintext xDS args (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.container, container); diff != "" {
				t.Errorf("container ports (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.service, service); diff != "" {
				t.Errorf("Service ports (-want +got):\n%s", diff)
			}
		})
	}
}

// injector returns the rendered MutatingWebhookConfiguration, or nil.
// TestSidecarCapture: the CNI agent installs sidecar capture unless
// cniAgent.sidecarCapture says not to.
func TestSidecarCapture(t *testing.T) {
	for _, tt := range []struct {
		set  []string
		want string
	}{
		{nil, "--sidecar-capture=true"},
		{[]string{"cniAgent.sidecarCapture=false"}, "--sidecar-capture=false"},
	} {
		r := render(t, chart.Options{Namespace: "mesh", Set: tt.set})
		var args []any
		for _, o := range r.Objects {
			if o.GetKind() == "DaemonSet" && o.GetName() == "canopy-cni-agent" {
				cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
				args, _, _ = unstructured.NestedSlice(cs[0].(map[string]any), "args")
			}
		}
		if !slices.Contains(args, any(tt.want)) {
			t.Errorf("--set %v: canopy-cni-agent args %v, want %s", tt.set, args, tt.want)
		}
	}
}

// TestEBPFBackend: with the eBPF backend both DaemonSets mount the node's
// BPF filesystem, the agent's with bidirectional propagation (a BPF
// filesystem it mounts must outlive it), the proxy's from the host; with
// the others only the agent does, to take over pods the eBPF backend
// left, bidirectionally as long as it pins the port guard there.
func TestEBPFBackend(t *testing.T) {
	for _, tt := range []struct {
		backend string
		set     []string
		want    map[string]string // DaemonSet: propagation of its /sys/fs/bpf mount
	}{
		{"nftables", nil, map[string]string{"canopy-cni-agent": "Bidirectional"}},
		{"nftables", []string{"cniAgent.guardProxyPorts=false"}, map[string]string{"canopy-cni-agent": "HostToContainer"}},
		{"iptables", []string{"cniAgent.guardProxyPorts=false"}, map[string]string{"canopy-cni-agent": "HostToContainer"}},
		{"ebpf", nil, map[string]string{"canopy-cni-agent": "Bidirectional", "ztunnel": "HostToContainer"}},
		{"ebpf", []string{"cniAgent.guardProxyPorts=false"}, map[string]string{"canopy-cni-agent": "Bidirectional", "ztunnel": "HostToContainer"}},
	} {
		r := render(t, chart.Options{Namespace: "mesh", Set: append([]string{"cniAgent.backend=" + tt.backend}, tt.set...)})
		got := map[string]string{}
		for _, name := range []string{"canopy-cni-agent", "ztunnel"} {
			ds := object(t, r, "DaemonSet", name)
			cs, _, _ := unstructured.NestedSlice(ds, "spec", "template", "spec", "containers")
			mounts, _, _ := unstructured.NestedSlice(cs[0].(map[string]any), "volumeMounts")
			vols, _, _ := unstructured.NestedSlice(ds, "spec", "template", "spec", "volumes")
			for _, m := range mounts {
				m := m.(map[string]any)
				if m["mountPath"] != "/sys/fs/bpf" {
					continue
				}
				got[name], _ = m["mountPropagation"].(string)
				found := false
				for _, v := range vols {
					v := v.(map[string]any)
					path, _, _ := unstructured.NestedString(v, "hostPath", "path")
					found = found || (v["name"] == m["name"] && path == "/sys/fs/bpf")
				}
				if !found {
					t.Errorf("%s %s: the /sys/fs/bpf mount is not the host's /sys/fs/bpf", tt.backend, name)
				}
			}
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("backend %s: /sys/fs/bpf mounts (-want +got):\n%s", tt.backend, diff)
		}
		// The proxy answers an eBPF pod's DNS from port 53 of the server
		// the app asked.
		cs, _, _ := unstructured.NestedSlice(object(t, r, "DaemonSet", "ztunnel"), "spec", "template", "spec", "containers")
		caps, _, _ := unstructured.NestedStringSlice(cs[0].(map[string]any), "securityContext", "capabilities", "add")
		if got, want := slices.Contains(caps, "NET_BIND_SERVICE"), tt.backend == "ebpf"; got != want {
			t.Errorf("backend %s: node proxy capabilities %v, NET_BIND_SERVICE wanted: %v", tt.backend, caps, want)
		}
	}
}

// TestGuardProxyPorts: the agent guards the node proxy's ports by
// default, attached to the host's cgroup2 hierarchy, mounted read-only
// where the flag says; off, it has neither.
func TestGuardProxyPorts(t *testing.T) {
	for _, tt := range []struct {
		set       []string
		wantArgs  []string
		wantMount bool
	}{
		{nil, []string{"--guard-proxy-ports=true", "--cgroup-root=/host/sys/fs/cgroup"}, true},
		{[]string{"cniAgent.guardProxyPorts=false"}, []string{"--guard-proxy-ports=false"}, false},
	} {
		r := render(t, chart.Options{Namespace: "mesh", Set: tt.set})
		ds := object(t, r, "DaemonSet", "canopy-cni-agent")
		cs, _, _ := unstructured.NestedSlice(ds, "spec", "template", "spec", "containers")
		args, _, _ := unstructured.NestedStringSlice(cs[0].(map[string]any), "args")
		for _, a := range tt.wantArgs {
			if !slices.Contains(args, a) {
				t.Errorf("--set %v: args %v lack %s", tt.set, args, a)
			}
		}
		if !tt.wantMount && slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--cgroup-root") }) {
			t.Errorf("--set %v: args %v have --cgroup-root", tt.set, args)
		}
		mounts, _, _ := unstructured.NestedSlice(cs[0].(map[string]any), "volumeMounts")
		vols, _, _ := unstructured.NestedSlice(ds, "spec", "template", "spec", "volumes")
		mounted := false
		for _, m := range mounts {
			m := m.(map[string]any)
			if m["mountPath"] != "/host/sys/fs/cgroup" {
				continue
			}
			mounted = true
			if m["readOnly"] != true {
				t.Errorf("--set %v: the cgroup mount is not read-only", tt.set)
			}
			for _, v := range vols {
				v := v.(map[string]any)
				if path, _, _ := unstructured.NestedString(v, "hostPath", "path"); v["name"] == m["name"] && path != "/sys/fs/cgroup" {
					t.Errorf("--set %v: the cgroup mount is the host's %s", tt.set, path)
				}
			}
		}
		if mounted != tt.wantMount {
			t.Errorf("--set %v: /host/sys/fs/cgroup mounted %v, want %v", tt.set, mounted, tt.wantMount)
		}
	}
}

func injector(r *chart.Rendered) *unstructured.Unstructured {
	for _, o := range r.Objects {
		if o.GetKind() == "MutatingWebhookConfiguration" {
			return o
		}
	}
	return nil
}

// TestInjection: the injection webhook's configuration, the controller's
// flags and ports, and the RBAC that lets it patch the caBundle follow
// injection.*.
func TestInjection(t *testing.T) {
	for _, tt := range []struct {
		name      string
		set       []string
		config    string // "" for none
		webhooks  []string
		wantArgs  []string
		container []int64
		service   []int64
	}{
		{
			name: "default", config: "istio-sidecar-injector",
			webhooks: []string{"rev.namespace.sidecar-injector.istio.io", "rev.object.sidecar-injector.istio.io",
				"namespace.sidecar-injector.istio.io", "object.sidecar-injector.istio.io"},
			wantArgs:  []string{"--webhook-addr=:15017", "--proxy-hub=istio", "--proxy-tag=1.32.0", "--inject-cni"},
			container: []int64{15012, 15014, 15017}, service: []int64{15012, 15014, 443},
		},
		{
			name: "image, revision, native sidecars, istio-init", config: "istio-sidecar-injector-canary",
			set: []string{"revision=canary", "injection.proxy.hub=example.test/istio", "injection.proxy.tag=1.0.0",
				"injection.cni=false", "injection.nativeSidecars=true"},
			webhooks: []string{"rev.namespace.sidecar-injector.istio.io", "rev.object.sidecar-injector.istio.io"},
			wantArgs: []string{"--revision=canary", "--webhook-addr=:15017", "--proxy-hub=example.test/istio", "--proxy-tag=1.0.0",
				"--inject-native-sidecars"},
			container: []int64{15012, 15014, 15017}, service: []int64{15012, 15014, 443},
		},
		{
			name: "inject selectors", config: "istio-sidecar-injector",
			set: []string{"injection.neverInjectSelector[0].matchLabels.app=batch",
				"injection.alwaysInjectSelector[0].matchExpressions[0].key=mesh", "injection.alwaysInjectSelector[0].matchExpressions[0].operator=Exists"},
			webhooks: []string{"rev.namespace.sidecar-injector.istio.io", "rev.object.sidecar-injector.istio.io",
				"namespace.sidecar-injector.istio.io", "object.sidecar-injector.istio.io"},
			wantArgs: []string{"--webhook-addr=:15017", "--proxy-hub=istio", "--proxy-tag=1.32.0", "--inject-cni",
				`--never-inject-selector=[{"matchLabels":{"app":"batch"}}]`,
				`--always-inject-selector=[{"matchExpressions":[{"key":"mesh","operator":"Exists"}]}]`},
			container: []int64{15012, 15014, 15017}, service: []int64{15012, 15014, 443},
		},
		{
			name: "disabled, validation served", set: []string{"injection.enabled=false"},
			wantArgs:  []string{"--webhook-addr=:15017"},
			container: []int64{15012, 15014, 15017}, service: []int64{15012, 15014, 443},
		},
		{
			name: "disabled, validation too", set: []string{"injection.enabled=false", "validation.enabled=false"},
			wantArgs:  []string{"--validation-webhook=false", "--webhook-addr="},
			container: []int64{15012, 15014}, service: []int64{15012, 15014},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := render(t, chart.Options{Namespace: "mesh", Set: tt.set})
			args, container, service := controllerPorts(t, r)
			var got []string
			for _, a := range args {
				for _, p := range []string{"--webhook", "--validation-webhook", "--revision", "--proxy-", "--inject-", "--never-inject-", "--always-inject-"} {
					if strings.HasPrefix(a, p) {
						got = append(got, a)
					}
				}
			}
			if diff := cmp.Diff(tt.wantArgs, got); diff != "" {
				t.Errorf("webhook args (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.container, container); diff != "" {
				t.Errorf("container ports (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.service, service); diff != "" {
				t.Errorf("Service ports (-want +got):\n%s", diff)
			}
			cfg := injector(r)
			if tt.config == "" {
				if cfg != nil {
					t.Fatalf("injection disabled, but %s is rendered", cfg.GetName())
				}
				return
			}
			if cfg == nil || cfg.GetName() != tt.config {
				t.Fatalf("webhook configuration %v, want %s", cfg, tt.config)
			}
			rev, svcName := "default", "canopy-controller"
			if strings.HasSuffix(tt.config, "-canary") {
				rev, svcName = "canary", "canopy-controller-canary"
			}
			if got := cfg.GetLabels()["istio.io/rev"]; got != rev {
				t.Errorf("istio.io/rev label %q, want %q", got, rev)
			}
			whs, _, _ := unstructured.NestedSlice(cfg.Object, "webhooks")
			var names []string
			for _, w := range whs {
				w := w.(map[string]any)
				names = append(names, w["name"].(string))
				svc, _, _ := unstructured.NestedMap(w, "clientConfig", "service")
				if svc["name"] != svcName || svc["namespace"] != "mesh" || svc["path"] != "/inject" || svc["port"] != float64(443) {
					t.Errorf("%s: clientConfig.service %v", w["name"], svc)
				}
				if w["failurePolicy"] != "Fail" || w["sideEffects"] != "None" || w["reinvocationPolicy"] != "Never" {
					t.Errorf("%s: failurePolicy %v, sideEffects %v, reinvocationPolicy %v", w["name"], w["failurePolicy"], w["sideEffects"], w["reinvocationPolicy"])
				}
				// The release namespace is never sent to the webhook.
				exprs, _, _ := unstructured.NestedSlice(w, "namespaceSelector", "matchExpressions")
				excluded := false
				for _, e := range exprs {
					e := e.(map[string]any)
					if e["key"] == "kubernetes.io/metadata.name" && e["operator"] == "NotIn" && cmp.Equal(e["values"], []any{"mesh"}) {
						excluded = true
					}
				}
				if !excluded {
					t.Errorf("%s: the release namespace is not excluded: %v", w["name"], exprs)
				}
			}
			if diff := cmp.Diff(tt.webhooks, names); diff != "" {
				t.Errorf("webhooks (-want +got):\n%s", diff)
			}
		})
	}
}

// TestValidation: the validating webhook's configurations are Istio's
// (names, webhook names, rules, selectors, failing open until the
// controller closes them, no caBundle), the controller may patch exactly
// them and send its dry-run probe, and validation.enabled=false leaves
// them out and tells the controller.
func TestValidation(t *testing.T) {
	for _, tt := range []struct {
		name string
		set  []string
		// want are the configurations, each with its webhook and the
		// objectSelector values ("" for none).
		want     map[string][2]string
		service  string
		wantArgs []string
	}{
		{
			name: "default revision",
			want: map[string][2]string{
				"istio-validator-mesh":     {"rev.validation.istio.io", "default"},
				"istiod-default-validator": {"validation.istio.io", ""},
			},
			service: "canopy-controller",
		},
		{
			name: "canary", set: []string{"revision=canary"},
			want:    map[string][2]string{"istio-validator-canary-mesh": {"rev.validation.istio.io", "canary"}},
			service: "canopy-controller-canary", wantArgs: nil,
		},
		{name: "disabled", set: []string{"validation.enabled=false"}, wantArgs: []string{"--validation-webhook=false"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := render(t, chart.Options{Namespace: "mesh", Set: tt.set})
			got := map[string][2]string{}
			for _, o := range r.Objects {
				if o.GetKind() != "ValidatingWebhookConfiguration" {
					continue
				}
				rev := "default"
				if tt.service == "canopy-controller-canary" {
					rev = "canary"
				}
				if l := o.GetLabels()["istio.io/rev"]; l != rev {
					t.Errorf("%s: istio.io/rev %q, want %q (the controller patches its revision's alone)", o.GetName(), l, rev)
				}
				whs, _, _ := unstructured.NestedSlice(o.Object, "webhooks")
				if len(whs) != 1 {
					t.Fatalf("%s: %d webhooks, want 1", o.GetName(), len(whs))
				}
				w := whs[0].(map[string]any)
				var selected string
				if exprs, _, _ := unstructured.NestedSlice(w, "objectSelector", "matchExpressions"); len(exprs) == 1 {
					e := exprs[0].(map[string]any)
					if e["key"] == "istio.io/rev" && e["operator"] == "In" && len(e["values"].([]any)) == 1 {
						selected = e["values"].([]any)[0].(string)
					}
				}
				got[o.GetName()] = [2]string{w["name"].(string), selected}
				svc, _, _ := unstructured.NestedMap(w, "clientConfig", "service")
				if svc["name"] != tt.service || svc["namespace"] != "mesh" || svc["path"] != "/validate" || svc["port"] != float64(443) {
					t.Errorf("%s: clientConfig.service %v", o.GetName(), svc)
				}
				if _, ok, _ := unstructured.NestedString(w, "clientConfig", "caBundle"); ok {
					t.Errorf("%s: the chart sets a caBundle", o.GetName())
				}
				if w["failurePolicy"] != "Ignore" || w["sideEffects"] != "None" {
					t.Errorf("%s: failurePolicy %v, sideEffects %v, want Ignore (until the controller closes it) and None (dry runs are sent)",
						o.GetName(), w["failurePolicy"], w["sideEffects"])
				}
				wantRules := []any{map[string]any{
					"operations":  []any{"CREATE", "UPDATE"},
					"apiGroups":   []any{"security.istio.io", "networking.istio.io", "telemetry.istio.io", "extensions.istio.io"},
					"apiVersions": []any{"*"}, "resources": []any{"*"},
				}}
				if diff := cmp.Diff(wantRules, w["rules"]); diff != "" {
					t.Errorf("%s: rules (-want +got):\n%s", o.GetName(), diff)
				}
			}
			if diff := cmp.Diff(tt.want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("validating configurations (-want +got):\n%s", diff)
			}
			args, _, _ := controllerPorts(t, r)
			var flags []string
			for _, a := range args {
				if strings.HasPrefix(a, "--validation-webhook") {
					flags = append(flags, a)
				}
			}
			if diff := cmp.Diff(tt.wantArgs, flags); diff != "" {
				t.Errorf("controller flags (-want +got):\n%s", diff)
			}
			// The controller may patch exactly the configurations rendered.
			var patchable []string
			for _, o := range r.Objects {
				if o.GetKind() != "ClusterRole" || o.GetLabels()["app.kubernetes.io/name"] != "canopy-controller" {
					continue
				}
				rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
				for _, rule := range rules {
					rule := rule.(map[string]any)
					if cmp.Equal(rule["resources"], []any{"validatingwebhookconfigurations"}) && rule["resourceNames"] != nil {
						for _, n := range rule["resourceNames"].([]any) {
							patchable = append(patchable, n.(string))
						}
					}
				}
			}
			var rendered []string
			for n := range tt.want {
				rendered = append(rendered, n)
			}
			if diff := cmp.Diff(rendered, patchable, cmpopts.SortSlices(func(a, b string) bool { return a < b }), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("validating configurations the controller may patch (-rendered +allowed):\n%s", diff)
			}
		})
	}
}

// object finds a rendered object by kind and name, or fails the test.
func object(t *testing.T, r *chart.Rendered, kind, name string) map[string]any {
	t.Helper()
	for _, o := range r.Objects {
		if o.GetKind() == kind && o.GetName() == name {
			return o.Object
		}
	}
	t.Fatalf("no %s %s rendered", kind, name)
	return nil
}

// TestRevision: a revision's release is only its control plane, every
// object named for the revision and selecting only its own pods, so that
// it runs beside the default release in one namespace.
func TestRevision(t *testing.T) {
	r := render(t, chart.Options{Namespace: "mesh", Set: []string{"revision=canary"}})
	var got []string
	for _, o := range r.Objects {
		got = append(got, kubeapply.Describe(o))
	}
	want := []string{
		"ServiceAccount mesh/canopy-controller-canary",
		"ClusterRole canopy-controller-canary-mesh",
		"ClusterRoleBinding canopy-controller-canary-mesh",
		"Role mesh/canopy-controller-canary",
		"RoleBinding mesh/canopy-controller-canary",
		"Service mesh/canopy-controller-canary",
		"PodDisruptionBudget mesh/canopy-controller-canary",
		"Deployment mesh/canopy-controller-canary",
		"MutatingWebhookConfiguration istio-sidecar-injector-canary",
		"ValidatingWebhookConfiguration istio-validator-canary-mesh",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("objects of revision canary (-want +got):\n%s", diff)
	}

	canary := map[string]any{"app": "istiod", "istio.io/rev": "canary"}
	for _, tt := range []struct {
		kind string
		path []string
		want map[string]any
	}{
		{"Deployment", []string{"spec", "selector", "matchLabels"}, canary},
		{"Service", []string{"spec", "selector"}, canary},
		{"PodDisruptionBudget", []string{"spec", "selector", "matchLabels"}, canary},
	} {
		got, _, _ := unstructured.NestedMap(object(t, r, tt.kind, "canopy-controller-canary"), tt.path...)
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("%s %s (-want +got):\n%s", tt.kind, strings.Join(tt.path, "."), diff)
		}
	}
	dep := object(t, r, "Deployment", "canopy-controller-canary")
	labels, _, _ := unstructured.NestedStringMap(dep, "spec", "template", "metadata", "labels")
	if labels["istio.io/rev"] != "canary" || labels["app"] != "istiod" || labels["app.kubernetes.io/name"] != "canopy-controller" {
		t.Errorf("pod labels %v, want app=istiod, istio.io/rev=canary, app.kubernetes.io/name=canopy-controller", labels)
	}
	sa, _, _ := unstructured.NestedString(dep, "spec", "template", "spec", "serviceAccountName")
	if sa != "canopy-controller-canary" {
		t.Errorf("serviceAccountName %q", sa)
	}
	args, _, _ := controllerPorts(t, r)
	for _, want := range []string{
		"--revision=canary",
		"--ca-dns-names=canopy-controller-canary.mesh.svc,istiod-canary.mesh.svc",
		"--discovery-address=canopy-controller-canary.mesh.svc:15012",
		// The node proxies stay the default release's, and trusted.
		"--trusted-node-accounts=mesh/canopy-node",
	} {
		if !slices.Contains(args, want) {
			t.Errorf("controller args %q lack %s", args, want)
		}
	}
	for _, kind := range []string{"ClusterRoleBinding", "RoleBinding"} {
		subjects, _, _ := unstructured.NestedSlice(object(t, r, kind, "canopy-controller-canary"+map[string]string{"ClusterRoleBinding": "-mesh"}[kind]), "subjects")
		if diff := cmp.Diff([]any{map[string]any{"kind": "ServiceAccount", "name": "canopy-controller-canary", "namespace": "mesh"}}, subjects); diff != "" {
			t.Errorf("%s subjects (-want +got):\n%s", kind, diff)
		}
	}
	// The revision may patch only its own webhook configuration.
	rules, _, _ := unstructured.NestedSlice(object(t, r, "ClusterRole", "canopy-controller-canary-mesh"), "rules")
	patchable := false
	for _, rule := range rules {
		if names, ok := rule.(map[string]any)["resourceNames"]; ok && cmp.Equal(names, []any{"istio-sidecar-injector-canary"}) {
			patchable = true
		}
	}
	if !patchable {
		t.Errorf("the ClusterRole does not name istio-sidecar-injector-canary: %v", rules)
	}
}

// TestRevisionBesideDefault: no object of a revision's release is also
// one of the default release's (an apply of one would take over the
// other's), and the default release's selectors leave the revision's pods
// out, except the Deployment's, which cannot change in place.
func TestRevisionBesideDefault(t *testing.T) {
	def := render(t, chart.Options{Namespace: "mesh"})
	canary := render(t, chart.Options{Namespace: "mesh", Set: []string{"revision=canary"}})
	names := map[string]bool{}
	for _, o := range def.Objects {
		names[kubeapply.Describe(o)] = true
	}
	for _, o := range canary.Objects {
		if names[kubeapply.Describe(o)] {
			t.Errorf("%s is in both releases", kubeapply.Describe(o))
		}
	}
	svc, _, _ := unstructured.NestedMap(object(t, def, "Service", "canopy-controller"), "spec", "selector")
	if diff := cmp.Diff(map[string]any{"app": "istiod", "istio.io/rev": "default"}, svc); diff != "" {
		t.Errorf("default Service selector (-want +got):\n%s", diff)
	}
	sel, _, _ := unstructured.NestedMap(object(t, def, "Deployment", "canopy-controller"), "spec", "selector", "matchLabels")
	if diff := cmp.Diff(map[string]any{"app": "istiod"}, sel); diff != "" {
		t.Errorf("default Deployment selector changed (immutable; -want +got):\n%s", diff)
	}
}

// TestNodeProxyController: the node proxies use the default revision's
// controller unless node.controllerRevision moves them.
func TestNodeProxyController(t *testing.T) {
	for _, tt := range []struct {
		name string
		set  []string
		want string
	}{
		{"default", nil, "canopy-controller.mesh.svc:15012"},
		{"moved to a canary", []string{"node.controllerRevision=canary"}, "canopy-controller-canary.mesh.svc:15012"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := render(t, chart.Options{Namespace: "mesh", Set: tt.set})
			cs, _, _ := unstructured.NestedSlice(object(t, r, "DaemonSet", "ztunnel"), "spec", "template", "spec", "containers")
			env, _, _ := unstructured.NestedSlice(cs[0].(map[string]any), "env")
			got := map[string]any{}
			for _, e := range env {
				e := e.(map[string]any)
				if e["name"] == "XDS_ADDRESS" || e["name"] == "CA_ADDRESS" {
					got[e["name"].(string)] = e["value"]
				}
			}
			if diff := cmp.Diff(map[string]any{"XDS_ADDRESS": tt.want, "CA_ADDRESS": tt.want}, got); diff != "" {
				t.Errorf("node proxy addresses (-want +got):\n%s", diff)
			}
		})
	}
}
