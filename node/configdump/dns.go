package configdump

// DNSView is one pod's DNS as the node proxy serves it
// (/debug/dns?pod=<namespace>/<name> on the admin port): the mesh names
// it answers for the pod, and where the rest goes.
type DNSView struct {
	Pod           string `json:"pod"`
	ClusterDomain string `json:"clusterDomain"`
	// Resolvers are the nameservers the pod's other queries go to, and
	// ResolversFrom where they were read ("pod": its own resolv.conf,
	// else the stand-in file's path); both empty until the pod's first
	// query that is not the mesh's.
	Resolvers     []string `json:"resolvers"`
	ResolversFrom string   `json:"resolversFrom,omitempty"`
	// Names are the mesh names the pod resolves, sorted.
	Names []DNSName `json:"names"`
}

// DNSName is a mesh name and what the pod is answered for it.
type DNSName struct {
	Name string `json:"name"`
	// Service is the answering service, "<namespace>/<hostname>".
	Service string `json:"service"`
	// Addresses are its A and AAAA records (empty: the name exists,
	// without addresses for this pod).
	Addresses []string `json:"addresses"`
}
