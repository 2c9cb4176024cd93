package xds_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statusv3 "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/canopy-mesh/canopy/controller/xds"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/workloadtable"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// TestNACKShowsInProxyStatus: a proxy that rejects Addresses is ERROR in
// the JSON status and in the CSDS answer istioctl proxy-status reads.
func TestNACKShowsInProxyStatus(t *testing.T) {
	m := startMesh(t, xds.Config{ID: "canopy-controller-0"})
	reject := handlerFunc(func(typeURL string, rs []*discoveryv3.Resource, removed []string) []workloadtable.Rejection {
		if typeURL != workloadapi.AddressTypeURL {
			return nil
		}
		return []workloadtable.Rejection{{Name: "x", Err: errors.New("cannot use it")}}
	})
	m.connect(t, "ztunnel-nack", "node-1", proxyOptions{handler: reject})
	m.connect(t, "ztunnel-ok", "node-1", proxyOptions{})

	var nack xds.TypeStatus
	eventually.Within(t, settle, "NACK in status", func() bool {
		for _, ps := range m.server.Status() {
			if ps.ProxyID == "ztunnel-nack."+m.ns && len(ps.Types) > 0 {
				nack = ps.Types[0]
				return nack.Status == xds.Error
			}
		}
		return false
	})
	if nack.NACK != "x: cannot use it" || nack.Type != "WDS" {
		t.Errorf("status = %+v, want a WDS NACK with the proxy's message", nack)
	}
	if got := testutil.ToFloat64(mustCounter(t, m, "canopy_xds_nacks_total")); got < 1 {
		t.Errorf("canopy_xds_nacks_total = %v, want at least 1", got)
	}

	// istioctl proxy-status: state-of-the-world ADS, type syncz, a
	// placeholder node ID and the caller's namespace in the metadata.
	ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+m.token(t))
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(dial(t, m.addr)).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := m.node(t, "test-1", "")
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: n, TypeUrl: xds.SynczTypeURL}); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var cp struct{ ID string }
	if err := json.Unmarshal([]byte(resp.GetControlPlane().GetIdentifier()), &cp); err != nil || cp.ID != "canopy-controller-0" {
		t.Errorf("control plane identifier %q: ID %q, %v; want canopy-controller-0", resp.GetControlPlane().GetIdentifier(), cp.ID, err)
	}
	got := map[string]map[string]statusv3.ConfigStatus{}
	for _, a := range resp.GetResources() {
		var cc statusv3.ClientConfig
		if err := a.UnmarshalTo(&cc); err != nil {
			t.Fatal(err)
		}
		if cc.GetNode().GetMetadata().GetFields()["CLUSTER_ID"].GetStringValue() != "Kubernetes" {
			t.Errorf("%s: no CLUSTER_ID in the node metadata", cc.GetNode().GetId())
		}
		types := map[string]statusv3.ConfigStatus{}
		for _, g := range cc.GetGenericXdsConfigs() {
			types[g.GetTypeUrl()] = g.GetConfigStatus()
		}
		got[cc.GetNode().GetId()] = types
	}
	// istioctl prints the node ID as NAME: it is the proxy ID.
	nackID, okID := "ztunnel-nack."+m.ns, "ztunnel-ok."+m.ns
	if s := got[nackID][workloadapi.AddressTypeURL]; s != statusv3.ConfigStatus_ERROR {
		t.Errorf("syncz %s WDS = %v, want ERROR (all: %v)", nackID, s, got)
	}
	if s := got[okID][workloadapi.AuthorizationTypeURL]; s != statusv3.ConfigStatus_SYNCED {
		t.Errorf("syncz %s WADS = %v, want SYNCED (all: %v)", okID, s, got)
	}
}

// TestProxyStatusNeedsSystemNamespace: proxy status lists the whole mesh,
// so a caller from another namespace is refused.
func TestProxyStatusNeedsSystemNamespace(t *testing.T) {
	m := startMesh(t, xds.Config{})
	other := env.Namespace(t, "other", nil)
	m.ns = other // the node and token now name another namespace
	ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+m.token(t))
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(dial(t, m.addr)).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: m.node(t, "test-1", ""), TypeUrl: xds.SynczTypeURL}); err != nil {
		t.Fatal(err)
	}
	_, err = st.Recv()
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "proxy status is for callers in namespace") {
		t.Errorf("syncz from another namespace: %v, want PermissionDenied", err)
	}
}
