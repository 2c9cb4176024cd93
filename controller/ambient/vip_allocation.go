package ambient

import (
	"net/netip"
	"strings"

	networkingapi "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"

	"github.com/canopy-mesh/canopy/workloadapi"
)

// LabelEnableAutoallocateIP set to "false" (any case) on a ServiceEntry
// opts it out of VIP auto-allocation, which is on by default.
const LabelEnableAutoallocateIP = "networking.istio.io/enable-autoallocate-ip"

// AutoAllocates reports whether a ServiceEntry's hosts get VIPs allocated
// into its status.addresses, as istiod's ShouldV2AutoAllocateIP
// (pilot/pkg/networking/serviceentry/ip_autoallocation.go) decides: its
// resolution is not NONE (traffic goes to the original destination, which
// an allocated VIP would hide), it does not opt out by label, and it gives
// no addresses of its own.
func AutoAllocates(se *networkingv1.ServiceEntry) bool {
	if se.Spec.GetResolution() == networkingapi.ServiceEntry_NONE {
		return false
	}
	if v, ok := se.Labels[LabelEnableAutoallocateIP]; ok && strings.EqualFold(v, "false") {
		return false
	}
	return len(se.Spec.GetAddresses()) == 0
}

// AutoAllocatedHost reports whether a host of an allocating ServiceEntry
// gets VIPs: a wildcard host only when the entry resolves by DYNAMIC_DNS
// (keepHost in istiod's pilot/pkg/controllers/ipallocate).
func AutoAllocatedHost(se *networkingv1.ServiceEntry, host string) bool {
	return !strings.HasPrefix(host, "*") || se.Spec.GetResolution() == networkingapi.ServiceEntry_DYNAMIC_DNS
}

// allocatedVIPs are the VIPs a ServiceEntry's status holds for each host it
// is allocated for, in status order; entries that do not parse are
// skipped.
func allocatedVIPs(se *networkingv1.ServiceEntry, network string) map[string][]*workloadapi.NetworkAddress {
	if !AutoAllocates(se) {
		return nil
	}
	out := map[string][]*workloadapi.NetworkAddress{}
	for _, a := range se.Status.GetAddresses() {
		ip, err := netip.ParseAddr(a.GetValue())
		if err != nil || !AutoAllocatedHost(se, a.GetHost()) {
			continue
		}
		out[a.GetHost()] = append(out[a.GetHost()], &workloadapi.NetworkAddress{Network: network, Address: ip.Unmap().AsSlice()})
	}
	return out
}
