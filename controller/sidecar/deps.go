package sidecar

import (
	"encoding/binary"
	"maps"
	"net/netip"
	"slices"

	"github.com/cespare/xxhash/v2"
	"google.golang.org/protobuf/proto"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A Mesh is rebuilt on every change, but most changes touch little: a pod
// turning Ready changes one service's endpoints and nothing a cluster,
// listener or route says. fingerprints summarise what the generators read
// in parts (settings, each kind of configuration, services, each
// hostname's endpoints), so that a share whose parts, as its generation
// recorded them (Reads), are unchanged can be taken from the last Mesh
// instead of generated again (DepsOf).
type fingerprints struct {
	// settings covers the mesh's settings (domain suffix, trust domain…).
	settings string
	// configs cover the mesh's Istio configuration, by kind.
	configs [numConfigKinds]string
	// services covers every service as clusters, listeners and routes see
	// it: the table's service, what the index adds (ServiceInfo), and its
	// endpoints' identities (a cluster's subject alt names).
	services string
	// endpoints cover, by hostname, the endpoints of the services of that
	// name.
	endpoints map[string]string
}

// configKind is a kind of Istio configuration a share may read.
type configKind int

const (
	virtualServices configKind = iota
	destinationRules
	peerAuthentications
	authorizationPolicies
	sidecarResources
	numConfigKinds
)

// fingerprinter hashes the generators' inputs: xxHash-64 (as resource
// versions are) over deterministic protobuf encodings and length-prefixed
// strings.
type fingerprinter struct {
	h   *xxhash.Digest
	buf []byte
	// keys and portKeys are scratch space for sorting map keys.
	keys     []string
	portKeys []uint32
}

func newFingerprinter() *fingerprinter { return &fingerprinter{h: xxhash.New()} }

// sum returns the hash of what was written and starts again.
func (f *fingerprinter) sum() string {
	s := string(binary.BigEndian.AppendUint64(nil, f.h.Sum64()))
	f.h.Reset()
	return s
}

func (f *fingerprinter) str(s string) {
	f.buf = binary.AppendUvarint(f.buf[:0], uint64(len(s)))
	f.buf = append(f.buf, s...)
	_, _ = f.h.Write(f.buf)
}

func (f *fingerprinter) uint(n uint64) {
	f.buf = binary.AppendUvarint(f.buf[:0], n)
	_, _ = f.h.Write(f.buf)
}

func (f *fingerprinter) bool(b bool) {
	if b {
		f.uint(1)
	} else {
		f.uint(0)
	}
}

// msg writes a message's deterministic encoding. A message that does not
// marshal is written as its error, which changes the hash as any change
// of the message would.
func (f *fingerprinter) msg(m proto.Message) {
	b, err := proto.MarshalOptions{Deterministic: true}.MarshalAppend(f.buf[:0], m)
	if err != nil {
		f.str(err.Error())
		return
	}
	_, _ = f.h.Write(b)
	f.buf = b
	f.uint(uint64(len(b))) // after b: it reuses the buffer
}

func (f *fingerprinter) labels(l map[string]string) {
	f.uint(uint64(len(l)))
	keys := slices.AppendSeq(f.keys[:0], maps.Keys(l))
	slices.Sort(keys)
	for _, k := range keys {
		f.str(k)
		f.str(l[k])
	}
	f.keys = keys
}

// object writes what the generators may read of a configuration's
// metadata: its name, age, labels and annotations (dry-run).
func (f *fingerprinter) object(o metav1.ObjectMeta) {
	f.str(o.Namespace)
	f.str(o.Name)
	f.uint(uint64(o.CreationTimestamp.UnixNano()))
	f.labels(o.Labels)
	f.labels(o.Annotations)
}

// fingerprint computes m.fp once m's parts are indexed.
func (m *Mesh) fingerprint() {
	f := newFingerprinter()
	fp := &m.fp

	for _, s := range []string{m.DomainSuffix, m.ClusterID, m.TrustDomain, m.RootNamespace} {
		f.str(s)
	}
	fp.settings = f.sum()
	fp.configs[virtualServices] = configsSum(f, m.virtualServices, func(c *networkingv1.VirtualService) (metav1.ObjectMeta, proto.Message) { return c.ObjectMeta, &c.Spec })
	fp.configs[destinationRules] = configsSum(f, m.destinationRules, func(c *networkingv1.DestinationRule) (metav1.ObjectMeta, proto.Message) { return c.ObjectMeta, &c.Spec })
	fp.configs[peerAuthentications] = configsSum(f, m.peerAuthentications, func(c *securityv1.PeerAuthentication) (metav1.ObjectMeta, proto.Message) {
		return c.ObjectMeta, &c.Spec
	})
	fp.configs[authorizationPolicies] = configsSum(f, m.authorizationPolicies, func(c *securityv1.AuthorizationPolicy) (metav1.ObjectMeta, proto.Message) {
		return c.ObjectMeta, &c.Spec
	})
	fp.configs[sidecarResources] = configsSum(f, m.sidecars, func(c *networkingv1.Sidecar) (metav1.ObjectMeta, proto.Message) { return c.ObjectMeta, &c.Spec })

	hosts := slices.Sorted(maps.Keys(m.services))
	for _, h := range hosts {
		for _, s := range m.services[h] {
			f.msg(s.Service)
			f.info(s.Info)
			for _, sa := range m.serviceAccounts(s) {
				f.str(sa)
			}
			f.str("") // the end of the identities
			// istioTLSPorts are read with the endpoints, whose
			// fingerprint covers them.
			f.uint(uint64(len(s.tunnelPorts)))
			for _, p := range s.tunnelPorts {
				f.uint(uint64(p))
			}
		}
	}
	fp.services = f.sum()

	fp.endpoints = make(map[string]string, len(hosts))
	for _, h := range hosts {
		for _, s := range m.services[h] {
			f.str(s.GetNamespace())
			f.uint(uint64(len(s.Endpoints)))
			for _, ep := range s.Endpoints {
				f.endpoint(ep)
			}
		}
		fp.endpoints[h] = f.sum()
	}
}

func (f *fingerprinter) info(in ServiceInfo) {
	f.uint(uint64(len(in.Protocols)))
	for _, port := range slices.Sorted(maps.Keys(in.Protocols)) {
		f.uint(uint64(port))
		f.str(in.Protocols[port])
	}
	f.bool(in.Protocols == nil)
	f.uint(uint64(in.Resolution))
	f.bool(in.External)
	f.bool(in.AutoAllocated)
	f.uint(uint64(len(in.DNSHosts)))
	for _, d := range in.DNSHosts {
		f.str(d.Host)
		f.ports(d.Ports)
		f.uint(uint64(d.Weight))
		f.bool(d.Entry != nil)
		if e := d.Entry; e != nil {
			f.str(e.Workload)
			f.str(e.CanonicalName)
			f.str(e.CanonicalRevision)
		}
	}
}

func (f *fingerprinter) ports(ports map[uint32]uint32) {
	f.uint(uint64(len(ports)))
	keys := slices.AppendSeq(f.portKeys[:0], maps.Keys(ports))
	slices.Sort(keys)
	for _, p := range keys {
		f.uint(uint64(p))
		f.uint(uint64(ports[p]))
	}
	f.portKeys = keys
}

func (f *fingerprinter) endpoint(ep Endpoint) {
	f.msg(ep.Workload)
	f.ports(ep.Ports)
	f.labels(ep.Labels)
	f.bool(ep.Terminating)
	f.bool(ep.Entry != nil)
	if ep.Entry != nil {
		f.str(ep.Entry.Workload)
		f.str(ep.Entry.CanonicalName)
		f.str(ep.Entry.CanonicalRevision)
	}
}

// configsSum is the fingerprint of one kind's configurations.
func configsSum[T any](f *fingerprinter, cs []T, parts func(T) (metav1.ObjectMeta, proto.Message)) string {
	f.uint(uint64(len(cs)))
	for _, c := range cs {
		meta, spec := parts(c)
		f.object(meta)
		f.msg(spec)
	}
	return f.sum()
}

// ownSum covers the endpoints at addresses ips: which services (by
// namespace and hostname) they serve, and all of each endpoint, as a
// proxy's own inbound side reads them.
func (m *Mesh) ownSum(ips []netip.Addr) string {
	f := newFingerprinter()
	for _, ref := range m.endpointsAt(ips) {
		f.str(ref.svc.GetNamespace())
		f.str(ref.svc.GetHostname())
		f.endpoint(*ref.ep)
	}
	return f.sum()
}
