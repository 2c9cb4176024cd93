package dns

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/canopy-mesh/canopy/node/dns/upstream"
	"github.com/canopy-mesh/canopy/node/inpod"
)

// Resolvers says where pods' resolvers are found.
type Resolvers struct {
	// ProcRoot is where the node's processes are seen (default /proc):
	// a pod's resolv.conf is read through one of its processes.
	ProcRoot string
	// Fallback is the resolv.conf used for a pod whose own cannot be
	// read (no process of it visible yet, or none at all without the
	// host's PID namespace): the node proxy's own, /etc/resolv.conf
	// unless told.
	Fallback string
	// MaxInFlight bounds a pod's forwarded queries at once: the Server's
	// Limits.MaxInFlight, so that its bound, not the forwarder's, is the
	// one a pod meets (upstream.DefaultMaxInFlight when zero).
	MaxInFlight int
	Log         *slog.Logger
}

// Upstreams returns Upstreams that relay a pod's queries to the
// nameservers of its own resolv.conf, from inside its namespace. A
// stand-in from Fallback is not final: the pod's own file is looked for
// again later, once its containers run.
func (r Resolvers) Upstreams() Upstreams {
	log := r.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	fallback := r.Fallback
	if fallback == "" {
		fallback = "/etc/resolv.conf"
	}
	return func(pod *inpod.Pod) (Upstream, error) {
		conf, final, err := r.podConfig(pod)
		from := "pod"
		if err != nil {
			log.Debug("cannot read a pod's resolv.conf; forwarding to the node proxy's resolvers for now", "err", err)
			from = fallback
			b, ferr := os.ReadFile(fallback)
			if ferr != nil {
				return Upstream{}, fmt.Errorf("pod's resolv.conf: %w; fallback: %w", err, ferr)
			}
			if conf, ferr = upstream.Parse(b); ferr != nil {
				return Upstream{}, fmt.Errorf("pod's resolv.conf: %w; fallback %s: %w", err, fallback, ferr)
			}
		}
		nameservers := conf.Upstreams()
		fwd, err := upstream.NewForwarder(upstream.ForwarderConfig{Nameservers: nameservers, Dial: pod.Dial, MaxInFlight: r.MaxInFlight}, log)
		if err != nil {
			return Upstream{}, err
		}
		up := Upstream{Forwarder: fwd, From: from, Final: final}
		for _, a := range nameservers {
			up.Nameservers = append(up.Nameservers, a.String())
		}
		return up, nil
	}
}

// podConfig reads the pod's own resolv.conf; final when it could.
func (r Resolvers) podConfig(pod *inpod.Pod) (upstream.Config, bool, error) {
	dev, ino, err := pod.NamespaceID()
	if err != nil {
		return upstream.Config{}, false, err
	}
	conf, err := upstream.PodConfigByID(r.ProcRoot, upstream.NetNSID{Dev: dev, Ino: ino})
	if err != nil {
		return upstream.Config{}, false, err
	}
	return conf, true, nil
}
