package kubelet

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/canopy-mesh/canopy/internal/cgroup"
	"github.com/canopy-mesh/canopy/internal/netns"
	"github.com/canopy-mesh/canopy/internal/procs"
)

// podRuntime is one pod on this node: its sandbox (network namespace,
// volumes, DNS files) and its containers' processes.
type podRuntime struct {
	p   *Provider
	log *slog.Logger
	dir string

	// pod is the pod as created: its identity and spec never change, so
	// it is read without the lock. Its current metadata is meta.
	pod *corev1.Pod

	ctx      context.Context // ends when the pod is deleted
	cancel   context.CancelFunc
	wg       sync.WaitGroup // the pod's goroutines; Add before they start
	stopOnce sync.Once
	stopped  chan struct{} // closed when stop has finished

	recordMu sync.Mutex // serializes record writes

	mu         sync.Mutex
	meta       *metav1.ObjectMeta // replaced, never modified, on update
	view       podView
	conditions []corev1.PodCondition
	netnsPath  string
	ips        []string // set once CNI ADD has succeeded
	volumes    map[string]string
	procs      map[string]*os.Process // running processes by container name
}

func newPodRuntime(p *Provider, pod *corev1.Pod) *podRuntime {
	ctx, cancel := context.WithCancel(context.Background())
	r := &podRuntime{
		p:       p,
		log:     p.log.With("pod", podKey(pod.Namespace, pod.Name)),
		dir:     filepath.Join(p.cfg.StateDir, "pods", string(pod.UID)),
		ctx:     ctx,
		cancel:  cancel,
		stopped: make(chan struct{}),
		pod:     pod,
		meta:    pod.ObjectMeta.DeepCopy(),
		procs:   map[string]*os.Process{},
	}
	r.view = podView{
		RestartPolicy: pod.Spec.RestartPolicy,
		HostIP:        p.cfg.NodeIP,
		StartTime:     metav1.Now(),
	}
	waiting := corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}
	for _, c := range pod.Spec.InitContainers {
		r.view.InitContainers = append(r.view.InitContainers, containerView{Name: c.Name, Image: c.Image, State: waiting})
	}
	for _, c := range pod.Spec.Containers {
		r.view.Containers = append(r.view.Containers, containerView{Name: c.Name, Image: c.Image, State: waiting})
	}
	return r
}

// snapshot returns the pod with its current status; the caller owns it.
func (r *podRuntime) snapshot() *corev1.Pod {
	r.mu.Lock()
	defer r.mu.Unlock()
	pod := r.pod.DeepCopy()
	r.meta.DeepCopyInto(&pod.ObjectMeta)
	pod.Status = buildStatus(r.view, r.conditions, metav1.Now())
	r.conditions = pod.Status.Conditions
	return pod
}

// changed publishes the pod's new status.
func (r *podRuntime) changed() { r.p.publish(r.snapshot()) }

// update changes the view under the lock and publishes the result.
func (r *podRuntime) update(f func(v *podView)) {
	r.mu.Lock()
	f(&r.view)
	r.mu.Unlock()
	r.changed()
}

func (r *podRuntime) updateMeta(pod *corev1.Pod) {
	meta := pod.ObjectMeta.DeepCopy()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.meta = meta
}

// current returns the pod with its current metadata (for the downward API).
func (r *podRuntime) current() *corev1.Pod {
	r.mu.Lock()
	defer r.mu.Unlock()
	pod := r.pod.DeepCopy()
	r.meta.DeepCopyInto(&pod.ObjectMeta)
	return pod
}

func (r *podRuntime) logPath(container string) string {
	return filepath.Join(r.dir, "logs", container+".log")
}

// run brings the pod up: sandbox (each step retried with backoff until it
// works or the pod is deleted), init containers in order, then the
// containers. The caller has done r.wg.Add(1) for it.
func (r *podRuntime) run() {
	defer r.wg.Done()
	for _, step := range []struct {
		name string
		f    func() error
	}{
		{"create pod network", r.setupNetwork},
		{"prepare volumes", r.setupVolumes},
		{"write DNS files", r.writeDNSFiles},
	} {
		if !r.retry(step.name, step.f) {
			return
		}
	}
	for i := range r.pod.Spec.InitContainers {
		if !r.runInit(i) {
			return
		}
	}
	for i := range r.pod.Spec.Containers {
		c := &r.pod.Spec.Containers[i]
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.supervise(i, c)
		}()
		r.startProbes(i, c)
	}
}

