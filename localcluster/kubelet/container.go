package kubelet

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/canopy-mesh/canopy/internal/cgroup"
	"github.com/canopy-mesh/canopy/internal/netns"
	"github.com/canopy-mesh/canopy/localcluster/containerinit"
)

// A container that ran this long before exiting restarts without backoff.
const stableRun = 10 * time.Second

// exitStatus is how a container process ended.
type exitStatus struct {
	code    int32
	reason  string
	started metav1.Time
}

// runProcess starts the container's program and waits for it to exit.
// onStart runs once the process exists.
func (r *podRuntime) runProcess(c *corev1.Container, onStart func(metav1.Time)) (exitStatus, error) {
	cmd, logFile, err := r.command(c)
	if err != nil {
		return exitStatus{}, err
	}
	defer logFile.Close()

	r.mu.Lock()
	path := r.netnsPath
	r.mu.Unlock()
	start := cmd.Start
	if dir := r.cgroupDir(); dir != "" {
		start = func() error { return cgroup.Start(cmd, dir) }
	}
	if path != "" {
		inCgroup := start
		start = func() error { return netns.Do(path, inCgroup) }
	}
	if err := start(); err != nil {
		return exitStatus{}, fmt.Errorf("start %s: %w", c.Name, err)
	}
	started := metav1.Now()
	r.mu.Lock()
	r.procs[c.Name] = cmd.Process
	r.mu.Unlock()
	// stop signals what is registered; a process that registered after it
	// began is killed here instead.
	if r.ctx.Err() != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	if err := r.saveRecord(); err != nil {
		r.log.Warn("save pod record failed", "err", err)
	}
	onStart(started)

	err = cmd.Wait()
	r.mu.Lock()
	delete(r.procs, c.Name)
	r.mu.Unlock()
	if err := r.saveRecord(); err != nil {
		r.log.Warn("save pod record failed", "err", err)
	}
	st := exitStatus{started: started, reason: "Completed"}
	var exitErr *exec.ExitError
	switch {
	case errors.As(err, &exitErr):
		st.code = int32(exitErr.ExitCode())
		if st.code < 0 { // killed by a signal
			st.code = 137
		}
		st.reason = "Error"
	case err != nil:
		return exitStatus{}, fmt.Errorf("wait for %s: %w", c.Name, err)
	}
	return st, nil
}

