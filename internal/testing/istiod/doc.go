// Package istiod runs Istio's own control plane, pilot-discovery (istiod),
// as a reference for Canopy's differential tests, and finds istioctl.
//
// Both binaries are built from istio.io/istio, pinned in tools/istio, by
// hack/tools.sh istio into Canopy's cache ($CANOPY_ISTIO_BIN_DIR when set),
// once: a cold build takes several minutes. Canopy itself never links Istio;
// only tests run these binaries.
//
// Start runs istiod against an API server with everything on loopback:
// plaintext xDS (no authentication, so a test can subscribe as a ztunnel
// without a token), its HTTP port (readiness, debug) and monitoring port.
// Its CA, webhooks, injection and leader election are off, so it writes
// nothing to the cluster that another control plane (Canopy) also writes,
// such as the root ConfigMaps.
//
// Only tests import this package. An Istiod is safe for concurrent use.
package istiod
