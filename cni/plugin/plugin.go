// Package plugin is the canopy-cni chained CNI plugin (CNI spec 1.0 and
// later). ADD asks the node agent to enroll the pod and returns only when
// the agent is done; an ambient pod whose enrollment fails, or a sidecar
// pod whose capture cannot be installed as its annotations ask, fails its
// ADD, so it never runs outside the mesh. The previous plugin's result passes
// through unchanged. DEL and CHECK are idempotent.
//
// When the agent cannot be reached (nothing on its socket, or not synced
// yet) the plugin has no Kubernetes client to decide with; it reads the
// namespace record the agent keeps on the node (pluginevent) and lets the
// pod start only if the record names its namespace as outside the mesh.
// Without a readable record every pod fails, as it would for an agent
// that answered with an error.
package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/canopy-mesh/canopy/cni/pluginevent"
)

// Name is the plugin's type in a conflist.
const Name = "canopy-cni"

// Conf is the plugin's network configuration.
type Conf struct {
	types.NetConf
	// AgentSocket is the node agent's socket (default
	// /var/run/canopy/cni.sock).
	AgentSocket string `json:"agentSocket,omitempty"`
	// ExcludeNamespaces are passed through without asking the agent, so
	// system pods start even while the agent is down (default
	// kube-system).
	ExcludeNamespaces []string `json:"excludeNamespaces,omitempty"`
	// TimeoutSeconds bounds the wait for the agent (default 60).
	TimeoutSeconds int `json:"timeoutSeconds,omitempty"`
	// NamespaceRecord is the agent's record of the namespaces whose pods
	// may start while it cannot be reached (pluginevent.NamespaceRecord);
	// empty, or missing, means none may.
	NamespaceRecord string `json:"namespaceRecord,omitempty"`
}

// k8sArgs are the CNI_ARGS the container runtime sets for pods.
type k8sArgs struct {
	types.CommonArgs
	K8S_POD_NAME               types.UnmarshallableString //nolint:revive // the runtime's names
	K8S_POD_NAMESPACE          types.UnmarshallableString
	K8S_POD_INFRA_CONTAINER_ID types.UnmarshallableString
	K8S_POD_UID                types.UnmarshallableString
}

// ParseConf reads and checks the configuration.
func ParseConf(stdin []byte) (*Conf, error) {
	conf := &Conf{}
	if err := json.Unmarshal(stdin, conf); err != nil {
		return nil, fmt.Errorf("canopy-cni: parse network configuration: %w", err)
	}
	if conf.TimeoutSeconds < 0 {
		return nil, fmt.Errorf("canopy-cni: timeoutSeconds %d is negative", conf.TimeoutSeconds)
	}
	if conf.ExcludeNamespaces == nil {
		conf.ExcludeNamespaces = []string{"kube-system"}
	}
	if conf.RawPrevResult != nil {
		if err := version.ParsePrevResult(&conf.NetConf); err != nil {
			return nil, fmt.Errorf("canopy-cni: parse prevResult: %w", err)
		}
	}
	return conf, nil
}

// Plugin runs the commands; Agent is the node agent's client.
type Plugin struct {
	Agent func(conf *Conf) Agent
}

// Agent is the node agent as the plugin calls it.
type Agent interface {
	Do(ctx context.Context, path string, req pluginevent.Request) (pluginevent.Response, error)
}

// Funcs returns the skel callbacks.
func (p Plugin) Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: p.add, Del: p.del, Check: p.check}
}

func (p Plugin) agent(conf *Conf) Agent {
	if p.Agent != nil {
		return p.Agent(conf)
	}
	timeout := time.Duration(conf.TimeoutSeconds) * time.Second
	return pluginevent.Client{Socket: conf.AgentSocket, Timeout: timeout}
}

func request(args *skel.CmdArgs, conf *Conf) (pluginevent.Request, error) {
	var k k8sArgs
	if err := types.LoadArgs(args.Args, &k); err != nil {
		return pluginevent.Request{}, fmt.Errorf("canopy-cni: CNI_ARGS: %w", err)
	}
	req := pluginevent.Request{
		ContainerID: args.ContainerID, Netns: args.Netns,
		PodName: string(k.K8S_POD_NAME), PodNamespace: string(k.K8S_POD_NAMESPACE), PodUID: string(k.K8S_POD_UID),
	}
	if conf.PrevResult != nil {
		res, err := current.NewResultFromResult(conf.PrevResult)
		if err != nil {
			return req, fmt.Errorf("canopy-cni: convert prevResult: %w", err)
		}
		for _, ip := range res.IPs {
			req.IPs = append(req.IPs, ip.Address.IP.String())
		}
	}
	return req, nil
}

