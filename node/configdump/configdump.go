// Package configdump is the node proxy's /config_dump in the JSON shape
// istioctl ztunnel-config reads (docs/wire-contract.md §8.2): the types,
// which canopyctl decodes too, and their conversion from the client-side
// table.
package configdump

import (
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/canopy-mesh/canopy/internal/workloadtable"
	"github.com/canopy-mesh/canopy/workloadapi"
	"github.com/canopy-mesh/canopy/workloadapi/security"
)

// Workload is a workload in config_dump (camelCase, empty fields left out).
type Workload struct {
	UID                   string   `json:"uid"`
	WorkloadIPs           []string `json:"workloadIps"`
	Protocol              string   `json:"protocol"`
	NetworkMode           string   `json:"networkMode"`
	Name                  string   `json:"name"`
	Namespace             string   `json:"namespace"`
	ServiceAccount        string   `json:"serviceAccount"`
	TrustDomain           string   `json:"trustDomain"`
	Network               string   `json:"network,omitempty"`
	WorkloadName          string   `json:"workloadName,omitempty"`
	WorkloadType          string   `json:"workloadType"`
	CanonicalName         string   `json:"canonicalName,omitempty"`
	CanonicalRevision     string   `json:"canonicalRevision,omitempty"`
	Hostname              string   `json:"hostname,omitempty"`
	Node                  string   `json:"node,omitempty"`
	AuthorizationPolicies []string `json:"authorizationPolicies,omitempty"`
	// ClusterID is always written, "Kubernetes" when the workload names
	// none, as ztunnel applies that default.
	ClusterID      string             `json:"clusterId"`
	Services       []string           `json:"services,omitempty"`
	Status         string             `json:"status"`
	Waypoint       *Gateway           `json:"waypoint,omitempty"`
	NetworkGateway *Gateway           `json:"networkGateway,omitempty"`
	NativeTunnel   bool               `json:"nativeTunnel,omitempty"`
	AppTunnel      *ApplicationTunnel `json:"applicationTunnel,omitempty"`
	Locality       *Locality          `json:"locality,omitempty"` // left out when all empty
	// Capacity is always written, 1 when the workload names none.
	Capacity uint32 `json:"capacity"`
}

// Locality is where a workload runs.
type Locality struct {
	Region  string `json:"region"`
	Zone    string `json:"zone"`
	Subzone string `json:"subzone"`
}

// ApplicationTunnel is how a workload takes tunneled traffic itself:
// protocol NONE or PROXY, and the port when it is not the default.
type ApplicationTunnel struct {
	Protocol string `json:"protocol"`
	Port     uint32 `json:"port,omitempty"`
}

// Gateway is a waypoint or network gateway reference.
type Gateway struct {
	Destination   string `json:"destination"`
	HboneMtlsPort uint32 `json:"hboneMtlsPort"`
}

// Service is a service in config_dump.
type Service struct {
	Name      string              `json:"name"`
	Namespace string              `json:"namespace"`
	Hostname  string              `json:"hostname"`
	VIPs      []string            `json:"vips"`
	Ports     map[string]uint32   `json:"ports"`
	Endpoints map[string]Endpoint `json:"endpoints"`
	// SubjectAltNames is always written, an empty list when the service
	// names none.
	SubjectAltNames []string      `json:"subjectAltNames"`
	Waypoint        *Gateway      `json:"waypoint,omitempty"`
	LoadBalancer    *LoadBalancer `json:"loadBalancer,omitempty"`
	// IPFamilies is Dual, IPv4 or IPv6; left out when automatic.
	IPFamilies string `json:"ipFamilies,omitempty"`
}

// LoadBalancer is a service's endpoint selection, spelled as ztunnel's
// variant names: routing preferences Region, Zone, Subzone, Node,
// Cluster, Network; mode Standard, Strict, Failover, Passthrough; health
// policy OnlyHealthy, AllowAll.
type LoadBalancer struct {
	RoutingPreferences []string `json:"routingPreferences"`
	Mode               string   `json:"mode"`
	HealthPolicy       string   `json:"healthPolicy"`
}

// Endpoint is one workload of a service, with the workload's own ports
// for it (service port as a string -> target port; empty when the
// workload names none and the service's apply).
type Endpoint struct {
	WorkloadUID string            `json:"workloadUid"`
	Port        map[string]uint32 `json:"port"`
	Status      string            `json:"status"`
}