// retry runs f until it succeeds or the pod is deleted, reporting each
// failure in the containers' waiting state. It reports whether f succeeded.
func (r *podRuntime) retry(what string, f func() error) bool {
	backoff := r.p.cfg.RestartBackoff
	for {
		err := f()
		if err == nil {
			return true
		}
		r.log.Warn("pod start failed, will retry", "step", what, "err", err)
		msg := fmt.Sprintf("%s: %v", what, err)
		r.update(func(v *podView) {
			for i := range v.Containers {
				v.Containers[i].State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating", Message: msg}}
			}
			v.Message = msg
		})
		select {
		case <-r.ctx.Done():
			return false
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, r.p.cfg.MaxRestartBackoff)
	}
}

// record is what a later run of the kubelet needs to clean up a pod this
// run left behind. A pod's own network namespace is found from its UID.
type record struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
	// Processes are the running containers' processes; for a host-network
	// pod they are the only way to find them.
	Processes []procs.Process `json:"processes,omitempty"`
}

func (r *podRuntime) saveRecord() error {
	r.recordMu.Lock()
	defer r.recordMu.Unlock()
	rec := record{Namespace: r.pod.Namespace, Name: r.pod.Name, UID: string(r.pod.UID)}
	r.mu.Lock()
	for _, p := range r.procs {
		if pr, err := procs.Lookup(p.Pid); err == nil {
			rec.Processes = append(rec.Processes, pr)
		}
	}
	r.mu.Unlock()
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		return err
	}
	tmp := filepath.Join(r.dir, "record.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(r.dir, "record.json"))
}

// setupNetwork creates the pod's network namespace and runs CNI ADD, once:
// a failed ADD is undone with DEL before the next try, as the CNI
// specification asks of runtimes.
func (r *podRuntime) setupNetwork() error {
	if err := os.MkdirAll(filepath.Join(r.dir, "logs"), 0o755); err != nil {
		return fmt.Errorf("create pod directory: %w", err)
	}
	if err := r.saveRecord(); err != nil {
		return fmt.Errorf("save pod record: %w", err)
	}
	pod := r.pod
	if pod.Spec.HostNetwork {
		r.update(func(v *podView) { v.PodIPs = []string{r.p.cfg.NodeIP} })
		return nil
	}
	path := netns.Path(netnsName(pod))
	if !netns.Exists(path) {
		// A pin left by a crash is not a namespace: replace it.
		if err := netns.DeletePath(path); err != nil {
			return err
		}
		if _, err := netns.Create(netnsName(pod)); err != nil {
			return err
		}
	}
	r.mu.Lock()
	r.netnsPath = path
	r.mu.Unlock()
	ips, err := r.p.net.add(r.ctx, pod, path)
	if err != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if delErr := r.p.net.del(ctx, pod, path); delErr != nil {
			r.log.Debug("CNI DEL after a failed ADD failed", "err", delErr)
		}
		return err
	}
	r.mu.Lock()
	r.ips = ips
	r.mu.Unlock()
	r.update(func(v *podView) {
		v.PodIPs = ips
		v.Message = ""
	})
	return nil
}

func (r *podRuntime) setupVolumes() error {
	vols, err := r.p.vols.prepare(r.ctx, r.current(), filepath.Join(r.dir, "volumes"), r.p.cfg.hostPath)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.volumes = vols
	r.mu.Unlock()
	return nil
}

// netnsName names a pod's network namespace after its UID, which is unique
// across nodes and clusters.
func netnsName(pod *corev1.Pod) string { return "cpod-" + string(pod.UID) }

// cgroupDir is the cgroup of the pod's processes, "" when the node puts
// pods in none.
func (r *podRuntime) cgroupDir() string { return r.p.podCgroup(string(r.pod.UID)) }

// podCgroup is the cgroup of the pod with uid, as a kubelet with the
// cgroupfs driver names it.
func (p *Provider) podCgroup(uid string) string {
	if p.cfg.CgroupParent == "" {
		return ""
	}
	return filepath.Join(p.cfg.CgroupParent, "kubepods", "pod"+uid)
}

// writeDNSFiles writes the pod's resolv.conf and hosts, as a kubelet does
// for dnsPolicy ClusterFirst.
func (r *podRuntime) writeDNSFiles() error {
	pod, cfg := r.pod, r.p.cfg
	r.mu.Lock()
	ips := r.view.PodIPs
	r.mu.Unlock()
	domain := cfg.ClusterDomain
	resolv := fmt.Sprintf("search %s.svc.%s svc.%s %s\nnameserver %s\noptions ndots:5\n",
		pod.Namespace, domain, domain, domain, cfg.ClusterDNS)
	hosts := "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
	for _, ip := range ips {
		hosts += fmt.Sprintf("%s\t%s\n", ip, pod.Name)
	}
	if err := os.WriteFile(filepath.Join(r.dir, "resolv.conf"), []byte(resolv), 0o644); err != nil {
		return fmt.Errorf("write resolv.conf: %w", err)
	}
	if err := os.WriteFile(filepath.Join(r.dir, "hosts"), []byte(hosts), 0o644); err != nil {
		return fmt.Errorf("write hosts: %w", err)
	}
	return nil
}

