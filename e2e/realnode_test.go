package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/canopy-mesh/canopy/ctl"
	"github.com/canopy-mesh/canopy/ctl/cluster"
	"github.com/canopy-mesh/canopy/node/configdump"
)

// Failures only real nodes have: the container runtime restarting under
// running pods, a pod deleted while the node's CNI agent is down, and a
// node rebooting while its primary CNI rewrites its configuration.

// testContainerdRestart: containerd restarts on a node with pods running,
// as on a runtime upgrade. Its shims keep the containers running, so every
// pod stays the same pod, enrolled, and its connections carry on: load
// through the mesh from every demo pod, across the restart, loses nothing.
func testContainerdRestart(t *testing.T, m *mesh) {
	client := m.pods(t, "demo", "app=client")[0]
	node := client.Spec.NodeName
	before := m.podsOn(t, node)
	pods := m.pods(t, "demo", "")
	addr := url.QueryEscape("echo.demo.svc.cluster.local:9000")
	for i := range pods {
		if _, err := m.c.Get(t.Context(), &pods[i], 8080, "/load/start?held=2&duration=10m&addr="+addr); err != nil {
			t.Fatalf("start load in %s: %v", pods[i].Name, err)
		}
	}
	time.Sleep(3 * time.Second)
	start := time.Now()
	if err := m.local.RestartContainerd(t.Context(), node); err != nil {
		t.Fatal(err)
	}
	t.Logf("containerd of %s restarted in %s", node, time.Since(start).Round(time.Millisecond))
	time.Sleep(5 * time.Second)
	// The port-forwards that stop the load go through the restarted
	// containerd: retried until it serves them again.
	for i := range pods {
		poll(t, 30*time.Second, "stop the load in "+pods[i].Name, func(ctx context.Context) (bool, error) {
			_, err := m.c.Get(ctx, &pods[i], 8080, "/load/stop")
			return err == nil, nil
		})
	}
	for i := range pods {
		rep := loadReport(t, m, &pods[i], time.Minute)
		t.Logf("%s on %s: %d new connections, %d failed, %d held, %d cut; errors %q", pods[i].Name, pods[i].Spec.NodeName,
			rep.Connections, rep.Failures, rep.Held, rep.HeldFailures, rep.Errors)
		if rep.Failures != 0 || rep.HeldFailures != 0 {
			t.Errorf("%s: %d of %d new connections failed and %d of %d held ones were cut across containerd's restart: %q",
				pods[i].Name, rep.Failures, rep.Connections, rep.HeldFailures, rep.Held, rep.Errors)
		}
	}
	after := m.podsOn(t, node)
	for uid, p := range before {
		q, ok := after[uid]
		switch {
		case !ok:
			t.Errorf("pod %s/%s is gone after containerd's restart", p.Namespace, p.Name)
		case restarts(q) != restarts(p):
			t.Errorf("pod %s/%s: containers restarted (%d, then %d)", p.Namespace, p.Name, restarts(p), restarts(q))
		case q.Annotations["ambient.istio.io/redirection"] != p.Annotations["ambient.istio.io/redirection"]:
			t.Errorf("pod %s/%s: redirection %q, then %q", p.Namespace, p.Name,
				p.Annotations["ambient.istio.io/redirection"], q.Annotations["ambient.istio.io/redirection"])
		}
	}
}

