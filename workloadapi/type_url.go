package workloadapi

// Type URLs of the resources served over Delta ADS. They are the xDS type_url
// of requests and responses and the type URL inside each resource's Any.
const (
	// AddressTypeURL is the workload and service address table, the type
	// node proxies subscribe to.
	AddressTypeURL = "type.googleapis.com/istio.workload.Address"
	// WorkloadTypeURL is a bare Workload. Node proxies do not use it; it is
	// named here so that it is recognised (and refused) rather than guessed.
	WorkloadTypeURL = "type.googleapis.com/istio.workload.Workload"
	// AuthorizationTypeURL is the L4 authorization policy table.
	AuthorizationTypeURL = "type.googleapis.com/istio.security.Authorization"
)
