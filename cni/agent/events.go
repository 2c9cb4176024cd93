package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/canopy-mesh/canopy/cni/pluginevent"
)

// PluginHandler serves the canopy-cni plugin's requests (package
// pluginevent). ADD returns once the pod is enrolled (an ambient pod's
// redirection, or a sidecar pod's capture, in place), or with the reason
// it is not in the mesh; an error fails the pod's sandbox (fail closed).
func (a *Agent) PluginHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+pluginevent.PathAdd, a.serve(a.cmdAdd))
	mux.HandleFunc("POST "+pluginevent.PathDel, a.serve(a.cmdDel))
	mux.HandleFunc("POST "+pluginevent.PathCheck, a.serve(a.cmdCheck))
	return mux
}

func (a *Agent) serve(f func(context.Context, pluginevent.Request) (pluginevent.Response, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req pluginevent.Request
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&req); err != nil {
			http.Error(w, "bad request: "+err.Error(), http.StatusBadRequest)
			return
		}
		if req.PodName == "" || req.PodNamespace == "" {
			http.Error(w, "bad request: pod name and namespace are required", http.StatusBadRequest)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 55*time.Second)
		defer cancel()
		select {
		case <-a.synced:
		case <-ctx.Done():
			http.Error(w, "node agent not synced with the cluster yet", http.StatusServiceUnavailable)
			return
		}
		resp, err := f(ctx, req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(resp)
	}
}

// pod returns the pod from the informer, else from the API server (a
// brand-new pod may not have reached the informer yet).
func (a *Agent) pod(ctx context.Context, req pluginevent.Request) (*corev1.Pod, error) {
	pod, err := a.pods.Pods(req.PodNamespace).Get(req.PodName)
	if err != nil || (req.PodUID != "" && string(pod.UID) != req.PodUID) {
		pod, err = a.kube.CoreV1().Pods(req.PodNamespace).Get(ctx, req.PodName, metav1.GetOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("get pod %s/%s: %w", req.PodNamespace, req.PodName, err)
	}
	if req.PodUID != "" && string(pod.UID) != req.PodUID {
		return nil, fmt.Errorf("pod %s/%s has uid %s, the runtime set up %s", req.PodNamespace, req.PodName, pod.UID, req.PodUID)
	}
	return pod, nil
}

func (a *Agent) cmdAdd(ctx context.Context, req pluginevent.Request) (pluginevent.Response, error) {
	pod, err := a.pod(ctx, req)
	if err != nil {
		return pluginevent.Response{}, err
	}
	// Whatever the pod's mode, its namespace is recorded: a pod whose
	// namespace joins the mesh later is found by it, not by its IP.
	f, openErr := os.Open(req.Netns)
	if openErr == nil {
		dev, ino := identity(f)
		if err := a.records.save(netnsRecord{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, Netns: req.Netns, Dev: dev, Ino: ino}); err != nil {
			a.log.Warn("cannot record the pod's network namespace", "pod", pod.Namespace+"/"+pod.Name, "err", err)
		}
	}
	d, derr := a.decide(pod)
	if !d.Enroll || derr != nil {
		if f != nil {
			f.Close()
		}
		if derr != nil {
			// Fail closed: a pod whose capture cannot be installed as it
			// asks does not start, rather than start with less.
			return pluginevent.Response{}, a.failed(ctx, pod, decisionMode(d), derr)
		}
		return pluginevent.Response{Reason: d.Reason}, nil
	}
	if openErr != nil {
		return pluginevent.Response{}, a.failed(ctx, pod, decisionMode(d), fmt.Errorf("open netns %s: %w", req.Netns, openErr))
	}
	var ips []netip.Addr
	for _, s := range req.IPs {
		if ip, err := netip.ParseAddr(s); err == nil {
			ips = append(ips, ip)
		}
	}
	if len(ips) == 0 {
		ips = podIPs(pod)
	}
	if len(ips) == 0 {
		f.Close()
		return pluginevent.Response{}, fmt.Errorf("pod %s/%s: no IP in the previous plugin's result", pod.Namespace, pod.Name)
	}
	unlock := a.locks.lock(pod.UID)
	defer unlock()
	if err := a.enrollPod(ctx, pod, f, req.Netns, false, ips, d.Pod); err != nil {
		return pluginevent.Response{}, err
	}
	return pluginevent.Response{Enrolled: true, Reason: d.Reason}, nil
}

// lockMember locks the pod's member for namespace/name; it returns nil
// (and nothing locked) if there is none.
func (a *Agent) lockMember(namespace, name string) (*member, func()) {
	for {
		m := a.memberNamed(namespace, name)
		if m == nil {
			return nil, nil
		}
		unlock := a.locks.lock(m.uid)
		if a.memberOf(m.uid) == m {
			return m, unlock
		}
		unlock() // replaced or removed meanwhile: look again
	}
}

func (a *Agent) cmdDel(ctx context.Context, req pluginevent.Request) (pluginevent.Response, error) {
	if isUID(req.PodUID) {
		if err := a.records.remove(types.UID(req.PodUID)); err != nil {
			a.log.Warn("cannot forget the pod's network namespace", "pod", req.PodNamespace+"/"+req.PodName, "err", err)
		}
	}
	if m, unlock := a.lockMember(req.PodNamespace, req.PodName); m != nil {
		defer unlock()
		pod, err := a.kube.CoreV1().Pods(req.PodNamespace).Get(ctx, req.PodName, metav1.GetOptions{})
		if err != nil { // gone, or unreadable: un-enroll without touching it
			pod = nil
		}
		a.unenrollPod(ctx, m, pod)
	}
	return pluginevent.Response{}, nil
}

func (a *Agent) cmdCheck(ctx context.Context, req pluginevent.Request) (pluginevent.Response, error) {
	pod, err := a.pod(ctx, req)
	if err != nil {
		return pluginevent.Response{}, err
	}
	d, err := a.decide(pod)
	if err != nil {
		return pluginevent.Response{}, err
	}
	if !d.Enroll {
		return pluginevent.Response{Reason: d.Reason}, nil
	}
	m, unlock := a.lockMember(req.PodNamespace, req.PodName)
	if m == nil {
		return pluginevent.Response{}, fmt.Errorf("%s pod %s/%s is not enrolled", decisionMode(d), pod.Namespace, pod.Name)
	}
	defer unlock()
	// Checked against what the pod should have now: a pod no node proxy
	// serves yet has no DNS capture, and is not broken for it.
	if err := a.backend.Verify(m.path(), phased(d.Pod, m.served)); err != nil {
		return pluginevent.Response{}, err
	}
	return pluginevent.Response{Enrolled: true}, nil
}

// Uninstall takes every pod out of the mesh and removes the host rules;
// the agent honours an explicit uninstall this way rather than guessing
// it from a shutdown. Call it after Run has returned, or the next pass
// enrolls the pods again.
func (a *Agent) Uninstall(ctx context.Context) error {
	for _, m := range a.members() {
		unlock := a.locks.lock(m.uid)
		if a.memberOf(m.uid) == m {
			pod, err := a.kube.CoreV1().Pods(m.namespace).Get(ctx, m.name, metav1.GetOptions{})
			if err != nil {
				pod = nil
			}
			a.unenrollPod(ctx, m, pod)
		}
		unlock()
	}
	errs := []error{a.host.Delete(), a.records.clear(), a.removeNamespaceRecord()}
	if gb, ok := a.backend.(GuardBackend); ok {
		errs = append(errs, gb.RemoveGuard())
	}
	return errors.Join(errs...)
}