// testPodDeletedWhileAgentDown: a meshed pod is deleted while its node's
// CNI agent is not running, so the CNI DEL finds no agent. The pod must
// still go, and once the agent is back nothing of it is left on the node:
// no record, and no process (the node proxy above all) holding its
// network namespace.
func testPodDeletedWhileAgentDown(t *testing.T, m *mesh) {
	echoPods := m.pods(t, "demo", "app=echo")
	victim := echoPods[0]
	node := victim.Spec.NodeName
	nsPath, err := m.local.PodNetns(&victim)
	if err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(nsPath, &st); err != nil {
		t.Fatal(err)
	}
	record, err := m.local.NodePath(node, "/var/run/canopy/pods/"+string(victim.UID)+".json")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(record); err != nil {
		t.Fatalf("no record of %s's ADD before the test: %v", victim.Name, err)
	}
	// The node proxy holds the pod's namespace (ZDS), as do the pod's
	// own processes: the check below that none is left is not vacuous.
	if h := holders(st.Dev, st.Ino); len(h) < 2 {
		t.Fatalf("the network namespace of %s is held by %v before the test, want its processes and the node proxy", victim.Name, h)
	}

	// The agent's DaemonSet keeps off nodes carrying agentDown (a rollout
	// of the agent, once); labelling the node takes its agent away as a
	// crash or an eviction would, with the DaemonSet still there, so the
	// agent leaves the node's pods enrolled as it goes.
	const agentDown = "e2e.canopy.dev/cni-agent-down"
	m.patchAgentAffinity(t, agentDown)
	m.waitAgentRollout(t)
	m.labelNode(t, node, agentDown, ptr("true"))
	poll(t, 2*time.Minute, "no CNI agent on "+node, func(ctx context.Context) (bool, error) {
		return m.agentOn(ctx, node) == nil, nil
	})
	back := func() { m.labelNode(t, node, agentDown, nil) }
	defer back()

	if err := m.c.Client.CoreV1().Pods("demo").Delete(t.Context(), victim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, 2*time.Minute, victim.Name+" deleted while the agent is down", func(ctx context.Context) (bool, error) {
		_, err := m.c.Client.CoreV1().Pods("demo").Get(ctx, victim.Name, metav1.GetOptions{})
		return err != nil, nil
	})
	back()
	poll(t, 2*time.Minute, "the CNI agent back on "+node, func(ctx context.Context) (bool, error) {
		p := m.agentOn(ctx, node)
		return p != nil && cluster.Ready(p), nil
	})
	m.waitDeployment(t, "demo", "echo")
	m.waitEnrolled(t, "demo", "")

	// What is left of the pod, if anything: its record and the
	// processes holding its network namespace.
	leftovers := func() []string {
		left := holders(st.Dev, st.Ino)
		if _, err := os.Stat(record); !errors.Is(err, fs.ErrNotExist) {
			left = append(left, "record "+record)
		}
		return left
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(500 * time.Millisecond) {
		left := leftovers()
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("left of %s on %s a minute after its CNI agent came back: %v", victim.Name, node, left)
		}
	}
	// The new echo pod is served: calls reach both replicas again.
	client := m.pods(t, "demo", "app=client")[0]
	seen := map[string]bool{}
	for i := 0; i < 40 && len(seen) < len(echoPods); i++ {
		body, err := m.fetch(t, &client, "http://echo.demo/")
		if err != nil {
			t.Fatalf("client -> echo.demo after the agent came back: %v", err)
		}
		var r struct {
			Name string `json:"name"`
		}
		if err := json.Unmarshal([]byte(body), &r); err == nil {
			seen[r.Name] = true
		}
	}
	if len(seen) < len(echoPods) {
		t.Errorf("calls reached %v, want %d echo pods", seen, len(echoPods))
	}
}