// stop ends the pod: its goroutines, its processes (SIGTERM, then SIGKILL
// after grace), then CNI DEL and the network namespace. Concurrent and
// repeated calls wait for the first one.
func (r *podRuntime) stop(grace time.Duration) {
	r.stopOnce.Do(func() {
		defer close(r.stopped)
		r.cancel()
		r.signalAll(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { r.wg.Wait(); close(done) }()
		deadline := time.After(grace)
	wait:
		for {
			select {
			case <-done:
				break wait
			case <-deadline:
				// Keep killing: a process started just before cancel may
				// have registered after the first round.
				deadline = nil
				for {
					r.signalAll(syscall.SIGKILL)
					select {
					case <-done:
						break wait
					case <-time.After(100 * time.Millisecond):
					}
				}
			}
		}
		// A container's stray children (outside its process group) go
		// with the pod's cgroup.
		if dir := r.cgroupDir(); dir != "" {
			if err := cgroup.Remove(dir); err != nil {
				r.log.Warn("remove pod cgroup failed", "err", err)
			}
		}
		r.teardown()
		r.update(func(v *podView) {
			for _, cs := range [][]containerView{v.InitContainers, v.Containers} {
				for i := range cs {
					cs[i].Ready = false
					if cs[i].State.Terminated == nil {
						cs[i].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
							ExitCode: 137, Reason: "Killed", FinishedAt: metav1.Now(),
						}}
					}
				}
			}
		})
	})
	<-r.stopped
}

func (r *podRuntime) signalAll(sig syscall.Signal) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.procs {
		_ = syscall.Kill(-p.Pid, sig)
	}
}

// teardown removes the pod's network and files. When CNI DEL fails the
// namespace and the pod's record stay, so that the next kubelet start
// retries the cleanup.
func (r *podRuntime) teardown() {
	r.mu.Lock()
	path := r.netnsPath
	r.mu.Unlock()
	if path != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := r.p.net.del(ctx, r.pod, path); err != nil {
			r.log.Warn("CNI DEL failed; the next kubelet start retries it", "err", err)
			return
		}
		if err := netns.DeletePath(path); err != nil {
			r.log.Warn("remove pod network namespace failed", "err", err)
		}
	}
	r.keepLogs()
	if err := os.RemoveAll(r.dir); err != nil {
		r.log.Warn("remove pod directory failed", "err", err)
	}
}

// keptLogs is how many deleted pods' logs a node keeps: enough to explain
// what a DaemonSet's pods did during an uninstall, bounded for a cluster
// that runs for days.
const keptLogs = 64

// keepLogs moves the pod's container logs to <StateDir>/terminated, as a
// kubelet keeps a deleted pod's logs for a while: a pod's last words
// (say, a CNI agent deciding at SIGTERM whether it is being uninstalled)
// are what explains a failure, and they would go with the pod's directory.
// The oldest kept logs beyond keptLogs are removed.
func (r *podRuntime) keepLogs() {
	src := filepath.Join(r.dir, "logs")
	if entries, err := os.ReadDir(src); err != nil || len(entries) == 0 {
		return
	}
	dir := filepath.Join(r.p.cfg.StateDir, "terminated")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		r.log.Warn("keep the pod's logs failed", "err", err)
		return
	}
	name := fmt.Sprintf("%s_%s_%s", r.pod.Namespace, r.pod.Name, r.pod.UID)
	dst := filepath.Join(dir, name)
	if err := os.Rename(src, dst); err != nil {
		r.log.Warn("keep the pod's logs failed", "err", err)
		return
	}
	// The time the pod ended orders the kept logs.
	now := time.Now()
	_ = os.Chtimes(dst, now, now)
	kept, err := os.ReadDir(dir)
	if err != nil || len(kept) <= keptLogs {
		return
	}
	type aged struct {
		path string
		mod  time.Time
	}
	var all []aged
	for _, e := range kept {
		if info, err := e.Info(); err == nil {
			all = append(all, aged{filepath.Join(dir, e.Name()), info.ModTime()})
		}
	}
	slices.SortFunc(all, func(a, b aged) int { return a.mod.Compare(b.mod) })
	for _, a := range all[:max(0, len(all)-keptLogs)] {
		_ = os.RemoveAll(a.path)
	}
}

