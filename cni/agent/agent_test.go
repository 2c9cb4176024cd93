package agent_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/canopy-mesh/canopy/cni/agent"
	"github.com/canopy-mesh/canopy/cni/enroll"
	"github.com/canopy-mesh/canopy/cni/hostrules"
	"github.com/canopy-mesh/canopy/cni/pluginevent"
	"github.com/canopy-mesh/canopy/cni/redirect"
	"github.com/canopy-mesh/canopy/cni/zds"
	"github.com/canopy-mesh/canopy/internal/cgroup"
	"github.com/canopy-mesh/canopy/internal/netns"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/nettest"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
	"github.com/canopy-mesh/canopy/internal/zdsconn"
	zdspb "github.com/canopy-mesh/canopy/workloadapi/zds"
)

// settle is how long a condition of these tests may take to become true.
const settle = 20 * time.Second

var env *testenv.Environment

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

// nodeProxy is a test node proxy on the ZDS socket: it reconnects when the
// agent goes away and records every request.
type nodeProxy struct {
	// refuse, if set, names pods whose AddWorkload is refused (an Ack
	// with an error).
	refuse string
	// hold, if set, is called with the pod's UID before an AddWorkload
	// is acknowledged, and the ack waits for it to return.
	hold func(uid string)

	mu  sync.Mutex
	got []string
	// netns is the inode of the namespace each pod's last Add carried.
	netns map[string]uint64
}

func (p *nodeProxy) run(ctx context.Context, path string) {
	for ctx.Err() == nil {
		uc, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
		if err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		c := zdsconn.New(uc)
		go func() { <-ctx.Done(); c.Close() }()
		if err := c.Send(&zdspb.ZdsHello{Version: zdspb.Version_V1}, nil, time.Now().Add(time.Second)); err != nil {
			c.Close()
			continue
		}
		for {
			var req zdspb.WorkloadRequest
			fds, err := c.Recv(&req, time.Time{})
			if err != nil {
				break
			}
			entry, ackErr := "", ""
			switch r := req.GetPayload().(type) {
			case *zdspb.WorkloadRequest_Add:
				entry = "add " + r.Add.GetUid()
				if len(fds) != 1 || !zdsconn.IsNetns(fds[0]) {
					entry += " without a netns"
				}
				if len(fds) == 1 {
					var st syscall.Stat_t
					if syscall.Fstat(int(fds[0].Fd()), &st) == nil {
						p.mu.Lock()
						if p.netns == nil {
							p.netns = map[string]uint64{}
						}
						p.netns[r.Add.GetUid()] = st.Ino
						p.mu.Unlock()
					}
				}
				if p.refuse != "" && r.Add.GetWorkloadInfo().GetName() == p.refuse {
					entry, ackErr = "refused "+r.Add.GetUid(), "no workload for this pod"
				} else if p.hold != nil {
					p.hold(r.Add.GetUid())
				}
			case *zdspb.WorkloadRequest_Keep:
				entry = "keep " + r.Keep.GetUid()
			case *zdspb.WorkloadRequest_Del:
				entry = "del " + r.Del.GetUid()
			case *zdspb.WorkloadRequest_SnapshotSent:
				entry = "snapshot"
			}
			for _, f := range fds {
				f.Close()
			}
			p.mu.Lock()
			p.got = append(p.got, entry)
			p.mu.Unlock()
			if err := c.Send(&zdspb.WorkloadResponse{Payload: &zdspb.WorkloadResponse_Ack{Ack: &zdspb.Ack{Error: ackErr}}}, nil, time.Now().Add(time.Second)); err != nil {
				break
			}
		}
		c.Close()
	}
}

func (p *nodeProxy) saw(entry string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Contains(p.got, entry)
}

// netnsOf returns the inode of the namespace the pod's last Add carried.
func (p *nodeProxy) netnsOf(uid types.UID) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.netns[string(uid)]
}

func (p *nodeProxy) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.got = nil
}

// node is an agent with its ZDS server and plugin socket, started and
// stopped as one (an agent process).
type node struct {
	agent *agent.Agent
	zds   *zds.Server
	// record is the agent's namespace record.
	record string
	reg    *prometheus.Registry
	plugin pluginevent.Client
	stop   func()
}

