package sidecar

import (
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	networkingapi "istio.io/api/networking/v1"
	securityapi "istio.io/api/security/v1beta1"
	typeapi "istio.io/api/type/v1beta1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"

	"github.com/canopy-mesh/canopy/workloadapi"
)

var (
	reuseSeed  = flag.Uint64("reuse-seed", 0, "TestReuseMatchesRebuild: the random sequence's seed (0: from the clock, logged)")
	reuseSteps = flag.Int("reuse-steps", 200, "TestReuseMatchesRebuild: changes per run")
)

// reuseModel is what TestReuseMatchesRebuild changes, on top of
// sharesInputs: each field one thing a Kubernetes event can change.
type reuseModel struct {
	unhealthy, versions, accounts, ports, zones map[string]string // by "<ns>/<pod>"
	vsTimeout                                   bool
	vsGone                                      bool
	dr                                          string // "", "subsets", "tls-disable"
	paMode                                      securityapi.PeerAuthentication_MutualTLS_Mode
	paPort                                      bool // a workload policy with a port-level mode
	apSource                                    string
	sidecarA                                    bool
	apiService                                  bool
}

var reusePods = []string{"a/web-v1", "a/web-v2", "b/web-v1", "b/web-v2"}

// reuseChanges are the events, each changing the model and saying what
// it did.
var reuseChanges = []func(m *reuseModel, r *rand.Rand) string{
	podChange("readiness", func(m *reuseModel) map[string]string { return m.unhealthy }, func(_ *rand.Rand, was string) string {
		return map[string]string{"": "y", "y": ""}[was]
	}),
	podChange("version label", func(m *reuseModel) map[string]string { return m.versions }, pick("v%d", 3)),
	podChange("service account", func(m *reuseModel) map[string]string { return m.accounts }, pick("sa%d", 3)),
	podChange("target port", func(m *reuseModel) map[string]string { return m.ports }, pick("808%d", 2)),
	podChange("zone", func(m *reuseModel) map[string]string { return m.zones }, pick("z%d", 3)),
	func(m *reuseModel, _ *rand.Rand) string {
		m.vsTimeout = !m.vsTimeout
		return "a VirtualService's timeout"
	},
	func(m *reuseModel, _ *rand.Rand) string { m.vsGone = !m.vsGone; return "a VirtualService's presence" },
	func(m *reuseModel, r *rand.Rand) string {
		m.dr = []string{"", "subsets", "tls-disable"}[r.IntN(3)]
		return "a DestinationRule: " + m.dr
	},
	func(m *reuseModel, r *rand.Rand) string {
		m.paMode = securityapi.PeerAuthentication_MutualTLS_Mode(r.IntN(4))
		return "namespace a's PeerAuthentication: " + m.paMode.String()
	},
	func(m *reuseModel, _ *rand.Rand) string {
		m.paPort = !m.paPort
		return "a port-level PeerAuthentication"
	},
	func(m *reuseModel, r *rand.Rand) string {
		m.apSource = []string{"b", "a", "c"}[r.IntN(3)]
		return "an AuthorizationPolicy's source namespace: " + m.apSource
	},
	func(m *reuseModel, _ *rand.Rand) string { m.sidecarA = !m.sidecarA; return "a Sidecar resource in a" },
	func(m *reuseModel, _ *rand.Rand) string { m.apiService = !m.apiService; return "service api.a" },
}

// podChange changes one field of a random pod: what field's map holds for
// it becomes next of what it was.
func podChange(what string, field func(*reuseModel) map[string]string, next func(r *rand.Rand, was string) string) func(*reuseModel, *rand.Rand) string {
	return func(m *reuseModel, r *rand.Rand) string {
		p := reusePods[r.IntN(len(reusePods))]
		f := field(m)
		f[p] = next(r, f[p])
		return what + " of " + p
	}
}

// pick is a next value for podChange: format with one of n numbers.
func pick(format string, n int) func(*rand.Rand, string) string {
	return func(r *rand.Rand, _ string) string { return fmt.Sprintf(format, r.IntN(n)) }
}

