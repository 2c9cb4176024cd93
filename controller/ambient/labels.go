package ambient

// Labels and annotations the builders read (wire contract §7.4).
const (
	// AnnotationRedirection is set by the CNI agent: "enabled" once a pod's
	// traffic goes through the node proxy.
	AnnotationRedirection = "ambient.istio.io/redirection"
	// LabelTunnel lists the tunnel protocols a pod terminates itself.
	LabelTunnel = "networking.istio.io/tunnel"

	LabelUseWaypoint          = "istio.io/use-waypoint"
	LabelUseWaypointNamespace = "istio.io/use-waypoint-namespace"
	LabelWaypointFor          = "istio.io/waypoint-for"
	LabelIngressUseWaypoint   = "istio.io/ingress-use-waypoint"
	// AnnotationTrafficDistribution, on a Service, a ServiceEntry or their
	// namespace, stands in for a Service's spec.trafficDistribution.
	AnnotationTrafficDistribution = "networking.istio.io/traffic-distribution"
	// LabelManagedGateway marks the resources of a managed gateway
	// (waypoints), which never get a waypoint themselves.
	LabelManagedGateway = "gateway.istio.io/managed"
	ManagedByMesh       = "istio.io-mesh-controller"

	LabelCanonicalName     = "service.istio.io/canonical-name"
	LabelCanonicalRevision = "service.istio.io/canonical-revision"
	LabelAppName           = "app.kubernetes.io/name"
	LabelAppVersion        = "app.kubernetes.io/version"
	LabelApp               = "app"
	LabelVersion           = "version"

	LabelSubzone = "topology.istio.io/subzone"
	LabelNetwork = "topology.istio.io/network"

	// WaypointClass is the GatewayClass of waypoints.
	WaypointClass = "istio-waypoint"
	// NoWaypoint opts an object out of its namespace's waypoint.
	NoWaypoint = "none"
	// HBONEPort is where waypoints and node proxies accept HBONE.
	HBONEPort = 15008
)
