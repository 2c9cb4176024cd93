package validation

import (
	"errors"
	"fmt"
	"math"
	"strings"

	networkingapi "istio.io/api/networking/v1"
	typeapi "istio.io/api/type/v1beta1"
)

// Limits of Envoy's cluster configuration that Istio's checks leave to
// Envoy.
const (
	// maxRingSize is RingHashLbConfig.minimum_ring_size's maximum.
	maxRingSize = 8 << 20
	// maxSNI is UpstreamTlsContext.sni's maximum length in bytes.
	maxSNI = 255
	// maxMaglevTableSize is Istio's bound on a Maglev table.
	maxMaglevTableSize = 5000011
)

// DestinationRule checks a DestinationRule of namespace as Istio's webhook
// does, and as Envoy and grpc-go take its clusters and hash policies.
func DestinationRule(namespace string, dr *networkingapi.DestinationRule) error {
	var out errs
	out.add(Host(dr.GetHost()), trafficPolicy(namespace, dr.GetTrafficPolicy()))
	seen := map[string]bool{}
	for _, ss := range dr.GetSubsets() {
		if ss == nil {
			out.addf("subset may not be null")
			continue
		}
		if seen[ss.GetName()] {
			out.addf("duplicate subset names: %s", ss.GetName())
		}
		seen[ss.GetName()] = true
		out.add(subsetName(ss.GetName()), labels(ss.GetLabels()), trafficPolicy(namespace, ss.GetTrafficPolicy()))
	}
	out.add(exportTo(namespace, dr.GetExportTo(), false, dr.GetWorkloadSelector() != nil))
	out.add(workloadSelector(dr.GetWorkloadSelector()))
	return out.err()
}

func workloadSelector(s *typeapi.WorkloadSelector) error {
	if s == nil {
		return nil
	}
	return selectorLabels(s.GetMatchLabels())
}

func trafficPolicy(namespace string, p *networkingapi.TrafficPolicy) error {
	if p == nil {
		return nil
	}
	if p.GetOutlierDetection() == nil && p.GetConnectionPool() == nil && p.GetLoadBalancer() == nil && p.GetTls() == nil &&
		p.GetPortLevelSettings() == nil && p.GetTunnel() == nil && p.GetProxyProtocol() == nil && p.GetRetryBudget() == nil {
		return errors.New("traffic policy must have at least one field")
	}
	if p.GetTunnel() != nil && p.GetProxyProtocol() != nil {
		return errors.New("tunnel and proxyProtocol must not be set together")
	}
	var out errs
	out.add(outlierDetection(p.GetOutlierDetection()), connectionPool(p.GetConnectionPool()),
		loadBalancer(p.GetLoadBalancer()), clientTLS(namespace, p.GetTls()))
	for _, pl := range p.GetPortLevelSettings() {
		switch {
		case pl == nil:
			out.addf("traffic policy may not be null")
			continue
		case pl.GetPort() == nil:
			out.addf("portTrafficPolicy must have valid port")
		}
		if pl.GetOutlierDetection() == nil && pl.GetConnectionPool() == nil && pl.GetLoadBalancer() == nil && pl.GetTls() == nil {
			out.addf("port traffic policy must have at least one field")
			continue
		}
		out.add(outlierDetection(pl.GetOutlierDetection()), connectionPool(pl.GetConnectionPool()),
			loadBalancer(pl.GetLoadBalancer()), clientTLS(namespace, pl.GetTls()))
	}
	if t := p.GetTunnel(); t != nil {
		if t.GetProtocol() != "" && t.GetProtocol() != "CONNECT" && t.GetProtocol() != "POST" {
			out.addf(`tunnel protocol must be "CONNECT" or "POST"`)
		}
		if FQDN(t.GetTargetHost()) != nil && !isIP(t.GetTargetHost()) {
			out.addf("tunnel target host must be valid FQDN or IP address: %s", t.GetTargetHost())
		}
		if err := Port(int64(t.GetTargetPort())); err != nil {
			out.addf("tunnel target port is invalid: %w", err)
		}
	}
	if pp := p.GetProxyProtocol(); pp != nil && pp.GetVersion() != 0 && pp.GetVersion() != 1 {
		out.addf("proxy protocol version is invalid: %d", pp.GetVersion())
	}
	return out.err()
}

