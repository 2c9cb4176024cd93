package validation

import (
	"errors"
	"fmt"
	"strings"

	networkingapi "istio.io/api/networking/v1"
)

// unixAddressPrefix marks an endpoint address that is a Unix socket.
const unixAddressPrefix = "unix://"

// ServiceEntry checks a ServiceEntry of namespace as Istio's webhook does.
func ServiceEntry(namespace string, se *networkingapi.ServiceEntry) error {
	var out errs
	if err := selectorLabels(se.GetWorkloadSelector().GetLabels()); err != nil {
		return err
	}
	if se.GetWorkloadSelector() != nil && se.GetEndpoints() != nil {
		out.addf("only one of WorkloadSelector or Endpoints is allowed in Service Entry")
	}
	if len(se.GetHosts()) == 0 {
		out.addf("service entry must have at least one host")
	}
	for _, h := range se.GetHosts() {
		if h == "*" {
			out.addf("invalid host %s", h)
		} else {
			out.add(Host(h))
		}
	}
	cidr := false
	for _, a := range se.GetAddresses() {
		cidr = cidr || strings.Contains(a, "/")
		out.add(ipOrSubnet(a))
	}
	res := se.GetResolution()
	if cidr && res != networkingapi.ServiceEntry_NONE && res != networkingapi.ServiceEntry_STATIC {
		out.addf("CIDR addresses are allowed only for NONE/STATIC resolution types")
	}
	names, numbers := map[string]bool{}, map[uint32]bool{}
	for _, p := range se.GetPorts() {
		if p == nil {
			out.addf("service entry port may not be null")
			continue
		}
		if names[p.GetName()] {
			out.addf("service entry port name %q already defined", p.GetName())
		}
		if numbers[p.GetNumber()] {
			out.addf("service entry port %d already defined", p.GetNumber())
		}
		names[p.GetName()], numbers[p.GetNumber()] = true, true
		if p.GetTargetPort() != 0 {
			out.add(Port(int64(p.GetTargetPort())))
		}
		out.add(portName(p.GetName()), protocol(p.GetProtocol()), Port(int64(p.GetNumber())))
	}
	switch res {
	case networkingapi.ServiceEntry_NONE:
		if len(se.GetEndpoints()) != 0 {
			out.addf("no endpoints should be provided for resolution type none")
		}
	case networkingapi.ServiceEntry_STATIC:
		for _, ep := range se.GetEndpoints() {
			if ep == nil {
				out.addf("endpoint cannot be nil")
				continue
			}
			out.add(staticEndpoint(ep, names))
		}
	case networkingapi.ServiceEntry_DNS, networkingapi.ServiceEntry_DNS_ROUND_ROBIN:
		if len(se.GetEndpoints()) == 0 {
			for _, h := range se.GetHosts() {
				if err := FQDN(h); err != nil {
					out.addf("hosts must be FQDN or contain only prefix wildcards if no endpoints are provided for resolution mode %s, %w", res, err)
					break
				}
			}
		}
		if res == networkingapi.ServiceEntry_DNS_ROUND_ROBIN && len(se.GetEndpoints()) > 1 {
			out.addf("there must only be 0 or 1 endpoint for resolution mode %s", res)
		}
		for _, ep := range se.GetEndpoints() {
			if ep == nil {
				out.addf("endpoint cannot be nil")
				continue
			}
			if !isIP(ep.GetAddress()) && FQDN(ep.GetAddress()) != nil {
				out.addf("endpoint address %q is not a valid FQDN or an IP address", ep.GetAddress())
			}
			out.add(labels(ep.GetLabels()))
			for _, name := range sortedKeys(ep.GetPorts()) {
				if !names[name] {
					out.addf("endpoint port %v is not defined by the service entry", ep.GetPorts()[name])
				}
				out.add(portName(name), Port(int64(ep.GetPorts()[name])))
			}
		}
	case networkingapi.ServiceEntry_DYNAMIC_DNS:
		for _, h := range se.GetHosts() {
			if !strings.HasPrefix(h, "*") {
				out.addf("host must be wildcarded for resolution mode %s", res)
			}
		}
		if len(se.GetAddresses()) != 0 {
			out.addf("addresses cannot be set for resolution type %s", res)
		}
		if len(se.GetEndpoints()) != 0 {
			out.addf("endpoints cannot be set for resolution type %s", res)
		}
	default:
		out.addf("unsupported resolution type %s", res)
	}
	// Several hosts on a TCP port cannot be told apart, but with resolution
	// NONE, which ignores the hosts.
	if res != networkingapi.ServiceEntry_NONE && len(se.GetHosts()) > 1 {
		for _, p := range se.GetPorts() {
			if p != nil && !httpOrTLS(p.GetProtocol()) {
				out.addf("multiple hosts provided with non-HTTP, non-TLS ports")
				break
			}
		}
	}
	out.add(exportTo(namespace, se.GetExportTo(), true, false))
	return out.err()
}

func httpOrTLS(p string) bool {
	switch strings.ToLower(p) {
	case "http", "http2", "grpc", "grpc-web", "http_proxy", "https", "tls":
		return true
	}
	return false
}

// staticEndpoint checks an endpoint of a STATIC ServiceEntry: an IP
// address or a Unix socket, its ports among the entry's.
func staticEndpoint(ep *networkingapi.WorkloadEntry, names map[string]bool) error {
	var out errs
	addr := ep.GetAddress()
	unix := strings.HasPrefix(addr, unixAddressPrefix)
	switch {
	case addr == "" && ep.GetNetwork() == "":
		return errors.New("address is required")
	case unix:
		if len(strings.TrimPrefix(addr, unixAddressPrefix)) == 0 {
			out.addf("unix address must not be empty")
		}
		if len(ep.GetPorts()) != 0 {
			out.addf("unix endpoint %s must not include ports", addr)
		}
	case addr != "" && !isIP(addr):
		out.addf("endpoint address %q is not a valid IP address", addr)
	}
	for _, name := range sortedKeys(ep.GetPorts()) {
		if !names[name] {
			out.addf("endpoint port %v is not defined by the service entry", ep.GetPorts()[name])
		}
		out.add(portName(name), Port(int64(ep.GetPorts()[name])))
	}
	out.add(labels(ep.GetLabels()))
	if unix && len(names) != 1 {
		out.add(fmt.Errorf("exactly 1 service port required for unix endpoints"))
	}
	return out.err()
}