// command builds the process of a container: the container init in a mount
// namespace of its own, running the image's program.
func (r *podRuntime) command(c *corev1.Container) (*exec.Cmd, *os.File, error) {
	program, err := r.p.imageProgram(c.Image)
	if err != nil {
		return nil, nil, err
	}
	env, err := r.envFor(r.ctx, c)
	if err != nil {
		return nil, nil, err
	}
	// The image's program replaces the entrypoint; a command's first word
	// names the program inside the image and is dropped. The rest refer to
	// the container's variables as $(NAME).
	vars := envMap(env)
	argv := []string{program}
	if len(c.Command) > 1 {
		for _, a := range c.Command[1:] {
			argv = append(argv, expand(a, vars))
		}
	}
	for _, a := range c.Args {
		argv = append(argv, expand(a, vars))
	}

	r.mu.Lock()
	volumes := r.volumes
	r.mu.Unlock()
	mounts, err := containerMounts(c, volumes)
	if err != nil {
		return nil, nil, err
	}
	// Images here set no working directory, so a container starts in /,
	// as a runtime starts one whose image sets none (programs such as
	// pilot-agent find their files by paths relative to it).
	spec := containerinit.Spec{Argv: argv, WorkingDir: cmp.Or(c.WorkingDir, "/")}
	pod := r.pod
	if !pod.Spec.HostNetwork || pod.Spec.DNSPolicy == corev1.DNSClusterFirstWithHostNet {
		spec.Mounts = append(spec.Mounts, containerinit.Mount{Source: filepath.Join(r.dir, "resolv.conf"), Target: "/etc/resolv.conf", ReadOnly: true})
	}
	if !pod.Spec.HostNetwork {
		spec.Hostname = pod.Name
		spec.Mounts = append(spec.Mounts, containerinit.Mount{Source: filepath.Join(r.dir, "hosts"), Target: "/etc/hosts", ReadOnly: true})
	}
	spec.Mounts = append(spec.Mounts, mounts...)
	cmd, err := containerinit.Command(r.p.cfg.SelfBinary, spec)
	if err != nil {
		return nil, nil, err
	}
	cmd.Env = env
	logFile, err := os.OpenFile(r.logPath(c.Name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, fmt.Errorf("open log: %w", err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	return cmd, logFile, nil
}

// supervise runs container i until the pod is deleted, restarting it as the
// pod's restart policy says, with exponential backoff.
func (r *podRuntime) supervise(i int, c *corev1.Container) {
	backoff := r.p.cfg.RestartBackoff
	for r.ctx.Err() == nil {
		st, err := r.runProcess(c, func(started metav1.Time) {
			r.update(func(v *podView) {
				cv := &v.Containers[i]
				cv.State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: started}}
				// Without a startup probe a running container has started;
				// without a readiness probe it is ready.
				cv.Started = c.StartupProbe == nil
				cv.Ready = c.StartupProbe == nil && c.ReadinessProbe == nil
			})
		})
		if err != nil {
			r.update(func(v *podView) {
				cv := &v.Containers[i]
				if r.pod.Spec.RestartPolicy == corev1.RestartPolicyNever {
					// Never retried: a terminal state, so the pod fails.
					cv.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
						ExitCode: 128, Reason: "StartError", Message: err.Error(), FinishedAt: metav1.Now(),
					}}
					return
				}
				cv.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "RunContainerError", Message: err.Error()}}
			})
		} else {
			r.update(func(v *podView) {
				cv := &v.Containers[i]
				cv.Ready, cv.Started = false, false
				cv.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
					ExitCode: st.code, Reason: st.reason, StartedAt: st.started, FinishedAt: metav1.Now(),
				}}
			})
			if time.Since(st.started.Time) > stableRun {
				backoff = r.p.cfg.RestartBackoff
			}
		}
		if r.ctx.Err() != nil || !restarts(r.pod.Spec.RestartPolicy, err, st.code) {
			return
		}
		r.update(func(v *podView) {
			cv := &v.Containers[i]
			if cv.State.Terminated != nil {
				cv.LastState = cv.State
			}
			cv.RestartCount++
			cv.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff",
				Message: fmt.Sprintf("back-off %s restarting failed container %s", backoff, c.Name)}}
		})
		select {
		case <-r.ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, r.p.cfg.MaxRestartBackoff)
	}
}

// restarts reports whether a container that ended so is started again.
func restarts(policy corev1.RestartPolicy, startErr error, code int32) bool {
	switch policy {
	case corev1.RestartPolicyNever:
		return false
	case corev1.RestartPolicyOnFailure:
		return startErr != nil || code != 0
	default:
		return true
	}
}

// runInit runs init container i to success, retrying failures unless the
// restart policy is Never (then the pod fails). It reports whether the pod
// may go on.
func (r *podRuntime) runInit(i int) bool {
	c := &r.pod.Spec.InitContainers[i]
	backoff := r.p.cfg.RestartBackoff
	for r.ctx.Err() == nil {
		st, err := r.runProcess(c, func(started metav1.Time) {
			r.update(func(v *podView) {
				v.InitContainers[i].State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: started}}
			})
		})
		if err == nil && st.code == 0 {
			r.update(func(v *podView) {
				v.InitContainers[i].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
					ExitCode: 0, Reason: "Completed", StartedAt: st.started, FinishedAt: metav1.Now(),
				}}
			})
			return true
		}
		msg := fmt.Sprintf("exit code %d", st.code)
		if err != nil {
			msg = err.Error()
		}
		r.update(func(v *podView) {
			v.InitContainers[i].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: max(st.code, 1), Reason: "Error", Message: msg, StartedAt: st.started, FinishedAt: metav1.Now(),
			}}
			v.InitContainers[i].RestartCount++
			if r.pod.Spec.RestartPolicy == corev1.RestartPolicyNever {
				v.Failed, v.Reason, v.Message = true, "InitContainerFailed", fmt.Sprintf("init container %s: %s", c.Name, msg)
			}
		})
		if r.pod.Spec.RestartPolicy == corev1.RestartPolicyNever {
			return false
		}
		select {
		case <-r.ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, r.p.cfg.MaxRestartBackoff)
	}
	return false
}