func (p Plugin) add(args *skel.CmdArgs) error {
	conf, err := ParseConf(args.StdinData)
	if err != nil {
		return err
	}
	if conf.PrevResult == nil {
		return errors.New("canopy-cni: no prevResult: it must be chained after the plugin that sets up the pod's interface")
	}
	req, err := request(args, conf)
	if err != nil {
		return err
	}
	if req.PodName != "" && !slices.Contains(conf.ExcludeNamespaces, req.PodNamespace) {
		if err := p.askAdd(conf, req); err != nil {
			// Fail closed: a pod the agent cannot answer for does not start.
			return fmt.Errorf("canopy-cni: pod %s/%s: %w", req.PodNamespace, req.PodName, err)
		}
	}
	return types.PrintResult(conf.PrevResult, conf.CNIVersion)
}

// Backoff between attempts to reach an agent that cannot be reached.
const (
	firstRetry = 100 * time.Millisecond
	maxRetry   = time.Second
)

// askAdd asks the agent to take the pod. An agent that cannot be reached
// at all (its socket gone while a new agent replaces it in an upgrade, or
// not synced yet) is asked again until the ADD's timeout, so that pods
// created during the swap wait for the new agent instead of failing; a pod
// whose namespace the agent recorded as outside the mesh starts at once.
// Any answer, a refusal included, is final.
func (p Plugin) askAdd(conf *Conf, req pluginevent.Request) error {
	timeout := time.Duration(conf.TimeoutSeconds) * time.Second
	if timeout == 0 {
		timeout = 60 * time.Second
	}
	deadline := time.Now().Add(timeout)
	agent := p.agent(conf)
	for wait := firstRetry; ; wait = min(2*wait, maxRetry) {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		_, err := agent.Do(ctx, pluginevent.PathAdd, req)
		cancel()
		switch {
		case err == nil:
			return nil
		case errors.Is(err, context.DeadlineExceeded):
			return fmt.Errorf("the node agent did not answer within %s: %w", timeout, err)
		case !errors.Is(err, pluginevent.ErrUnreachable):
			return err
		case outsideMesh(conf, req, err):
			return nil
		case time.Until(deadline) < wait:
			return fmt.Errorf("still unreachable after %s: %w", timeout, err)
		}
		time.Sleep(wait)
	}
}

// outsideMesh reports whether a pod whose ADD the agent did not answer
// (err) may start all the same: only if the agent could not be reached at
// all and its record names the pod's namespace as outside the mesh.
func outsideMesh(conf *Conf, req pluginevent.Request, err error) bool {
	if !errors.Is(err, pluginevent.ErrUnreachable) || conf.NamespaceRecord == "" {
		return false
	}
	rec, rerr := pluginevent.ReadNamespaceRecord(conf.NamespaceRecord)
	if rerr != nil || !rec.Outside(req.PodNamespace) {
		return false
	}
	// The runtime keeps the plugin's stderr in its log.
	fmt.Fprintf(os.Stderr, "canopy-cni: pod %s/%s: %v; started all the same: its namespace is outside the mesh (%s)\n",
		req.PodNamespace, req.PodName, err, conf.NamespaceRecord)
	return true
}

func (p Plugin) del(args *skel.CmdArgs) error {
	conf, err := ParseConf(args.StdinData)
	if err != nil {
		return err
	}
	req, err := request(args, conf)
	if err != nil || req.PodName == "" || slices.Contains(conf.ExcludeNamespaces, req.PodNamespace) {
		return nil
	}
	// DEL must succeed for the runtime to make progress; an agent that is
	// down cleans up when its reconcile finds the pod gone.
	_, _ = p.agent(conf).Do(context.Background(), pluginevent.PathDel, req)
	return nil
}

func (p Plugin) check(args *skel.CmdArgs) error {
	conf, err := ParseConf(args.StdinData)
	if err != nil {
		return err
	}
	if conf.PrevResult == nil {
		return errors.New("canopy-cni: CHECK without prevResult")
	}
	req, err := request(args, conf)
	if err != nil {
		return err
	}
	if req.PodName == "" || slices.Contains(conf.ExcludeNamespaces, req.PodNamespace) {
		return nil
	}
	if _, err := p.agent(conf).Do(context.Background(), pluginevent.PathCheck, req); err != nil {
		return fmt.Errorf("canopy-cni: pod %s/%s: %w", req.PodNamespace, req.PodName, err)
	}
	return nil
}
