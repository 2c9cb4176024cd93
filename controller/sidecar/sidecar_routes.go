package sidecar

import (
	"strings"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// maxDirectResponseBody bounds a direct response's body, as Istio's
// sidecars are configured.
const maxDirectResponseBody = 1 << 20

// SidecarRoutes answers a sidecar's route names (sidecar wire contract
// §5): "<port>", the routes of every HTTP service on the port by host
// then anything else passed through; "<hostname>:<port>", the routes of
// one service whose port's protocol is detected. Names that are neither
// get a configuration without virtual hosts.
func (m *Mesh) SidecarRoutes(p Proxy, names []string) []Named {
	var out []Named
	for _, name := range names {
		rc := &routev3.RouteConfiguration{
			Name: name, ValidateClusters: wrapperspb.Bool(false), IgnorePortInHostMatching: true,
			MaxDirectResponseBodySizeBytes: wrapperspb.UInt32(maxDirectResponseBody),
		}
		out = append(out, Named{name, rc})
		if strings.Contains(name, ":") {
			svc, port, ok := m.sidecarRouteService(p, name)
			if !ok {
				continue
			}
			rc.VirtualHosts = []*routev3.VirtualHost{{
				Name: name, Domains: []string{"*"}, Routes: m.routes(p, routeTarget{svc: svc, port: port}),
				IncludeRequestAttemptCount: true,
			}}
			continue
		}
		port, err := parsePort(name)
		if err != nil {
			continue
		}
		// Envoy refuses a configuration in which two virtual hosts share
		// a domain, compared without case: the first service (by
		// hostname) keeps it, as when one ServiceEntry gives several
		// hosts one address, or two ServiceEntries one host in two cases.
		seen := map[string]bool{"*": true}
		for _, svc := range m.visibleServices(p) {
			if !hasPort(svc.Service, port) {
				continue
			}
			// HTTP ports, and ports of detected protocol: their own
			// listener routes by "<hostname>:<port>", but a connection to
			// another address on the port may be for them too.
			if k := kindOf(portProtocol(svc, port)); k != kindHTTP && k != kindSniffed {
				continue
			}
			var domains []string
			for _, d := range m.sidecarDomains(p, svc, port) {
				if k := strings.ToLower(d); !seen[k] {
					seen[k] = true
					domains = append(domains, d)
				}
			}
			if len(domains) == 0 {
				continue
			}
			rc.VirtualHosts = append(rc.VirtualHosts, &routev3.VirtualHost{
				Name:    svc.GetHostname() + ":" + u32(port),
				Domains: domains,
				Routes:  m.routes(p, routeTarget{svc: svc, port: port}),
				// The application sees how many tries a request took.
				IncludeRequestAttemptCount: true,
			})
		}
		rc.VirtualHosts = append(rc.VirtualHosts, &routev3.VirtualHost{
			Name: "allow_any", Domains: []string{"*"}, IncludeRequestAttemptCount: true,
			Routes: []*routev3.Route{{
				Name:  "allow_any",
				Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
				Action: &routev3.Route_Route{Route: &routev3.RouteAction{
					ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: PassthroughCluster},
					Timeout:          noTimeout,
					//lint:ignore SA1019 the field Istio's sidecars are configured by
					MaxGrpcTimeout: noTimeout,
				}},
			}},
		})
	}
	return out
}

// sidecarRouteService is the service and port of a route name
// "<hostname>:<port>" whose port's protocol is detected; false for any
// other name, which gets no virtual hosts from it.
func (m *Mesh) sidecarRouteService(p Proxy, name string) (*Service, uint32, bool) {
	host, portText, ok := strings.Cut(name, ":")
	if !ok {
		return nil, 0, false
	}
	port, err := parsePort(portText)
	svc := m.Service(p, host)
	if err != nil || svc == nil || !hasPort(svc.Service, port) || kindOf(portProtocol(svc, port)) != kindSniffed {
		return nil, 0, false
	}
	return svc, port, true
}

// sidecarRouteAbsent reports whether a route name gets only a
// configuration without virtual hosts: neither a port nor a
// "<hostname>:<port>" SidecarRoutes routes.
func (m *Mesh) sidecarRouteAbsent(p Proxy, name string) bool {
	if strings.Contains(name, ":") {
		_, _, ok := m.sidecarRouteService(p, name)
		return !ok
	}
	_, err := parsePort(name)
	return err != nil
}