// inputs are sharesInputs changed as the model says.
func (m *reuseModel) inputs() Inputs {
	in := sharesInputs()
	labels := map[string]map[string]string{}
	for _, a := range in.Addresses {
		w := a.GetWorkload()
		if w == nil {
			continue
		}
		p := w.GetNamespace() + "/" + w.GetName()
		if m.unhealthy[p] != "" {
			w.Status = workloadapi.WorkloadStatus_UNHEALTHY
		}
		if sa := m.accounts[p]; sa != "" {
			w.ServiceAccount = sa
		}
		if z := m.zones[p]; z != "" {
			w.Locality = &workloadapi.Locality{Region: "r", Zone: z}
		}
		for _, pl := range w.GetServices() {
			if port := m.ports[p]; port != "" {
				fmt.Sscan(port, &pl.Ports[0].TargetPort)
			}
		}
		if m.apiService && w.GetNamespace() == "a" {
			w.Services["a/api.a.svc.cluster.local"] = &workloadapi.PortList{Ports: []*workloadapi.Port{{ServicePort: 9090, TargetPort: 9090}}}
		}
		l := maps.Clone(in.Labels(w.GetUid()))
		if v := m.versions[p]; v != "" {
			l["version"] = v
		}
		labels[w.GetUid()] = l
	}
	in.Labels = func(uid string) map[string]string { return labels[uid] }
	if m.apiService {
		in.Addresses = append(in.Addresses, withProtocol(svc("a", "api", "10.96.0.9", 9090), workloadapi.AppProtocol_HTTP2))
	}
	if m.vsTimeout {
		in.VirtualServices[0].Spec.Http[1].Timeout = durationpb.New(time.Second)
	}
	if m.vsGone {
		in.VirtualServices = nil
	}
	switch m.dr {
	case "subsets":
		in.DestinationRules = append(in.DestinationRules, &networkingv1.DestinationRule{ObjectMeta: meta("a", "web", time.Hour), Spec: networkingapi.DestinationRule{
			Host: "web", Subsets: []*networkingapi.Subset{{Name: "v1", Labels: map[string]string{"version": "v1"}}},
		}})
	case "tls-disable":
		in.DestinationRules = append(in.DestinationRules, &networkingv1.DestinationRule{ObjectMeta: meta("a", "web", time.Hour), Spec: networkingapi.DestinationRule{
			Host: "web", TrafficPolicy: &networkingapi.TrafficPolicy{Tls: &networkingapi.ClientTLSSettings{Mode: networkingapi.ClientTLSSettings_DISABLE}},
		}})
	}
	if m.paMode != securityapi.PeerAuthentication_MutualTLS_UNSET {
		in.PeerAuthentications = append(in.PeerAuthentications, &securityv1.PeerAuthentication{ObjectMeta: meta("a", "default", time.Hour),
			Spec: securityapi.PeerAuthentication{Mtls: &securityapi.PeerAuthentication_MutualTLS{Mode: m.paMode}}})
	}
	if m.paPort {
		in.PeerAuthentications = append(in.PeerAuthentications, &securityv1.PeerAuthentication{ObjectMeta: meta("a", "web-ports", time.Hour),
			Spec: securityapi.PeerAuthentication{
				Selector:      &typeapi.WorkloadSelector{MatchLabels: map[string]string{"app": "web"}},
				PortLevelMtls: map[uint32]*securityapi.PeerAuthentication_MutualTLS{8080: {Mode: securityapi.PeerAuthentication_MutualTLS_DISABLE}},
			}})
	}
	if m.apSource != "" {
		in.AuthorizationPolicies[0].Spec.Rules[0].From[0].Source.Namespaces = []string{m.apSource}
	}
	if m.sidecarA {
		in.Sidecars = append(in.Sidecars, sidecarResource("a", "default", time.Hour, nil, "./*"))
	}
	return in
}