// testNodeReboot: a node reboots (every process of it ends at once, its
// /run and BPF file system start empty, its cgroups go, the kubelet
// recreates every pod's sandbox) and its primary CNI writes its
// configuration again, as Cilium's agent does each time it starts: while
// the node is down, before any agent of the node runs (the worst order),
// and once more after Canopy's CNI agent is back. No meshed pod may start
// outside the mesh: each one's new network namespace is the one
// canopy-cni's ADD recorded, and the client calls the echo Service again.
func testNodeReboot(t *testing.T, m *mesh) {
	client := m.pods(t, "demo", "app=client")[0]
	node := client.Spec.NodeName
	before := m.podsOn(t, node)
	start := time.Now()
	if err := m.local.RebootNode(t.Context(), node, true); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s powered off and booted again in %s", node, time.Since(start).Round(time.Millisecond))
	poll(t, 2*time.Minute, "the CNI agent running again on "+node, func(ctx context.Context) (bool, error) {
		p := m.agentOn(ctx, node)
		return p != nil && startedSince(p, start), nil
	})
	if err := m.local.RewritePrimaryCNIConfig(node); err != nil {
		t.Fatal(err)
	}
	t.Logf("the primary CNI rewrote its configuration again %s after the reboot began, the CNI agent back", time.Since(start).Round(time.Millisecond))
	m.waitEnrolled(t, "demo", "")
	poll(t, 3*time.Minute, "every pod of "+node+" running again", func(ctx context.Context) (bool, error) {
		for uid, p := range before {
			q, err := m.c.Client.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil || q.UID != uid {
				continue // replaced by its controller: checked below as a new pod
			}
			if !startedSince(q, start) || !cluster.Ready(q) {
				return false, nil
			}
		}
		return true, nil
	})
	for _, p := range m.pods(t, "demo", "") {
		if p.Spec.NodeName != node {
			continue
		}
		if err := m.startedThroughCanopyCNI(&p); err != nil {
			t.Errorf("pod %s started outside the mesh after the reboot: %v", p.Name, err)
		}
	}
	// The chain the runtime uses is Canopy's own file (the chart's
	// cniAgent.cniConfFileName), which no primary CNI rewrites.
	conf, err := m.local.NodePath(node, "/etc/cni/net.d/02-canopy-cni.conflist")
	if err != nil {
		t.Fatal(err)
	}
	poll(t, 30*time.Second, "canopy-cni after ptp in "+conf, func(context.Context) (bool, error) {
		b, err := os.ReadFile(conf)
		return err == nil && strings.Contains(string(b), `"ptp"`) && strings.Contains(string(b), `"canopy-cni"`), nil
	})
	// The mesh converges on the pods' new addresses: every node proxy
	// holds them (the controller itself may have been on the node, its
	// lease held by a replica that died with it).
	poll(t, 2*time.Minute, "every node proxy holding the demo pods' new addresses", func(ctx context.Context) (bool, error) {
		pods, err := m.readyPods(ctx, "demo", "")
		if err != nil {
			return false, nil
		}
		proxies, err := m.readyPods(ctx, system, cluster.Selector(cluster.NodeProxyApp))
		if err != nil {
			return false, nil
		}
		for _, proxy := range proxies {
			var out strings.Builder
			opts := ctl.WorkloadsOptions{ProxyOptions: ctl.ProxyOptions{Namespace: system, Proxy: proxy.Name}, Output: "json"}
			if err := ctl.Workloads(ctx, m.c, opts, &out, io.Discard); err != nil {
				return false, nil
			}
			var ws []configdump.Workload
			if err := json.Unmarshal([]byte(out.String()), &ws); err != nil {
				return false, err
			}
			rows := map[string]configdump.Workload{}
			for _, w := range ws {
				rows[w.Name] = w
			}
			for _, p := range pods {
				if r := rows[p.Name]; r.Node != p.Spec.NodeName || !contains(r.WorkloadIPs, p.Status.PodIP) {
					return false, nil
				}
			}
		}
		return true, nil
	})
	client = m.pods(t, "demo", "app=client")[0]
	poll(t, time.Minute, "client -> echo.demo after the reboot", func(ctx context.Context) (bool, error) {
		body, err := m.c.Get(ctx, &client, 8080, "/fetch?url="+url.QueryEscape("http://echo.demo/"))
		return err == nil && strings.Contains(string(body), `"name":"echo-`), nil
	})
}

// podsOn are the pods on node, by UID.
func (m *mesh) podsOn(t *testing.T, node string) map[types.UID]corev1.Pod {
	t.Helper()
	list, err := m.c.Client.CoreV1().Pods("").List(t.Context(), metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	out := map[types.UID]corev1.Pod{}
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			out[p.UID] = p
		}
	}
	return out
}

// restarts is how many times a pod's containers were restarted in all.
func restarts(p corev1.Pod) int32 {
	var n int32
	for _, c := range p.Status.ContainerStatuses {
		n += c.RestartCount
	}
	return n
}

// startedSince reports whether every container of p runs and started at
// t or later (the API has whole seconds).
func startedSince(p *corev1.Pod, t time.Time) bool {
	if len(p.Status.ContainerStatuses) == 0 {
		return false
	}
	for _, c := range p.Status.ContainerStatuses {
		if c.State.Running == nil || c.State.Running.StartedAt.Time.Before(t.Truncate(time.Second)) {
			return false
		}
	}
	return true
}

