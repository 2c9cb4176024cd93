package kubelet

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// startProbes runs container i's startup, liveness and readiness probes from
// the node's network namespace, as a kubelet does.
func (r *podRuntime) startProbes(i int, c *corev1.Container) {
	if c.StartupProbe != nil {
		r.probeLoop(i, c, c.StartupProbe, func(v *containerView) bool { return !v.Started }, func(ok bool) {
			if ok {
				r.update(func(v *podView) {
					cv := &v.Containers[i]
					cv.Started = true
					cv.Ready = c.ReadinessProbe == nil
				})
				return
			}
			r.kill(c.Name, "startup probe failed")
		})
	}
	if c.LivenessProbe != nil {
		r.probeLoop(i, c, c.LivenessProbe, func(v *containerView) bool { return v.Started }, func(ok bool) {
			if !ok {
				r.kill(c.Name, "liveness probe failed")
			}
		})
	}
	if c.ReadinessProbe != nil {
		r.probeLoop(i, c, c.ReadinessProbe, func(v *containerView) bool { return v.Started }, func(ok bool) {
			r.update(func(v *podView) { v.Containers[i].Ready = ok })
		})
	}
}

// probeLoop runs probe every period while the container runs and active
// says the probe applies, and calls onResult when the result crosses the
// success or failure threshold. Each start of the container begins afresh:
// counters reset and the initial delay counts from that start.
func (r *podRuntime) probeLoop(i int, c *corev1.Container, probe *corev1.Probe, active func(*containerView) bool, onResult func(ok bool)) {
	period := seconds(probe.PeriodSeconds, 10)
	timeout := seconds(probe.TimeoutSeconds, 1)
	delay := time.Duration(probe.InitialDelaySeconds) * time.Second
	needSuccess, needFailure := max(probe.SuccessThreshold, 1), probe.FailureThreshold
	if needFailure <= 0 {
		needFailure = 3
	}
	if h := probe.ProbeHandler; h.HTTPGet == nil && h.TCPSocket == nil {
		r.log.Warn("probe type not supported by the local cluster; treating it as passing", "container", c.Name)
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		var (
			lastStart            time.Time
			successes, failures  int32
			reported, lastResult bool
		)
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			r.mu.Lock()
			cv := r.view.Containers[i]
			podIP := ""
			if len(r.view.PodIPs) > 0 {
				podIP = r.view.PodIPs[0]
			}
			r.mu.Unlock()
			switch {
			case cv.State.Running == nil || !active(&cv):
				successes, failures, reported = 0, 0, false
			case !cv.State.Running.StartedAt.Time.Equal(lastStart):
				lastStart = cv.State.Running.StartedAt.Time
				successes, failures, reported = 0, 0, false
				fallthrough
			default:
				if time.Since(lastStart) < delay {
					break
				}
				if err := r.probeOnce(c, probe, podIP, timeout); err == nil {
					successes, failures = successes+1, 0
					if successes >= needSuccess && (!reported || !lastResult) {
						reported, lastResult = true, true
						onResult(true)
					}
				} else {
					successes, failures = 0, failures+1
					r.log.Debug("probe failed", "container", c.Name, "err", err)
					if failures >= needFailure && (!reported || lastResult) {
						reported, lastResult = true, false
						onResult(false)
					}
				}
			}
			select {
			case <-r.ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
}

func seconds(v, def int32) time.Duration {
	if v <= 0 {
		v = def
	}
	return time.Duration(v) * time.Second
}

// probeOnce runs one probe attempt. Exec and gRPC probes are not supported:
// they count as success (probeLoop logs that once).
func (r *podRuntime) probeOnce(c *corev1.Container, probe *corev1.Probe, podIP string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(r.ctx, timeout)
	defer cancel()
	switch h := probe.ProbeHandler; {
	case h.HTTPGet != nil:
		return probeHTTP(ctx, c, h.HTTPGet, podIP)
	case h.TCPSocket != nil:
		host := h.TCPSocket.Host
		if host == "" {
			host = podIP
		}
		port, err := resolvePort(c, h.TCPSocket.Port)
		if err != nil {
			return err
		}
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return err
		}
		return conn.Close()
	default:
		return nil
	}
}

func probeHTTP(ctx context.Context, c *corev1.Container, g *corev1.HTTPGetAction, podIP string) error {
	host := g.Host
	if host == "" {
		host = podIP
	}
	port, err := resolvePort(c, g.Port)
	if err != nil {
		return err
	}
	scheme := "http"
	if g.Scheme == corev1.URISchemeHTTPS {
		scheme = "https"
	}
	u := url.URL{Scheme: scheme, Host: net.JoinHostPort(host, strconv.Itoa(port)), Path: g.Path}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	req.Header.Set("User-Agent", "kube-probe/canopy-local")
	for _, h := range g.HTTPHeaders {
		req.Header.Add(h.Name, h.Value)
	}
	// Like a kubelet: no keep-alive, and HTTPS probes skip verification.
	client := &http.Client{Transport: &http.Transport{
		DisableKeepAlives: true,
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // kubelet probe semantics
	}}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return fmt.Errorf("HTTP probe %s: %s", u.String(), resp.Status)
	}
	return nil
}

// resolvePort turns a probe port, a number or a container port name, into
// a number.
func resolvePort(c *corev1.Container, p intstr.IntOrString) (int, error) {
	if p.Type == intstr.Int {
		return p.IntValue(), nil
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return int(cp.ContainerPort), nil
		}
	}
	return 0, fmt.Errorf("container %s has no port named %q", c.Name, p.StrVal)
}

// kill ends a container's process so that its supervisor restarts it.
func (r *podRuntime) kill(container, why string) {
	r.mu.Lock()
	p := r.procs[container]
	r.mu.Unlock()
	if p == nil {
		return
	}
	r.log.Info("killing container", "container", container, "reason", why)
	_ = syscall.Kill(-p.Pid, syscall.SIGKILL)
}