// Policy is an authorization policy; Rules nest rules, clauses, matches.
// Scope and Action are spelled as ztunnel's serde writes them (Scope).
type Policy struct {
	Name      string               `json:"name"`
	Namespace string               `json:"namespace"`
	Scope     string               `json:"scope"`
	Action    string               `json:"action"`
	Rules     [][][]map[string]any `json:"rules"`
	DryRun    bool                 `json:"dryRun"`
}

// Certificate is one certificate of a chain. PEM is the certificate's PEM
// text encoded again in standard base64, as ztunnel writes it (istioctl
// prints it as it is); the times are RFC 3339 in UTC, whole seconds.
type Certificate struct {
	PEM            string    `json:"pem"`
	SerialNumber   string    `json:"serialNumber"`
	ValidFrom      time.Time `json:"validFrom"`
	ExpirationTime time.Time `json:"expirationTime"`
}

// CertState is one identity's certificates.
type CertState struct {
	Identity  string        `json:"identity"`
	State     string        `json:"state"`
	CertChain []Certificate `json:"certChain"`
	RootCerts []Certificate `json:"rootCerts"`
}

// PodState is a served pod.
type PodState struct {
	State string            `json:"state"`
	Info  map[string]string `json:"info"`
}

// Dump is the whole /config_dump.
type Dump struct {
	Workloads    []Workload  `json:"workloads"`
	Services     []Service   `json:"services"`
	Policies     []Policy    `json:"policies"`
	Certificates []CertState `json:"certificates"`
	// TrustedRoots are the roots peers' chains are checked against now
	// (the bundle file's and those the held certificates chain to); a
	// Canopy addition, absent when unknown.
	TrustedRoots  []Certificate       `json:"trustedRoots,omitempty"`
	WorkloadState map[string]PodState `json:"workloadState"`
	Version       string              `json:"version"`
	Config        map[string]any      `json:"config"`
}

func protocol(w *workloadapi.Workload) string {
	if w.GetTunnelProtocol() == workloadapi.TunnelProtocol_HBONE {
		return "HBONE"
	}
	return "TCP"
}

func status(s workloadapi.WorkloadStatus) string {
	if s == workloadapi.WorkloadStatus_HEALTHY {
		return "Healthy"
	}
	return "Unhealthy"
}

func gateway(g *workloadapi.GatewayAddress) *Gateway {
	if g == nil {
		return nil
	}
	out := &Gateway{HboneMtlsPort: g.GetHboneMtlsPort()}
	if h := g.GetHostname(); h != nil {
		out.Destination = h.GetNamespace() + "/" + h.GetHostname()
	} else if a := g.GetAddress(); a != nil {
		ip, _ := netip.AddrFromSlice(a.GetAddress())
		out.Destination = a.GetNetwork() + "/" + ip.String()
	}
	return out
}

// Workloads converts the table's workloads, sorted by uid.
func Workloads(s workloadtable.Snapshot) []Workload {
	out := []Workload{}
	for _, w := range s.Workloads {
		id := workloadapi.WorkloadIdentity(w)
		x := Workload{
			UID: w.GetUid(), Protocol: protocol(w), Name: w.GetName(), Namespace: w.GetNamespace(),
			ServiceAccount: id.ServiceAccount, TrustDomain: id.TrustDomain, Network: w.GetNetwork(), WorkloadName: w.GetWorkloadName(),
			WorkloadType: strings.ToLower(w.GetWorkloadType().String()), CanonicalName: w.GetCanonicalName(), CanonicalRevision: w.GetCanonicalRevision(),
			Hostname: w.GetHostname(), Node: w.GetNode(), AuthorizationPolicies: w.GetAuthorizationPolicies(), ClusterID: w.GetClusterId(),
			Status: status(w.GetStatus()), Waypoint: gateway(w.GetWaypoint()), WorkloadIPs: []string{}, NetworkMode: "Standard",
			NetworkGateway: gateway(w.GetNetworkGateway()), NativeTunnel: w.GetNativeTunnel(), Capacity: 1,
		}
		if x.ClusterID == "" {
			x.ClusterID = defaultClusterID
		}
		if c := w.GetCapacity(); c != nil {
			x.Capacity = c.GetValue()
		}
		if l := w.GetLocality(); l.GetRegion() != "" || l.GetZone() != "" || l.GetSubzone() != "" {
			x.Locality = &Locality{Region: l.GetRegion(), Zone: l.GetZone(), Subzone: l.GetSubzone()}
		}
		if t := w.GetApplicationTunnel(); t != nil {
			x.AppTunnel = &ApplicationTunnel{Protocol: t.GetProtocol().String(), Port: t.GetPort()}
		}
		if w.GetNetworkMode() == workloadapi.NetworkMode_HOST_NETWORK {
			x.NetworkMode = "HostNetwork"
		}
		for _, b := range w.GetAddresses() {
			if ip, ok := netip.AddrFromSlice(b); ok {
				x.WorkloadIPs = append(x.WorkloadIPs, ip.String())
			}
		}
		for svc := range w.GetServices() {
			x.Services = append(x.Services, svc)
		}
		slices.Sort(x.Services)
		out = append(out, x)
	}
	return out
}