// agentOn is the CNI agent pod on node, or nil.
func (m *mesh) agentOn(ctx context.Context, node string) *corev1.Pod {
	list, err := m.c.Client.CoreV1().Pods(system).List(ctx, metav1.ListOptions{
		LabelSelector: cluster.Selector(cluster.CNIAgentApp), FieldSelector: "spec.nodeName=" + node,
	})
	if err != nil || len(list.Items) == 0 {
		return nil
	}
	return &list.Items[0]
}

// patchAgentAffinity keeps the CNI agent's DaemonSet off nodes labelled
// key, as a user's node affinity would.
func (m *mesh) patchAgentAffinity(t *testing.T, key string) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"template":{"spec":{"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":%q,"operator":"DoesNotExist"}]}]}}}}}}}`, key)
	if _, err := m.c.Client.AppsV1().DaemonSets(system).Patch(t.Context(), cluster.CNIAgentApp, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitAgentRollout waits until every node runs the CNI agent's current
// template, available.
func (m *mesh) waitAgentRollout(t *testing.T) {
	t.Helper()
	poll(t, 3*time.Minute, "the CNI agent's rollout", func(ctx context.Context) (bool, error) {
		ds, err := m.c.Client.AppsV1().DaemonSets(system).Get(ctx, cluster.CNIAgentApp, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		return daemonSetDone(ds), nil
	})
}

func daemonSetDone(ds *appsv1.DaemonSet) bool {
	s := ds.Status
	return s.ObservedGeneration >= ds.Generation && s.DesiredNumberScheduled > 0 &&
		s.UpdatedNumberScheduled == s.DesiredNumberScheduled && s.NumberAvailable == s.DesiredNumberScheduled
}

// labelNode sets (value non-nil) or removes a node's label.
func (m *mesh) labelNode(t *testing.T, node, key string, value *string) {
	t.Helper()
	v := "null"
	if value != nil {
		v = strconv.Quote(*value)
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%s}}}`, key, v)
	if _, err := m.c.Client.CoreV1().Nodes().Patch(context.WithoutCancel(t.Context()), node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Errorf("label node %s: %v", node, err)
	}
}

// startedThroughCanopyCNI checks that a pod's current network namespace
// is the one canopy-cni's ADD recorded: the pod's sandbox was set up
// through Canopy's plugin, which enrolls the pod before the ADD returns.
func (m *mesh) startedThroughCanopyCNI(p *corev1.Pod) error {
	record, err := m.local.NodePath(p.Spec.NodeName, "/var/run/canopy/pods/"+string(p.UID)+".json")
	if err != nil {
		return err
	}
	b, err := os.ReadFile(record)
	if err != nil {
		return fmt.Errorf("no ADD record: %w", err)
	}
	var rec struct {
		Dev uint64 `json:"dev"`
		Ino uint64 `json:"ino"`
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return fmt.Errorf("ADD record %s: %w", record, err)
	}
	ns, err := m.local.PodNetns(p)
	if err != nil {
		return err
	}
	var st syscall.Stat_t
	if err := syscall.Stat(ns, &st); err != nil {
		return err
	}
	if st.Dev != rec.Dev || st.Ino != rec.Ino {
		return fmt.Errorf("its network namespace is %d:%d, canopy-cni's ADD recorded %d:%d", st.Dev, st.Ino, rec.Dev, rec.Ino)
	}
	return nil
}

// holders are the host's processes that hold the network namespace
// dev:ino open, as their own or as a file descriptor.
func holders(dev, ino uint64) []string {
	var out []string
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		links, _ := filepath.Glob(d + "/fd/*")
		for _, l := range append(links, d+"/ns/net") {
			var st syscall.Stat_t
			if syscall.Stat(l, &st) == nil && st.Dev == dev && st.Ino == ino {
				comm, _ := os.ReadFile(d + "/comm")
				out = append(out, fmt.Sprintf("%s (%s) %s", filepath.Base(d), strings.TrimSpace(string(comm)), filepath.Base(l)))
			}
		}
	}
	return out
}
