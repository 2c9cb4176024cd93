package ambient

// Config holds the mesh-wide settings the builders need.
type Config struct {
	// ClusterID names this cluster in workload UIDs and Workload.cluster_id;
	// default "Kubernetes".
	ClusterID string
	// Network is the network of this cluster's workloads and VIPs (the
	// topology.istio.io/network label of the system namespace); empty on
	// the default network.
	Network string
	// TrustDomain of workload identities; default "cluster.local". It is
	// left out of Workload.trust_domain when it is the default.
	TrustDomain string
	// DomainSuffix is the cluster DNS domain; default "cluster.local".
	DomainSuffix string
	// RootNamespace holds mesh-wide policies; default "istio-system".
	RootNamespace string
	// SystemNamespace is where the control plane runs; its
	// topology.istio.io/network label, when set, is the network (the index
	// applies it). Default "istio-system".
	SystemNamespace string
	// DefaultExportTo is the exportTo of Services and ServiceEntries that
	// set none (Istio's MeshConfig.defaultServiceExportTo); default "*".
	DefaultExportTo []string
}

// WithDefaults returns c with its empty fields defaulted.
func (c Config) WithDefaults() Config {
	if c.ClusterID == "" {
		c.ClusterID = "Kubernetes"
	}
	if c.TrustDomain == "" {
		c.TrustDomain = "cluster.local"
	}
	if c.DomainSuffix == "" {
		c.DomainSuffix = "cluster.local"
	}
	if c.RootNamespace == "" {
		c.RootNamespace = "istio-system"
	}
	if c.SystemNamespace == "" {
		c.SystemNamespace = "istio-system"
	}
	if len(c.DefaultExportTo) == 0 {
		c.DefaultExportTo = []string{exportAll}
	}
	return c
}