// startNode starts an agent for node name; stateDir is its directory on
// the node, which a restarted agent is given again. opts change the
// agent's configuration.
func startNode(t *testing.T, name, zdsPath, nodeNetns, stateDir string, opts ...func(*agent.Config)) *node {
	t.Helper()
	return startNodeWith(t, redirect.Nftables{}, name, zdsPath, nodeNetns, stateDir, opts...)
}

// startNodeWith is startNode with another redirection backend.
func startNodeWith(t *testing.T, backend redirect.Backend, name, zdsPath, nodeNetns, stateDir string, opts ...func(*agent.Config)) *node {
	t.Helper()
	return startNodeAdmitting(t, backend, nil, name, zdsPath, nodeNetns, stateDir, opts...)
}

// startNodeAdmitting is startNodeWith with ZDS's Admit (a port guard's).
func startNodeAdmitting(t *testing.T, backend redirect.Backend, admit func(pid int) error, name, zdsPath, nodeNetns, stateDir string, opts ...func(*agent.Config)) *node {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	n := &node{reg: prometheus.NewRegistry(), record: filepath.Join(stateDir, "namespaces.json")}
	server := zds.New(zdsPath, zds.Config{OnDelivered: func(uid string) {
		if n.agent != nil {
			n.agent.Delivered(uid)
		}
	}, Admit: admit}, log)
	host := hostrules.Rules{ProbeUID: 0, ProbeSNAT: redirect.DefaultProbeSNAT, ProbeSNATv6: redirect.DefaultProbeSNATv6, Netns: nodeNetns}
	cfg := agent.Config{
		NodeName: name, Enroll: enroll.Config{SystemNamespace: "istio-system", ExcludedNamespaces: []string{"kube-system"}, DNSCapture: true},
		ReconcilePeriod: 200 * time.Millisecond, StatusRefresh: time.Second, StateDir: stateDir,
		NamespaceRecord: n.record, Registerer: n.reg,
	}
	for _, o := range opts {
		o(&cfg)
	}
	a, err := agent.New(cfg, env.Client, backend, host, server, log)
	if err != nil {
		t.Fatal(err)
	}
	n.agent, n.zds = a, server
	sock := filepath.Join(t.TempDir(), "cni.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: a.PluginHandler()}
	n.plugin = pluginevent.Client{Socket: sock, Timeout: 30 * time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = a.Run(ctx) })
	// The ZDS socket opens only once the agent knows the node's pods: a
	// node proxy treats the snapshot as complete and drops what is not in
	// it.
	wg.Go(func() {
		select {
		case <-a.Synced():
			_ = server.Run(ctx)
		case <-ctx.Done():
		}
	})
	wg.Go(func() { _ = srv.Serve(l) })
	var once sync.Once
	n.stop = func() { once.Do(func() { cancel(); srv.Close(); wg.Wait() }) }
	t.Cleanup(n.stop)
	select {
	case <-a.Synced():
	case <-time.After(30 * time.Second):
		t.Fatal("agent did not sync")
	}
	return n
}

// podProcess runs a process of the pod with uid in the namespace at
// netnsPath, in a cgroup named as a kubelet names the pod's, until the test
// ends.
func podProcess(t *testing.T, netnsPath string, uid types.UID) {
	t.Helper()
	root, err := cgroup.Root()
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	top := filepath.Join(root, "canopy-test-"+hex.EncodeToString(b))
	t.Cleanup(func() {
		if err := cgroup.Remove(top); err != nil {
			t.Errorf("remove test cgroup: %v", err)
		}
	})
	cmd := exec.Command("sleep", "3600")
	if err := netns.Do(netnsPath, func() error { return cgroup.Start(cmd, filepath.Join(top, "kubepods", "pod"+string(uid))) }); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait() }()
}