func outlierDetection(o *networkingapi.OutlierDetection) error {
	if o == nil {
		return nil
	}
	var out errs
	if o.GetBaseEjectionTime() != nil {
		out.add(Duration(o.GetBaseEjectionTime()))
	}
	if !o.GetSplitExternalLocalOriginErrors() && o.GetConsecutiveLocalOriginFailures().GetValue() > 0 {
		out.addf("outlier detection consecutive local origin failures is specified, but split external local origin errors is set to false")
	}
	if o.GetInterval() != nil {
		out.add(Duration(o.GetInterval()))
	}
	out.add(Percent(o.GetMaxEjectionPercent()), Percent(o.GetMinHealthPercent()))
	return out.err()
}

func connectionPool(c *networkingapi.ConnectionPoolSettings) error {
	if c == nil {
		return nil
	}
	if c.GetHttp() == nil && c.GetTcp() == nil {
		return errors.New("connection pool must have at least one field")
	}
	var out errs
	if h := c.GetHttp(); h != nil {
		if h.GetHttp1MaxPendingRequests() < 0 {
			out.addf("http1 max pending requests must be non-negative")
		}
		if h.GetHttp2MaxRequests() < 0 {
			out.addf("http2 max requests must be non-negative")
		}
		if h.GetMaxRequestsPerConnection() < 0 {
			out.addf("max requests per connection must be non-negative")
		}
		if h.GetMaxRetries() < 0 {
			out.addf("max retries must be non-negative")
		}
		if h.GetIdleTimeout() != nil {
			out.add(Duration(h.GetIdleTimeout()))
		}
		if h.GetH2UpgradePolicy() == networkingapi.ConnectionPoolSettings_HTTPSettings_UPGRADE && h.GetUseClientProtocol() {
			out.addf("use client protocol must not be true when H2UpgradePolicy is UPGRADE")
		}
		if h.GetMaxConcurrentStreams() < 0 {
			out.addf("max concurrent streams must be non-negative")
		}
		if ka := h.GetHttp2KeepAlive(); ka != nil {
			if ka.GetInterval() == nil {
				out.addf("http2 keepalive interval is required")
			} else {
				out.add(Duration(ka.GetInterval()))
			}
			if ka.GetTimeout() == nil {
				out.addf("http2 keepalive timeout is required")
			} else {
				out.add(Duration(ka.GetTimeout()))
			}
		}
	}
	if t := c.GetTcp(); t != nil {
		if t.GetMaxConnections() < 0 {
			out.addf("max connections must be non-negative")
		}
		if t.GetConnectTimeout() != nil {
			out.add(Duration(t.GetConnectTimeout()))
		}
		if t.GetMaxConnectionDuration() != nil {
			out.add(Duration(t.GetMaxConnectionDuration()))
		}
		// 0s turns the idle timeout off.
		if it := t.GetIdleTimeout(); it != nil && it.AsDuration().Milliseconds() != 0 {
			out.add(Duration(it))
		}
		if ka := t.GetTcpKeepalive(); ka != nil {
			if ka.GetTime() != nil {
				out.add(Duration(ka.GetTime()))
			}
			if ka.GetInterval() != nil {
				out.add(Duration(ka.GetInterval()))
			}
		}
	}
	return out.err()
}

