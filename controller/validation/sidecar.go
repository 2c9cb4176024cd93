package validation

import (
	"errors"
	"net"
	"strconv"
	"strings"

	networkingapi "istio.io/api/networking/v1"
)

// Sidecar checks a Sidecar of namespace as Istio's webhook does, for its
// workload selector, ingress and egress listeners and outbound traffic
// policy (ingress TLS is not checked: Canopy does not translate it).
func Sidecar(namespace string, sc *networkingapi.Sidecar) error {
	if err := selectorLabels(sc.GetWorkloadSelector().GetLabels()); err != nil {
		return err
	}
	if len(sc.GetEgress()) == 0 && len(sc.GetIngress()) == 0 && sc.GetOutboundTrafficPolicy() == nil && sc.GetInboundConnectionPool() == nil {
		return errors.New("sidecar: empty configuration provided")
	}
	var out errs
	ports := map[uint32]bool{}
	for _, in := range sc.GetIngress() {
		switch {
		case in == nil:
			out.addf("sidecar: ingress may not be null")
			continue
		case in.GetPort() == nil:
			out.addf("sidecar: port is required for ingress listeners")
			continue
		}
		//lint:ignore SA1019 Istio still refuses the deprecated field
		if in.GetPort().GetTargetPort() > 0 {
			out.addf("targetPort has no impact on Sidecars")
		}
		out.add(sidecarPort(in.GetPort()))
		if in.GetBind() != "" && !isIP(in.GetBind()) {
			out.addf("%v is not a valid IP", in.GetBind())
		}
		if ports[in.GetPort().GetNumber()] {
			out.addf("sidecar: ports on IP bound listeners must be unique")
		}
		ports[in.GetPort().GetNumber()] = true
		if de := in.GetDefaultEndpoint(); de != "" {
			out.add(defaultEndpoint(de))
		}
		out.add(connectionPool(in.GetConnectionPool()))
	}
	out.add(connectionPool(sc.GetInboundConnectionPool()))

	ports = map[uint32]bool{}
	sockets := map[string]bool{}
	catchAll := false
	for i, eg := range sc.GetEgress() {
		if eg == nil {
			out.addf("egress listener may not be null")
			continue
		}
		if eg.GetPort() == nil {
			switch {
			case catchAll:
				out.addf("sidecar: egress can have only one listener with empty port")
				continue
			case i == len(sc.GetEgress())-1:
				catchAll = true
			default:
				out.addf("sidecar: the egress listener with empty port should be the last listener in the list")
			}
		} else {
			//lint:ignore SA1019 Istio still refuses the deprecated field
			if eg.GetPort().GetTargetPort() > 0 {
				out.addf("targetPort has no impact on Sidecars")
			}
			out.add(egressPort(eg))
			if n := eg.GetPort().GetNumber(); n == 0 {
				if sockets[eg.GetBind()] {
					out.addf("sidecar: unix domain socket values for listeners must be unique")
				}
				sockets[eg.GetBind()] = true
			} else {
				if ports[n] {
					out.addf("sidecar: ports on IP bound listeners must be unique")
				}
				ports[n] = true
			}
		}
		if len(eg.GetHosts()) == 0 {
			out.addf("sidecar: egress listener must contain at least one host")
		}
		for _, h := range eg.GetHosts() {
			out.add(egressHost(h))
		}
	}
	if tp := sc.GetOutboundTrafficPolicy(); tp != nil && tp.GetEgressProxy() != nil {
		switch {
		case tp.GetMode() != networkingapi.OutboundTrafficPolicy_ALLOW_ANY:
			out.addf("sidecar: egress_proxy must be set only with ALLOW_ANY outbound_traffic_policy mode")
		case tp.GetEgressProxy().GetPort() == nil:
			out.add(FQDN(tp.GetEgressProxy().GetHost()))
			out.addf("sidecar: egress_proxy port must be non-nil")
		default:
			out.add(FQDN(tp.GetEgressProxy().GetHost()), destination(tp.GetEgressProxy()))
		}
	}
	return out.err()
}

func sidecarPort(p *networkingapi.SidecarPort) error {
	var out errs
	if p.GetName() != "" {
		out.add(portName(p.GetName()))
	}
	out.add(protocol(p.GetProtocol()), Port(int64(p.GetNumber())))
	return out.err()
}

// egressPort checks an egress listener's port: a port with an optional IP
// to bind, or 0 with a Unix socket.
func egressPort(eg *networkingapi.IstioEgressListener) error {
	p, bind := eg.GetPort(), eg.GetBind()
	if p.GetNumber() != 0 {
		var out errs
		out.add(sidecarPort(p))
		if bind != "" && !isIP(bind) {
			out.addf("%v is not a valid IP", bind)
		}
		return out.err()
	}
	var out errs
	if p.GetName() != "" {
		out.add(portName(p.GetName()))
	}
	out.add(protocol(p.GetProtocol()))
	if path, ok := strings.CutPrefix(bind, unixAddressPrefix); !ok {
		out.addf("sidecar: ports with 0 value must have a unix domain socket bind address")
	} else if path == "" {
		out.addf("unix address must not be empty")
	}
	if m := eg.GetCaptureMode(); m != networkingapi.CaptureMode_DEFAULT && m != networkingapi.CaptureMode_NONE {
		out.addf("sidecar: captureMode must be DEFAULT/NONE for unix domain socket listeners")
	}
	return out.err()
}

func defaultEndpoint(de string) error {
	if path, ok := strings.CutPrefix(de, unixAddressPrefix); ok {
		if path == "" {
			return errors.New("unix address must not be empty")
		}
		return nil
	}
	host, port, err := net.SplitHostPort(de)
	if err != nil {
		return err
	}
	var out errs
	switch host {
	case "", "127.0.0.1", "0.0.0.0", "::1", "::":
	default:
		out.addf("sidecar: defaultEndpoint must be of form 127.0.0.1:<port>,0.0.0.0:<port>,[::1]:port,[::]:port,unix://filepath or unset")
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		out.addf("sidecar: defaultEndpoint port (%s) is not a number: %w", port, err)
	} else {
		out.add(Port(int64(n)))
	}
	return out.err()
}

// egressHost checks an egress host, "<namespace>/<dnsName>": the
// namespace "*", ".", or a DNS label, optionally after "~"; the name "*" or
// a host with a dot.
func egressHost(h string) error {
	ns, name, ok := strings.Cut(h, "/")
	if !ok {
		return errors.New("host must be of form namespace/dnsName")
	}
	var out errs
	if ns == "" || name == "" {
		out.addf("config namespace and dnsName in host entry cannot be empty")
	}
	if n := strings.TrimPrefix(ns, "~"); n != "" && n != "*" && n != "." && !dns1123Label(n) {
		out.addf("invalid namespace value %q in sidecar", ns)
	}
	if name != "*" && !strings.Contains(name, ".") {
		out.addf("short names (non FQDN) are not allowed")
	}
	out.add(Host(name))
	if strings.Contains(name, "*") && name != "*" && !strings.HasPrefix(name, "*.") {
		out.addf("partial wildcard %q not allowed", name)
	}
	return out.err()
}