// tableHandle is the header line of the pod's redirection table with its
// kernel handle, which a rewrite of the table changes.
func tableHandle(t *testing.T, podNetns string) string {
	t.Helper()
	out := nettest.In(t, podNetns, func() ([]byte, error) {
		return exec.Command("nft", "-a", "list", "table", "inet", redirect.NatTable).CombinedOutput()
	})
	line, _, _ := strings.Cut(string(out), "\n")
	return line
}

// watchProbes reads the host probe set in the node netns every few
// milliseconds until the test ends; the func it returns stops it and
// says which of ips was missing at some read, and when, or "".
func watchProbes(t *testing.T, nodeNetns string, ips []netip.Addr) func() string {
	t.Helper()
	host := hostrules.Rules{ProbeSNAT: redirect.DefaultProbeSNAT, ProbeSNATv6: redirect.DefaultProbeSNATv6, Netns: nodeNetns}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan string, 1)
	go func() {
		start := time.Now()
		for ctx.Err() == nil {
			got, err := host.Members()
			if err == nil {
				for _, ip := range ips {
					if !slices.Contains(got, ip) {
						done <- fmt.Sprintf("%s at %v", ip, time.Since(start).Round(time.Millisecond))
						return
					}
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
		done <- ""
	}()
	return func() string { cancel(); return <-done }
}

func createPod(t *testing.T, ns, name, node string, ip netip.Addr, labels map[string]string) *corev1.Pod {
	t.Helper()
	return createRunning(t, ns, ip, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "app", Image: "canopy/echo"}}},
	})
}

// createRunning creates pod in ns and gives it the status of a running
// pod at ip, as the kubelet would.
func createRunning(t *testing.T, ns string, ip netip.Addr, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	ctx := t.Context()
	if _, err := env.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	st, _ := json.Marshal(map[string]any{"status": corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip.String(), PodIPs: []corev1.PodIP{{IP: ip.String()}}}})
	running, err := env.Client.CoreV1().Pods(ns).Patch(ctx, pod.Name, types.MergePatchType, st, metav1.PatchOptions{}, "status")
	if err != nil {
		t.Fatal(err)
	}
	return running
}

