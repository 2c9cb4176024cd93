package agent_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/canopy-mesh/canopy/cni/agent"
	"github.com/canopy-mesh/canopy/cni/enroll"
	"github.com/canopy-mesh/canopy/cni/pluginevent"
	"github.com/canopy-mesh/canopy/cni/redirect"
	"github.com/canopy-mesh/canopy/cni/redirect/bpfprog"
	"github.com/canopy-mesh/canopy/internal/netns"
	"github.com/canopy-mesh/canopy/internal/testing/ci"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/nettest"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
)

// bindProxyPort binds [::]:15001 in the netns at path as this process,
// with SO_REUSEPORT as the node proxy does, and closes it again.
func bindProxyPort(path string) error {
	var berr error
	err := netns.Do(path, func() error {
		fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
			return err
		}
		berr = unix.Bind(fd, &unix.SockaddrInet6{Port: redirect.OutboundPort})
		return nil
	})
	return errors.Join(err, berr)
}

func isCgroup2(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}

// TestAgentGuardsAmbientPods: the agent guards an ambient pod's node proxy
// ports as it enrolls it, so a process that is not the node proxy cannot
// bind them, and the node proxy, once it connects over ZDS, is admitted
// (SO_PEERCRED) and binds them when it takes the pod. Uninstalling takes
// the guard off the node.
func TestAgentGuardsAmbientPods(t *testing.T) {
	testenv.Need(t, env)
	nettest.NeedRoot(t)
	if err := bpfprog.ProbeBindGuard(); err != nil {
		ci.Unavailable(t, "%v", err)
	}
	if !isCgroup2("/sys/fs/cgroup") && !isCgroup2("/sys/fs/cgroup/unified") {
		ci.Unavailable(t, "no cgroup2 hierarchy at /sys/fs/cgroup to attach the port guard to")
	}
	guardRoot := filepath.Join(nettest.BPFFS(t), "guard")
	guard, err := redirect.OpenPortGuard(redirect.PortGuardConfig{Root: guardRoot, Cgroup: "/sys/fs/cgroup", Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(guard.Close)

	nodeName := fmt.Sprintf("agent-node-%d", time.Now().UnixNano()%100000)
	pair := nettest.NewPair(t, netip.MustParsePrefix("10.218.9.0/24"))
	ns := env.Namespace(t, "mesh", map[string]string{enroll.LabelDataplaneMode: enroll.ModeAmbient})
	zdsPath := filepath.Join(t.TempDir(), "ztunnel.sock")
	pod := createPod(t, ns, "guarded", nodeName, pair.AddrA, nil)
	podProcess(t, pair.A, pod.UID)
	n := startNodeAdmitting(t, redirect.Guarded{Backend: redirect.Nftables{}, Guard: guard}, guard.Admit, nodeName, zdsPath, pair.B, t.TempDir())

	eventually.Within(t, settle, "pod enrolled", func() bool {
		c := condition(getPod(t, ns, "guarded"))
		return c != nil && c.Status == "True"
	})
	if err := bindProxyPort(pair.A); !errors.Is(err, unix.EPERM) {
		t.Fatalf("bind to 15001 in the enrolled pod before any node proxy connected: %v, want EPERM", err)
	}

	// The node proxy opens its listener when it takes the pod, as
	// Canopy's does.
	var mu sync.Mutex
	var proxyBind error
	proxy := &nodeProxy{hold: func(uid string) {
		if uid == string(pod.UID) {
			mu.Lock()
			defer mu.Unlock()
			proxyBind = bindProxyPort(pair.A)
		}
	}}
	pctx, pcancel := context.WithCancel(context.Background())
	defer pcancel()
	go proxy.run(pctx, zdsPath)
	eventually.Within(t, settle, "the node proxy takes the pod", func() bool { return proxy.saw("add " + string(pod.UID)) })
	mu.Lock()
	if proxyBind != nil {
		t.Errorf("the node proxy's bind when it took the pod: %v", proxyBind)
	}
	mu.Unlock()

	// The node's readiness: a throwaway namespace enrolled guarded, in
	// both modes, verified, un-enrolled.
	if err := n.agent.SelfTest(); err != nil {
		t.Errorf("self-test with the guard: %v", err)
	}

	n.stop()
	if err := n.agent.Uninstall(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := bindProxyPort(pair.A); err != nil {
		t.Errorf("bind after uninstall: %v", err)
	}
	if _, err := os.Stat(guardRoot); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the guard's pins after uninstall: %v", err)
	}
}

// TestPruneSparesPodBeingEnrolled is the attack on the passes' pruning of
// the guard: a pod's CNI ADD guards its namespace, then waits for the node
// proxy's ack before the agent counts the pod as its own, and the passes
// that run meanwhile (every 200 ms here) forget the guarded namespaces of
// pods the agent does not count. A process of the pod binds 15001 through
// that wait, as the pod's containers could once the ADD returned: every
// bind must be refused, during the wait and after.
func TestPruneSparesPodBeingEnrolled(t *testing.T) {
	testenv.Need(t, env)
	nettest.NeedRoot(t)
	if err := bpfprog.ProbeBindGuard(); err != nil {
		ci.Unavailable(t, "%v", err)
	}
	if !isCgroup2("/sys/fs/cgroup") && !isCgroup2("/sys/fs/cgroup/unified") {
		ci.Unavailable(t, "no cgroup2 hierarchy at /sys/fs/cgroup to attach the port guard to")
	}
	guard, err := redirect.OpenPortGuard(redirect.PortGuardConfig{Root: filepath.Join(nettest.BPFFS(t), "guard"), Cgroup: "/sys/fs/cgroup", Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(guard.Close)

	nodeName := fmt.Sprintf("agent-node-%d", time.Now().UnixNano()%100000)
	pair := nettest.NewPair(t, netip.MustParsePrefix("10.218.10.0/24"))
	ns := env.Namespace(t, "mesh", map[string]string{enroll.LabelDataplaneMode: enroll.ModeAmbient})
	zdsPath := filepath.Join(t.TempDir(), "ztunnel.sock")
	// A brand-new pod the node's informer has not shown yet, so the
	// passes neither see it nor wait for its lock (here the informer never
	// shows it: it names another node). The ADD reads it from the API
	// server.
	pod, err := env.Client.CoreV1().Pods(ns).Create(t.Context(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "adding"},
		Spec:       corev1.PodSpec{NodeName: nodeName + "-unseen", Containers: []corev1.Container{{Name: "app", Image: "canopy/echo"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The test process plays the pod's process: no node proxy is
	// admitted, so none of its binds is a proxy's.
	n := startNodeAdmitting(t, redirect.Guarded{Backend: redirect.Nftables{}, Guard: guard}, func(int) error { return nil }, nodeName, zdsPath, pair.B, t.TempDir())

	const wait = 1500 * time.Millisecond // seven passes
	var binds, taken int
	var firstTaken time.Duration
	// held closes once the binds are over: the ADD's answer follows them
	// only through sockets, which the race detector does not see.
	held := make(chan struct{})
	proxy := &nodeProxy{hold: func(uid string) {
		if uid != string(pod.UID) {
			return
		}
		defer close(held)
		start := time.Now()
		for time.Since(start) < wait {
			binds++
			if err := bindProxyPort(pair.A); err == nil {
				if taken == 0 {
					firstTaken = time.Since(start)
				}
				taken++
			}
			time.Sleep(20 * time.Millisecond)
		}
	}}
	pctx, pcancel := context.WithCancel(context.Background())
	defer pcancel()
	go proxy.run(pctx, zdsPath)
	eventually.Within(t, settle, "node proxy connected", func() bool { return n.zds.Connected() == 1 })

	if _, err := n.plugin.Do(t.Context(), pluginevent.PathAdd, pluginevent.Request{
		ContainerID: "c1", Netns: pair.A, PodName: pod.Name, PodNamespace: ns, PodUID: string(pod.UID), IPs: []string{pair.AddrA.String()},
	}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held:
	case <-time.After(settle):
		t.Fatal("the node proxy never held the pod")
	}
	if taken > 0 {
		t.Errorf("the pod's process bound 15001 %d times of %d while its ADD waited for the node proxy (first after %v): the pass pruned its guard", taken, binds, firstTaken)
	}
	if err := bindProxyPort(pair.A); !errors.Is(err, unix.EPERM) {
		t.Errorf("bind to 15001 in the enrolled pod: %v, want EPERM", err)
	}
	t.Logf("%d binds during the ADD, %d taken", binds, taken)
}

// TestUnguardableNodeRunsPods: a node whose kernel cannot guard the node
// proxy's ports must not keep its startup taint for it (no pod at all
// would be scheduled there): its self-test passes. An ambient pod is
// still refused, with the reason, and a sidecar pod enrolled.
func TestUnguardableNodeRunsPods(t *testing.T) {
	testenv.Need(t, env)
	nettest.NeedRoot(t)
	nodeName := fmt.Sprintf("agent-node-%d", time.Now().UnixNano()%100000)
	pair := nettest.NewPair(t, netip.MustParsePrefix("10.218.11.0/24"))
	ns := env.Namespace(t, "mesh", map[string]string{enroll.LabelDataplaneMode: enroll.ModeAmbient})
	backend := redirect.Guarded{Backend: redirect.Nftables{}, Guard: redirect.Unguardable{Err: errors.New("the kernel has no bpf_get_ns_current_pid_tgid in cgroup programs")}}
	n := startNodeAdmitting(t, backend, nil, nodeName, filepath.Join(t.TempDir(), "ztunnel.sock"), pair.B, t.TempDir(), func(c *agent.Config) {
		c.Enroll.SidecarCapture = true
	})
	if err := n.agent.SelfTest(); err != nil {
		t.Errorf("self-test on a node that cannot guard: %v (the node keeps its startup taint: no pod is scheduled there)", err)
	}
	pod, err := env.Client.CoreV1().Pods(ns).Create(t.Context(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "ambient"},
		Spec:       corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "app", Image: "canopy/echo"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = n.plugin.Do(t.Context(), pluginevent.PathAdd, pluginevent.Request{
		ContainerID: "c1", Netns: pair.A, PodName: pod.Name, PodNamespace: ns, PodUID: string(pod.UID), IPs: []string{pair.AddrA.String()},
	})
	if err == nil || !strings.Contains(err.Error(), "bpf_get_ns_current_pid_tgid") {
		t.Errorf("ADD of an ambient pod on a node that cannot guard = %v, want refused with the reason", err)
	}
	c := condition(getPod(t, ns, pod.Name))
	if c == nil || c.Status != corev1.ConditionFalse || c.Reason != agent.ReasonFailed || !strings.Contains(c.Message, "cannot be guarded") {
		t.Errorf("Enrolled condition = %+v, want False with %s and the reason", c, agent.ReasonFailed)
	}
}