// PodNetns lists the network namespaces of the pods whose directories are
// under the kubelet state directories matching stateDirGlob.
func PodNetns(stateDirGlob string) []string {
	dirs, _ := filepath.Glob(filepath.Join(stateDirGlob, "pods", "*"))
	var out []string
	for _, d := range dirs {
		path := netns.Path("cpod-" + filepath.Base(d))
		if _, err := os.Stat(path); err == nil {
			out = append(out, path)
		}
	}
	return out
}

// cleanupLeftovers removes the pods an earlier run of this kubelet left:
// their processes, networks and directories.
func (p *Provider) cleanupLeftovers(ctx context.Context) error {
	dirs, err := filepath.Glob(filepath.Join(p.cfg.StateDir, "pods", "*"))
	if err != nil {
		return err
	}
	for _, dir := range dirs {
		uid := filepath.Base(dir)
		rec := record{UID: uid}
		if b, err := os.ReadFile(filepath.Join(dir, "record.json")); err == nil {
			if err := json.Unmarshal(b, &rec); err != nil {
				p.log.Warn("unreadable pod record", "dir", dir, "err", err)
			}
		}
		for _, pr := range rec.Processes {
			pr.Kill()
		}
		if dir := p.podCgroup(uid); dir != "" {
			if err := cgroup.Remove(dir); err != nil {
				return fmt.Errorf("remove leftover pod cgroup: %w", err)
			}
		}
		path := netns.Path("cpod-" + uid)
		if _, err := os.Stat(path); err == nil {
			procs.KillInNetns(path)
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: rec.Namespace, Name: rec.Name, UID: types.UID(uid)}}
			if err := p.net.del(ctx, pod, path); err != nil {
				p.log.Warn("CNI DEL of a leftover pod failed", "pod", podKey(rec.Namespace, rec.Name), "err", err)
			}
			if err := netns.DeletePath(path); err != nil {
				return err
			}
		}
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("remove leftover pod directory: %w", err)
		}
		p.log.Info("removed leftover pod", "pod", podKey(rec.Namespace, rec.Name))
	}
	return nil
}

// envFor returns a container's environment: what a kubelet injects, then
// envFrom, then the container's own variables with their references
// resolved (downward API fields, including the pod's IP, ConfigMap and
// Secret keys, $(NAME) references to earlier variables), as a kubelet
// resolves them when the container starts.
func (r *podRuntime) envFor(ctx context.Context, c *corev1.Container) ([]string, error) {
	cfg := r.p.cfg
	env := []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOSTNAME=" + r.pod.Name,
	}
	if cfg.APIServiceHost != "" {
		env = append(env,
			"KUBERNETES_SERVICE_HOST="+cfg.APIServiceHost,
			"KUBERNETES_SERVICE_PORT="+cfg.APIServicePort,
			"KUBERNETES_SERVICE_PORT_HTTPS="+cfg.APIServicePort,
		)
	}
	for _, from := range c.EnvFrom {
		data, err := r.p.vols.envSource(ctx, r.pod.Namespace, from)
		if err != nil {
			return nil, err
		}
		keys := make([]string, 0, len(data))
		for k := range data {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			env = append(env, from.Prefix+k+"="+data[k])
		}
	}
	r.mu.Lock()
	ips := r.ips
	r.mu.Unlock()
	// A value may refer to variables defined before it ($(NAME)).
	defined := envMap(env)
	for _, e := range c.Env {
		v, err := r.p.vols.envValue(ctx, r.pod, ips, cfg.NodeIP, e)
		if err != nil {
			return nil, fmt.Errorf("environment variable %s: %w", e.Name, err)
		}
		if e.ValueFrom == nil {
			v = expand(v, defined)
		}
		defined[e.Name] = v
		env = append(env, e.Name+"="+v)
	}
	return env, nil
}

// imageProgram finds the program an image runs, by repository.
func (p *Provider) imageProgram(image string) (string, error) {
	repo := image
	if i := strings.Index(repo, "@"); i >= 0 {
		repo = repo[:i]
	}
	if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
		repo = repo[:i]
	}
	if path, ok := p.cfg.Images[repo]; ok {
		return path, nil
	}
	known := make([]string, 0, len(p.cfg.Images))
	for k := range p.cfg.Images {
		known = append(known, k)
	}
	return "", fmt.Errorf("image %q is not in the local cluster's image table (known: %s)", image, strings.Join(known, ", "))
}
