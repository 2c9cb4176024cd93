package proxy

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/canopy-mesh/canopy/internal/testing/nettest"
	"github.com/canopy-mesh/canopy/workloadapi"
	"github.com/canopy-mesh/canopy/workloadapi/security"
)

// TestPolicyChangeClosesOpenConnections: a connection opened while allowed
// is closed once a new policy denies it, whether it came over mTLS (a DENY
// of the client's identity) or in plaintext (a STRICT PeerAuthentication,
// which reaches the node proxy as a DENY of peers without an identity).
// Such connections used to go on carrying requests for as long as the
// client kept them.
func TestPolicyChangeClosesOpenConnections(t *testing.T) {
	m := newMesh(t, "10.227.0.0/24")
	server := m.pair.AddrB.String() + ":8080"
	deny := func(name string, match *security.Match) {
		pol := &security.Authorization{Name: name, Namespace: "apps", Scope: security.Scope_NAMESPACE, Action: security.Action_DENY,
			Rules: []*security.Rule{{Clauses: []*security.Clause{{Matches: []*security.Match{match}}}}}}
		m.table.Apply(workloadapi.AuthorizationTypeURL, []*discoveryv3.Resource{resource(t, workloadapi.AuthorizationTypeURL, "apps/"+name, pol)}, nil)
		t.Cleanup(func() { m.table.Apply(workloadapi.AuthorizationTypeURL, nil, []string{"apps/" + name}) })
	}
	for _, tc := range []struct {
		name   string
		dial   func(t *testing.T) net.Conn
		policy func()
		flag   []string // labels of the destination's closed counter
	}{
		{
			name: "mTLS, then a DENY of the client's identity",
			dial: func(t *testing.T) net.Conn {
				return nettest.In(t, m.clientNS, func() (net.Conn, error) { return net.DialTimeout("tcp4", server, 3*time.Second) })
			},
			policy: func() {
				deny("no-client", &security.Match{Principals: []*security.StringMatch{{MatchType: &security.StringMatch_Exact{Exact: "cluster.local/ns/apps/sa/client"}}}})
			},
			flag: []string{"destination", "", "apps", "spiffe://cluster.local/ns/apps/sa/client", "", "apps", "spiffe://cluster.local/ns/apps/sa/server", "tcp", "DENY", "mutual_tls"},
		},
		{
			name: "plaintext, then STRICT",
			dial: func(t *testing.T) net.Conn {
				// The proxy's mark takes the connection out of the client
				// pod uncaptured: the server's proxy sees plaintext.
				c, err := m.pods[m.clientNS].Dial(context.Background(), "tcp", server)
				if err != nil {
					t.Fatal(err)
				}
				return c
			},
			policy: func() {
				deny("strict", &security.Match{NotPrincipals: []*security.StringMatch{{MatchType: &security.StringMatch_Presence{Presence: &emptypb.Empty{}}}}})
			},
			flag: []string{"destination", "", "apps", "", "", "apps", "spiffe://cluster.local/ns/apps/sa/server", "tcp", "DENY", "none"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.dial(t)
			defer c.Close()
			echo := func() error {
				if _, err := c.Write([]byte("ping")); err != nil {
					return err
				}
				_, err := io.ReadFull(c, make([]byte, 4))
				return err
			}
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			if err := echo(); err != nil {
				t.Fatalf("the connection did not carry data before the policy: %v", err)
			}
			closedDenied := m.proxy.metrics.closed.WithLabelValues(tc.flag...)
			before := testutil.ToFloat64(closedDenied)
			tc.policy()
			// Not a timing assertion: a bound on how long to wait for the
			// close before calling it never.
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			_, err := io.ReadAll(c)
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatal("the connection was still open 10s after the policy denied it")
			}
			if err := echo(); err == nil {
				t.Error("the denied connection still echoes")
			}
			deadline := time.Now().Add(5 * time.Second)
			for testutil.ToFloat64(closedDenied) == before && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if got := testutil.ToFloat64(closedDenied) - before; got != 1 {
				t.Errorf("closed connections with response_flags DENY grew by %v, want 1", got)
			}
		})
	}
}