// Services converts the table's services with their endpoints.
func Services(s workloadtable.Snapshot) []Service {
	out := []Service{}
	for _, svc := range s.Services {
		key := workloadapi.ServiceKey(svc.GetNamespace(), svc.GetHostname())
		x := Service{Name: svc.GetName(), Namespace: svc.GetNamespace(), Hostname: svc.GetHostname(), VIPs: []string{},
			Ports: ports(svc.GetPorts()), Endpoints: map[string]Endpoint{}, Waypoint: gateway(svc.GetWaypoint()),
			SubjectAltNames: append([]string{}, svc.GetSubjectAltNames()...), LoadBalancer: loadBalancer(svc.GetLoadBalancing()),
			IPFamilies: ipFamilies(svc.GetIpFamilies())}
		x.VIPs = append(x.VIPs, workloadapi.Aliases(&workloadapi.Address{Type: &workloadapi.Address_Service{Service: svc}})...)
		for _, w := range s.Workloads {
			if pl, ok := w.GetServices()[key]; ok {
				x.Endpoints[w.GetUid()] = Endpoint{WorkloadUID: w.GetUid(), Port: ports(pl.GetPorts()), Status: status(w.GetStatus())}
			}
		}
		out = append(out, x)
	}
	return out
}

// defaultClusterID is the cluster a workload that names none is in, as
// ztunnel defaults it.
const defaultClusterID = "Kubernetes"

// ports maps service ports (as strings, JSON object keys) to target ports.
func ports(ps []*workloadapi.Port) map[string]uint32 {
	out := map[string]uint32{}
	for _, p := range ps {
		out[strconv.FormatUint(uint64(p.GetServicePort()), 10)] = p.GetTargetPort()
	}
	return out
}

func ipFamilies(f workloadapi.IPFamilies) string {
	switch f {
	case workloadapi.IPFamilies_IPV4_ONLY:
		return "IPv4"
	case workloadapi.IPFamilies_IPV6_ONLY:
		return "IPv6"
	case workloadapi.IPFamilies_DUAL:
		return "Dual"
	}
	return ""
}

func loadBalancer(lb *workloadapi.LoadBalancing) *LoadBalancer {
	if lb == nil {
		return nil
	}
	out := &LoadBalancer{RoutingPreferences: []string{}, Mode: "Standard", HealthPolicy: "OnlyHealthy"}
	for _, sc := range lb.GetRoutingPreference() {
		switch sc {
		case workloadapi.LoadBalancing_REGION:
			out.RoutingPreferences = append(out.RoutingPreferences, "Region")
		case workloadapi.LoadBalancing_ZONE:
			out.RoutingPreferences = append(out.RoutingPreferences, "Zone")
		case workloadapi.LoadBalancing_SUBZONE:
			out.RoutingPreferences = append(out.RoutingPreferences, "Subzone")
		case workloadapi.LoadBalancing_NODE:
			out.RoutingPreferences = append(out.RoutingPreferences, "Node")
		case workloadapi.LoadBalancing_CLUSTER:
			out.RoutingPreferences = append(out.RoutingPreferences, "Cluster")
		case workloadapi.LoadBalancing_NETWORK:
			out.RoutingPreferences = append(out.RoutingPreferences, "Network")
		default:
			out.RoutingPreferences = append(out.RoutingPreferences, sc.String())
		}
	}
	switch lb.GetMode() {
	case workloadapi.LoadBalancing_STRICT:
		out.Mode = "Strict"
	case workloadapi.LoadBalancing_FAILOVER:
		out.Mode = "Failover"
	case workloadapi.LoadBalancing_PASSTHROUGH:
		out.Mode = "Passthrough"
	}
	if lb.GetHealthPolicy() == workloadapi.LoadBalancing_ALLOW_ALL {
		out.HealthPolicy = "AllowAll"
	}
	return out
}