func getPod(t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	p, err := env.Client.CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func condition(p *corev1.Pod) *corev1.PodCondition {
	for i, c := range p.Status.Conditions {
		if c.Type == agent.ConditionEnrolled {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

func counter(t *testing.T, reg *prometheus.Registry, name, outcome string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetValue() == outcome {
					return m.GetCounter().GetValue()
				}
			}
			if outcome == "" { // a gauge, or a counter without labels
				return m.GetGauge().GetValue() + m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestAgentKeepsPodsEnrolled drives the agent through a real API server,
// real namespaces and rules, and a test node proxy on ZDS.
func TestAgentKeepsPodsEnrolled(t *testing.T) {
	testenv.Need(t, env)
	nettest.NeedRoot(t)
	nodeName := fmt.Sprintf("agent-node-%d", time.Now().UnixNano()%100000)
	running := nettest.NewPair(t, netip.MustParsePrefix("10.217.0.0/24"))
	fresh := nettest.NewPair(t, netip.MustParsePrefix("10.217.1.0/24"))
	ns := env.Namespace(t, "mesh", map[string]string{enroll.LabelDataplaneMode: enroll.ModeAmbient})
	zdsPath := filepath.Join(t.TempDir(), "ztunnel.sock")
	proxy := &nodeProxy{}
	pctx, pcancel := context.WithCancel(context.Background())
	defer pcancel()
	go proxy.run(pctx, zdsPath)

	// A pod that runs before the agent starts (after a reboot, say): the
	// agent never saw its ADD, and finds it by its process.
	pod := createPod(t, ns, "running", nodeName, running.AddrA, nil)
	podProcess(t, running.A, pod.UID)
	stray := createPod(t, ns, "no-netns", nodeName, netip.MustParseAddr("10.217.9.9"), nil)
	stateDir := t.TempDir()
	n := startNode(t, nodeName, zdsPath, running.B, stateDir)

	t.Run("a running pod is found and enrolled at start", func(t *testing.T) {
		// Its DNS capture waits for the node proxy, which connects once
		// the agent has synced (TestDNSCaptureWhileNoProxy).
		cfg := redirect.DefaultPodConfig()
		cfg.DNSCapture = false
		if err := (redirect.Nftables{}).Verify(running.A, cfg); err != nil && (redirect.Nftables{}).Verify(running.A, redirect.DefaultPodConfig()) != nil {
			t.Fatalf("rules not in place: %v", err)
		}
		eventually.Within(t, settle, "node proxy got the pod", func() bool { return proxy.saw("add " + string(pod.UID)) })
		eventually.Within(t, settle, "DNS captured", func() bool {
			return (redirect.Nftables{}).Verify(running.A, redirect.DefaultPodConfig()) == nil
		})
		eventually.Within(t, settle, "pod annotated and verified", func() bool {
			p := getPod(t, ns, "running")
			c := condition(p)
			return p.Annotations[enroll.AnnotationRedirection] == enroll.RedirectionEnabled && c != nil && c.Status == corev1.ConditionTrue
		})
	})

	t.Run("a pod that cannot be enrolled says why", func(t *testing.T) {
		eventually.Within(t, settle, "condition False with NetnsNotFound", func() bool {
			c := condition(getPod(t, ns, stray.Name))
			return c != nil && c.Status == corev1.ConditionFalse && c.Reason == agent.ReasonNoNetns
		})
		if got := counter(t, n.reg, "canopy_cni_unenrollable_pods", ""); got != 1 {
			t.Errorf("canopy_cni_unenrollable_pods = %v, want 1", got)
		}
	})

	t.Run("rules deleted behind the agent's back are repaired", func(t *testing.T) {
		nettest.In(t, running.A, func() ([]byte, error) {
			return exec.Command("nft", "delete", "table", "inet", redirect.NatTable).CombinedOutput()
		})
		// The repair lands in the kernel just before it is counted.
		eventually.Within(t, settle, "rules repaired and counted", func() bool {
			return (redirect.Nftables{}).Verify(running.A, redirect.DefaultPodConfig()) == nil &&
				counter(t, n.reg, "canopy_cni_verifications_total", "repaired") >= 1
		})
		eventually.Within(t, settle, "condition says repaired", func() bool { return condition(getPod(t, ns, "running")).Reason == agent.ReasonRepaired })
	})

	t.Run("host probe rules deleted behind the agent's back are repaired", func(t *testing.T) {
		host := hostrules.Rules{ProbeSNAT: redirect.DefaultProbeSNAT, ProbeSNATv6: redirect.DefaultProbeSNATv6, Netns: running.B}
		nettest.In(t, running.B, func() ([]byte, error) {
			return exec.Command("nft", "delete", "table", "inet", hostrules.Table).CombinedOutput()
		})
		eventually.Within(t, settle, "host rules repaired with the pod's IP and counted", func() bool {
			problems, err := host.Verify([]netip.Addr{running.AddrA})
			return err == nil && len(problems) == 0 && counter(t, n.reg, "canopy_cni_host_rules_repairs_total", "") >= 1
		})
	})

	var added *corev1.Pod
	t.Run("the plugin's ADD enrolls a new pod", func(t *testing.T) {
		added = createPod(t, ns, "fresh", nodeName, fresh.AddrA, nil)
		resp, err := n.plugin.Do(t.Context(), pluginevent.PathAdd, pluginevent.Request{
			ContainerID: "c1", Netns: fresh.A, PodName: "fresh", PodNamespace: ns, IPs: []string{fresh.AddrA.String()},
		})
		if err != nil || !resp.Enrolled {
			t.Fatalf("ADD = %+v, %v", resp, err)
		}
		if err := (redirect.Nftables{}).Verify(fresh.A, redirect.DefaultPodConfig()); err != nil {
			t.Fatal(err)
		}
		if !proxy.saw("add " + string(added.UID)) {
			t.Error("node proxy did not get the pod before ADD returned")
		}
		// A pod outside the mesh is not enrolled, and says why.
		outside := env.Namespace(t, "plain", nil)
		createPod(t, outside, "plain", nodeName, netip.MustParseAddr("10.217.8.8"), nil)
		resp, err = n.plugin.Do(t.Context(), pluginevent.PathAdd, pluginevent.Request{Netns: fresh.A, PodName: "plain", PodNamespace: outside})
		if err != nil || resp.Enrolled || resp.Reason == "" {
			t.Errorf("ADD of a non-mesh pod = %+v, %v", resp, err)
		}
	})

	outer := t // the restarted agent outlives its subtest
	var n2 *node
	t.Run("an agent restart gives the node proxy a full snapshot", func(t *testing.T) {
		// What the rest of the mesh sees of the restart: every change to
		// the pods' redirection annotation, and the host probe set, read
		// every few milliseconds.
		w, err := env.Client.CoreV1().Pods(ns).Watch(t.Context(), metav1.ListOptions{ResourceVersion: getPod(t, ns, "fresh").ResourceVersion})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		probed := []netip.Addr{running.AddrA, fresh.AddrA}
		probesGone := watchProbes(t, running.B, probed)
		handle := func() string { return tableHandle(t, fresh.A) }
		before := handle()

		n.stop()
		proxy.reset()
		n2 = startNode(outer, nodeName, zdsPath, running.B, stateDir)
		eventually.Within(t, settle, "a snapshot", func() bool { return proxy.saw("snapshot") })
		// A pass after the snapshot has published whatever it would.
		time.Sleep(time.Second)
		if after := handle(); after != before {
			t.Errorf("the restarted agent rewrote a pod's rules that were in place: table %q became %q", before, after)
		}
		if gone := probesGone(); gone != "" {
			t.Errorf("during the restart the host probe set lost an enrolled pod's IP: %s", gone)
		}
	drain:
		for {
			select {
			case ev := <-w.ResultChan():
				p, ok := ev.Object.(*corev1.Pod)
				if !ok || (p.Name != "running" && p.Name != "fresh") {
					continue
				}
				if got := p.Annotations[enroll.AnnotationRedirection]; got != enroll.RedirectionEnabled {
					t.Errorf("during the restart pod %s was annotated %s=%q (every node proxy would switch it to plain TCP), want %q throughout",
						p.Name, enroll.AnnotationRedirection, got, enroll.RedirectionEnabled)
				}
			default:
				break drain
			}
		}
		proxy.mu.Lock()
		got := slices.Clone(proxy.got[:3])
		proxy.mu.Unlock()
		slices.Sort(got)
		want := []string{"add " + string(pod.UID), "add " + string(added.UID), "snapshot"}
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("after the restart the node proxy got %q first, want both pods then the snapshot", got)
		}
	})

	t.Run("opting out un-enrolls", func(t *testing.T) {
		patch := []byte(`{"metadata":{"labels":{"` + enroll.LabelDataplaneMode + `":"none"}}}`)
		if _, err := env.Client.CoreV1().Pods(ns).Patch(t.Context(), "running", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually.Within(t, settle, "rules removed", func() bool {
			return (redirect.Nftables{}).Verify(running.A, redirect.DefaultPodConfig()) != nil
		})
		eventually.Within(t, settle, "node proxy told", func() bool { return proxy.saw("del " + string(pod.UID)) })
		eventually.Within(t, settle, "annotation and condition removed", func() bool {
			p := getPod(t, ns, "running")
			_, has := p.Annotations[enroll.AnnotationRedirection]
			return !has && condition(p) == nil
		})
	})

	t.Run("uninstall takes every pod out", func(t *testing.T) {
		n2.stop()
		if err := n2.agent.Uninstall(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := (redirect.Nftables{}).Verify(fresh.A, redirect.DefaultPodConfig()); err == nil {
			t.Error("rules left after Uninstall")
		}
		if _, has := getPod(t, ns, "fresh").Annotations[enroll.AnnotationRedirection]; has {
			t.Error("annotation left after Uninstall")
		}
		if problems, _ := (hostrules.Rules{ProbeSNAT: redirect.DefaultProbeSNAT, ProbeSNATv6: redirect.DefaultProbeSNATv6, Netns: running.B}).Verify(nil); len(problems) == 0 {
			t.Error("host rules left after Uninstall")
		}
	})
}