// reuseAsked are the names each kind of client asks for, per type.
var reuseAsked = map[bool]map[string][]string{
	true: { // sidecars
		ClusterType:  nil,
		ListenerType: nil,
		EndpointType: {"outbound|80||web.a.svc.cluster.local", "outbound|80||web.b.svc.cluster.local", "outbound|80|v1|web.a.svc.cluster.local", "outbound|9090||api.a.svc.cluster.local"},
		RouteType:    {"80", "9090"},
	},
	false: { // proxyless gRPC clients
		ClusterType:  {"outbound|80||web.a.svc.cluster.local", "outbound|9090||api.a.svc.cluster.local", "outbound|80|v1|web.a.svc.cluster.local"},
		EndpointType: {"outbound|80||web.a.svc.cluster.local", "outbound|9090||api.a.svc.cluster.local"},
		ListenerType: {"web.a.svc.cluster.local:80", "api.a.svc.cluster.local:9090", ServerListenerPrefix + "10.0.0.1:8080", ServerListenerPrefix + "0.0.0.0:9090"},
		RouteType:    {"web.a.svc.cluster.local:80", "api.a.svc.cluster.local:9090"},
	},
}

// heldReuse is what the simulated cache holds of a share.
type heldReuse struct {
	reads *Reads
	deps  string
	res   []Named
}

// TestReuseMatchesRebuild drives long random sequences of changes (pods'
// readiness, labels, identities, ports and zones; a service coming and
// going; VirtualServices, DestinationRules, PeerAuthentications,
// AuthorizationPolicies and Sidecar resources) through a Mesh rebuilt
// after each, and serves every proxy of sharesMesh, sidecar and
// proxyless alike, as the controller's cache does: a share the last
// generation held is taken over when what its generation read is
// unchanged (DepsOf). After every change, everything served must equal
// what generating it from scratch gives. A dependency the record misses
// shows as a share served stale. -reuse-seed replays a failing sequence.
func TestReuseMatchesRebuild(t *testing.T) {
	seed := *reuseSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (-reuse-seed=%d replays it)", seed, seed)
	r := rand.New(rand.NewPCG(seed, 0))
	model := &reuseModel{unhealthy: map[string]string{}, versions: map[string]string{}, accounts: map[string]string{}, ports: map[string]string{}, zones: map[string]string{}}
	var history []string
	var prev map[string]heldReuse
	taken := 0
	proxies := slices.Sorted(maps.Keys(shareProxies))
	for step := range *reuseSteps {
		if step > 0 {
			history = append(history, reuseChanges[r.IntN(len(reuseChanges))](model, r))
		}
		m := NewMesh(model.inputs())
		cur := map[string]heldReuse{}
		for _, sidecar := range []bool{true, false} {
			for _, name := range proxies {
				p := shareProxies[name]
				for _, typ := range []string{ClusterType, EndpointType, ListenerType, RouteType} {
					names := reuseAsked[sidecar][typ]
					shares := m.GRPCShares(p, typ, names)
					if sidecar {
						shares = m.SidecarShares(p, typ, names)
					}
					for _, sh := range shares {
						key := fmt.Sprint(sidecar, "\x00", typ, "\x00", sh.Key, "\x00", sh.Name)
						h, ok := cur[key]
						if !ok {
							if old, was := prev[key]; was && m.DepsOf(old.reads) == old.deps {
								h, ok = old, true
								taken++
							}
						}
						if !ok {
							rd := &Reads{}
							res := sh.Generate(rd)
							h = heldReuse{rd, m.DepsOf(rd), res}
						}
						cur[key] = h
						if diff := cmp.Diff(sh.Generate(nil), h.res, cmp.Comparer(proto.Equal)); diff != "" {
							t.Fatalf("step %d: %s %s share %q of %s served stale after:\n  %s\n(-rebuilt +served):\n%s",
								step, map[bool]string{true: "sidecar", false: "proxyless"}[sidecar], shortName(typ), sh.Name, name,
								strings.Join(history[max(0, len(history)-8):], "\n  "), diff)
						}
					}
				}
			}
		}
		prev = cur
	}
	t.Logf("%d changes, %d shares taken over from the previous generation", *reuseSteps-1, taken)
	if taken == 0 {
		t.Error("no share was ever taken over: the test exercises nothing")
	}
}
