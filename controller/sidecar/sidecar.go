package sidecar

// GenerateSidecar answers typeURL for an Envoy sidecar (Istio's proxyv2
// image). Clusters and listeners are wildcard types for a sidecar: names
// are ignored and every cluster (listener) the proxy may see is returned.
// Endpoints and routes answer the names asked for. A sidecar reaches
// workloads of the ambient mesh over HBONE (Proxy.HBONE).
func (m *Mesh) GenerateSidecar(p Proxy, typeURL string, names []string) []Named {
	return generateAll(m.SidecarShares(p, typeURL, names))
}

// generateAll is what shares answer together.
func generateAll(shares []Share) []Named {
	var out []Named
	for _, sh := range shares {
		out = append(out, sh.Generate(nil)...)
	}
	return out
}

// IsWildcard reports whether a sidecar subscribes to typeURL as a whole
// (clusters and listeners) rather than by name (wire contract: sidecar
// §1.1).
func IsWildcard(typeURL string) bool { return typeURL == ClusterType || typeURL == ListenerType }
