// Package inject is Canopy's sidecar injector: it decides whether a pod
// gets a sidecar (Required), renders the injected pod (Mutate) and the
// JSON Patch the API server applies (Inject), and serves the mutating
// admission webhook (Handler). The pods it produces are those Istio's
// injector produces for the same input, so Istio's proxyv2 image
// (pilot-agent and Envoy) runs in them unchanged against canopy-controller
// (docs/sidecar-injection.md).
//
// The core is pure: Kubernetes objects and a Config in, objects and bytes
// out, no I/O, no logging, no package-level state; inputs are never
// modified. Only Handler does I/O (HTTP) and logs, through the *slog.Logger
// it is given. Every function and Handler are safe for concurrent use.
// Anything in controller/ or cmd/ may import this package; it imports only
// Kubernetes and Istio API modules, never istio.io/istio.
//
// # Templates
//
// The pod annotation inject.istio.io/templates picks one template:
// "sidecar" (the default: istio-proxy with Envoy, and istio-init, or
// istio-validation when a CNI plugin redirects traffic) or "grpc-agent"
// (proxyless gRPC: pilot-agent without Envoy). Templates are Go code that
// builds corev1 values, not text templates; there are no user templates.
//
// # Annotations honoured
//
// sidecar.istio.io/inject (label or annotation), inject.istio.io/templates,
// sidecar.istio.io/proxyImage, proxyImageType, proxyCPU, proxyMemory,
// proxyCPULimit, proxyMemoryLimit, logLevel, componentLogLevel,
// agentLogLevel, nativeSidecar, rewriteAppHTTPProbers,
// sidecar.istio.io/interceptionMode (REDIRECT only),
// status.sidecar.istio.io/port,
// readiness.status.sidecar.istio.io/{initialDelaySeconds,periodSeconds,failureThreshold},
// proxy.istio.io/config (merged into PROXY_CONFIG; its proxyMetadata
// becomes environment variables and its holdApplicationUntilProxyStarts
// is honoured), and traffic.sidecar.istio.io/{includeOutboundIPRanges,
// excludeOutboundIPRanges, includeInboundPorts, excludeInboundPorts,
// includeOutboundPorts, excludeOutboundPorts} (passed to istio-init, and
// with CNI written on the pod for the plugin), and the interface
// annotations traffic.sidecar.istio.io/excludeInterfaces,
// traffic.sidecar.istio.io/kubevirtInterfaces and
// istio.io/reroute-virtual-interfaces (istio-init's -c and -k; with CNI the
// plugin reads them from the pod). Annotations that only
// pilot-agent reads, from the pod's annotations file (the
// sidecar.istio.io/stats* family, extraStatTags, discoveryAddress), reach
// it unchanged through the istio-podinfo volume.
//
// # Annotations refused
//
// A pod carrying one of these is refused with a *RefusedError naming the
// annotation, and the webhook denies its creation, rather than run without
// what the annotation asks for:
//
//	annotation                                    refused because
//	sidecar.istio.io/bootstrapOverride            custom Envoy bootstrap ConfigMaps are not mounted
//	sidecar.istio.io/userVolume                   extra volumes are not added
//	sidecar.istio.io/userVolumeMount              extra volume mounts are not added
//	proxy.istio.io/overrides                      user overrides of injected containers are not merged
//	sidecar.istio.io/capNetBindService            istio-proxy never runs as root
//	sidecar.istio.io/enableCoreDump               no core-dump init container
//	prometheus.istio.io/merge-metrics (not false) metrics are not merged
//	sidecar.istio.io/interceptionMode (not REDIRECT), and interceptionMode
//	other than REDIRECT in proxy.istio.io/config  TPROXY and NONE are not supported
//
// A pod that already defines an istio-proxy container (Istio merges such
// user settings into the proxy) is refused too.
package inject