// Policies converts the table's policies.
func Policies(s workloadtable.Snapshot) []Policy {
	out := []Policy{}
	for _, p := range s.Policies {
		x := Policy{Name: p.GetName(), Namespace: p.GetNamespace(), Scope: Scope(p.GetScope()),
			Action: Action(p.GetAction()), DryRun: p.GetDryRun(), Rules: [][][]map[string]any{}}
		for _, r := range p.GetRules() {
			// Empty lists, never null: an empty rule (rules: [{}], allow
			// all) is [[]], as ztunnel shows it.
			clauses := [][]map[string]any{}
			for _, c := range r.GetClauses() {
				ms := []map[string]any{}
				for _, m := range c.GetMatches() {
					ms = append(ms, match(m))
				}
				clauses = append(clauses, ms)
			}
			x.Rules = append(x.Rules, clauses)
		}
		out = append(out, x)
	}
	return out
}

// Scope spells a policy's scope as ztunnel's config dump does: the
// variant names of its RbacScope (Global, Namespace, WorkloadSelector),
// which istioctl ztunnel-config policies prints as they are.
func Scope(s security.Scope) string {
	switch s {
	case security.Scope_GLOBAL:
		return "Global"
	case security.Scope_NAMESPACE:
		return "Namespace"
	case security.Scope_WORKLOAD_SELECTOR:
		return "WorkloadSelector"
	}
	return s.String() // a value this build does not know
}

// Action spells a policy's action as ztunnel's RbacAction: Allow, Deny.
func Action(a security.Action) string {
	switch a {
	case security.Action_ALLOW:
		return "Allow"
	case security.Action_DENY:
		return "Deny"
	}
	return a.String()
}

func match(m *security.Match) map[string]any {
	out := map[string]any{}
	strs := func(key string, ms []*security.StringMatch) {
		if len(ms) == 0 {
			return
		}
		var l []map[string]any
		for _, sm := range ms {
			switch t := sm.GetMatchType().(type) {
			case *security.StringMatch_Exact:
				l = append(l, map[string]any{"Exact": t.Exact})
			case *security.StringMatch_Prefix:
				l = append(l, map[string]any{"Prefix": t.Prefix})
			case *security.StringMatch_Suffix:
				l = append(l, map[string]any{"Suffix": t.Suffix})
			case *security.StringMatch_Presence:
				l = append(l, map[string]any{"Presence": []any{}})
			}
		}
		out[key] = l
	}
	addrs := func(key string, as []*security.Address) {
		if len(as) == 0 {
			return
		}
		var l []string
		for _, a := range as {
			if ip, ok := netip.AddrFromSlice(a.GetAddress()); ok {
				l = append(l, netip.PrefixFrom(ip, int(a.GetLength())).String())
			}
		}
		out[key] = l
	}
	strs("namespaces", m.GetNamespaces())
	strs("notNamespaces", m.GetNotNamespaces())
	strs("principals", m.GetPrincipals())
	strs("notPrincipals", m.GetNotPrincipals())
	addrs("sourceIps", m.GetSourceIps())
	addrs("notSourceIps", m.GetNotSourceIps())
	addrs("destinationIps", m.GetDestinationIps())
	addrs("notDestinationIps", m.GetNotDestinationIps())
	if len(m.GetDestinationPorts()) > 0 {
		out["destinationPorts"] = m.GetDestinationPorts()
	}
	if len(m.GetNotDestinationPorts()) > 0 {
		out["notDestinationPorts"] = m.GetNotDestinationPorts()
	}
	for key, sas := range map[string][]*security.ServiceAccountMatch{"serviceAccounts": m.GetServiceAccounts(), "notServiceAccounts": m.GetNotServiceAccounts()} {
		if len(sas) == 0 {
			continue
		}
		// Objects, as ztunnel's ServiceAccountMatch: istioctl decodes
		// them into a struct and fails on anything else.
		var l []map[string]string
		for _, sa := range sas {
			l = append(l, map[string]string{"namespace": sa.GetNamespace(), "serviceAccount": sa.GetServiceAccount()})
		}
		out[key] = l
	}
	return out
}

// Cert converts a certificate.
func Cert(c *x509.Certificate) Certificate {
	text := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	return Certificate{PEM: base64.StdEncoding.EncodeToString(text), SerialNumber: c.SerialNumber.String(),
		ValidFrom: c.NotBefore.UTC().Truncate(time.Second), ExpirationTime: c.NotAfter.UTC().Truncate(time.Second)}
}

// ParsePEM decodes a Certificate's PEM field back into the certificate.
func ParsePEM(s string) (*x509.Certificate, error) {
	text, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("decode base64: %w", err)
	}
	b, _ := pem.Decode(text)
	if b == nil {
		return nil, errors.New("no PEM block")
	}
	return x509.ParseCertificate(b.Bytes)
}