func loadBalancer(lb *networkingapi.LoadBalancerSettings) error {
	if lb == nil {
		return nil
	}
	var out errs
	if ch := lb.GetConsistentHash(); ch != nil {
		switch k := ch.GetHashKey().(type) {
		case *networkingapi.LoadBalancerSettings_ConsistentHashLB_HttpCookie:
			c := k.HttpCookie
			if c.GetName() == "" {
				out.addf("name required for HttpCookie")
			}
			// A cookie's TTL may be 0 (a session cookie), not negative.
			if ttl := c.GetTtl(); ttl != nil && (ttl.CheckValid() != nil || ttl.AsDuration() < 0) {
				out.addf("HttpCookie ttl %v is not a valid non-negative duration", ttl.AsDuration())
			}
			names := map[string]bool{}
			for _, a := range c.GetAttributes() {
				switch {
				case a.GetName() == "":
					out.addf("cookie attribute name cannot be empty")
				case names[a.GetName()]:
					out.addf("duplicate cookie attribute name: %s", a.GetName())
				}
				names[a.GetName()] = true
			}
		case *networkingapi.LoadBalancerSettings_ConsistentHashLB_HttpHeaderName:
			// Routes hash on it: Envoy's hash policy takes a header name.
			if !isToken(k.HttpHeaderName) {
				out.addf("httpHeaderName %q is not a valid header name", k.HttpHeaderName)
			}
		case *networkingapi.LoadBalancerSettings_ConsistentHashLB_HttpQueryParameterName:
			if k.HttpQueryParameterName == "" {
				out.addf("httpQueryParameterName cannot be empty")
			}
		}
		//lint:ignore SA1019 Istio still checks the deprecated field
		ringSize := ch.GetMinimumRingSize()
		if ringSize != 0 && ch.GetHashAlgorithm() != nil {
			out.addf("only one of MinimumRingSize or Maglev/Ringhash can be specified")
		}
		if rh := ch.GetRingHash(); rh != nil {
			ringSize = rh.GetMinimumRingSize()
		}
		if ringSize > maxRingSize {
			out.addf("minimumRingSize %d is larger than %d", ringSize, maxRingSize)
		}
		if ml := ch.GetMaglev(); ml != nil {
			if ml.GetTableSize() == 0 {
				out.addf("tableSize must be set for maglev")
			}
			if ml.GetTableSize() >= maxMaglevTableSize {
				out.addf("tableSize must be less than %d for maglev", maxMaglevTableSize)
			}
			if !isPrime(ml.GetTableSize()) {
				out.addf("tableSize must be a prime number for maglev")
			}
		}
	}
	if lb.GetLocalityLbSetting() != nil && lb.GetZoneAwareLbSetting() != nil {
		out.addf("only one of localityLbSetting and zoneAwareLbSetting can be set")
	}
	if w := lb.GetWarmup(); w != nil {
		if w.GetDuration() == nil {
			out.addf("duration is required")
		} else {
			out.add(Duration(w.GetDuration()))
		}
		if w.GetMinimumPercent().GetValue() > 100 {
			out.addf("minimumPercent value should be less than or equal to 100")
		}
		if w.GetAggression() != nil && w.GetAggression().GetValue() <= 0 {
			out.addf("aggression should be greater than 0")
		}
	}
	return out.err()
}

// isPrime is Envoy's test of a Maglev table size.
func isPrime(x uint64) bool {
	switch {
	case x != 0 && x < 4:
		return true
	case x&1 == 0:
		return false
	}
	limit := uint64(math.Sqrt(float64(x)))
	for f := uint64(3); f <= limit; f += 2 {
		if x%f == 0 {
			return false
		}
	}
	return true
}

// clientTLS checks the TLS a rule originates.
func clientTLS(namespace string, t *networkingapi.ClientTLSSettings) error {
	if t == nil {
		return nil
	}
	var out errs
	if cn := t.GetCredentialName(); strings.HasPrefix(cn, "configmap://") {
		ns, _, ok := strings.Cut(strings.TrimPrefix(cn, "configmap://"), "/")
		switch {
		case !ok:
			// configmap://<name> is in the rule's own namespace.
		case ns != namespace || namespace == "":
			out.addf("invalid configmap:// credentialName: namespace must match the configuration namespace %q", namespace)
		}
	}
	if t.GetInsecureSkipVerify().GetValue() {
		switch t.GetMode() {
		case networkingapi.ClientTLSSettings_SIMPLE:
			if t.GetCaCertificates() != "" || t.GetCredentialName() != "" || t.GetSubjectAltNames() != nil {
				out.addf("cannot specify CaCertificates or CredentialName or SubjectAltNames when InsecureSkipVerify is set true")
			}
		case networkingapi.ClientTLSSettings_MUTUAL:
			if t.GetCaCertificates() != "" || t.GetSubjectAltNames() != nil {
				out.addf("cannot specify CaCertificates or SubjectAltNames when InsecureSkipVerify is set true")
			}
		}
	}
	if len(t.GetSni()) > maxSNI {
		out.addf("sni %q is longer than %d bytes", t.GetSni(), maxSNI)
	}
	simpleOrMutual := t.GetMode() == networkingapi.ClientTLSSettings_SIMPLE || t.GetMode() == networkingapi.ClientTLSSettings_MUTUAL
	if simpleOrMutual && t.GetCredentialName() != "" {
		if t.GetClientCertificate() != "" || t.GetCaCertificates() != "" || t.GetPrivateKey() != "" || t.GetCaCrl() != "" {
			out.addf("cannot specify client certificates or CA certificate or CA CRL If credentialName is set")
		}
		return out.err()
	}
	if t.GetMode() == networkingapi.ClientTLSSettings_MUTUAL {
		if t.GetClientCertificate() == "" {
			out.add(fmt.Errorf("client certificate required for mutual tls"))
		}
		if t.GetPrivateKey() == "" {
			out.addf("private key required for mutual tls")
		}
	}
	return out.err()
}
