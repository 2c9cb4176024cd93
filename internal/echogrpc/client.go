package echogrpc

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	xdscreds "google.golang.org/grpc/credentials/xds"
	"google.golang.org/grpc/status"

	"github.com/canopy-mesh/canopy/internal/echogrpc/echopb"
)

// Bounds of what one HTTP request may ask of the client.
const (
	maxCalls   = 1000
	maxTargets = 16
	callTimout = 5 * time.Second
)

// Client calls Echo servers, one cached connection per target: gRPC
// balances calls, not connections, so one connection carries a whole
// weighted split.
type Client struct {
	creds credentials.TransportCredentials
	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

// NewClient returns a client; with xds it resolves xds:/// targets and
// takes its security from the mesh's clusters (mutual TLS where a
// DestinationRule asks for ISTIO_MUTUAL, plaintext elsewhere).
func NewClient(xds bool) (*Client, error) {
	c := &Client{creds: insecure.NewCredentials(), conns: map[string]*grpc.ClientConn{}}
	if xds {
		creds, err := xdscreds.NewClientCredentials(xdscreds.ClientOptions{FallbackCreds: insecure.NewCredentials()})
		if err != nil {
			return nil, fmt.Errorf("xds client credentials: %w", err)
		}
		c.creds = creds
	}
	return c, nil
}

// Close closes every cached connection.
func (c *Client) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, cc := range c.conns {
		_ = cc.Close()
		delete(c.conns, k)
	}
}

func (c *Client) conn(target string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc, ok := c.conns[target]; ok {
		return cc, nil
	}
	if len(c.conns) >= maxTargets {
		return nil, fmt.Errorf("already calling %d targets; not one more", maxTargets)
	}
	cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(c.creds))
	if err != nil {
		return nil, fmt.Errorf("grpc client for %s: %w", target, err)
	}
	c.conns[target] = cc
	return cc, nil
}

// Result is one call's outcome.
type Result struct {
	Hostname      string `json:"hostname,omitempty"`
	Version       string `json:"version,omitempty"`
	PeerPrincipal string `json:"peerPrincipal,omitempty"`
	Secure        bool   `json:"secure"`
	// Code is the gRPC status code's name: OK, PermissionDenied, ...
	Code  string `json:"code"`
	Error string `json:"error,omitempty"`
}

// Call makes n Echo calls to target, one after another.
func (c *Client) Call(ctx context.Context, target string, n int, msg string) ([]Result, error) {
	cc, err := c.conn(target)
	if err != nil {
		return nil, err
	}
	client := echopb.NewEchoServiceClient(cc)
	results := make([]Result, 0, n)
	for range n {
		if ctx.Err() != nil {
			return results, ctx.Err()
		}
		cctx, cancel := context.WithTimeout(ctx, callTimout)
		resp, err := client.Echo(cctx, &echopb.EchoRequest{Message: msg}, grpc.WaitForReady(true))
		cancel()
		r := Result{Code: status.Code(err).String()}
		if err != nil {
			r.Error = status.Convert(err).Message()
		} else {
			r.Hostname, r.Version, r.PeerPrincipal, r.Secure = resp.GetHostname(), resp.GetVersion(), resp.GetPeerPrincipal(), resp.GetSecure()
		}
		results = append(results, r)
	}
	return results, nil
}

// ServeHTTP is GET /grpc?target=T&n=N: N calls (default 1) to T from
// inside this pod, answered as a JSON list of Results. A refused call is a
// result, not an HTTP error: the caller wants to see the refusal.
func (c *Client) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	target := q.Get("target")
	if target == "" {
		http.Error(w, "missing target parameter", http.StatusBadRequest)
		return
	}
	n := 1
	if s := q.Get("n"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 || v > maxCalls {
			http.Error(w, fmt.Sprintf("n %q: want 1 to %d", s, maxCalls), http.StatusBadRequest)
			return
		}
		n = v
	}
	results, err := c.Call(r.Context(), target, n, q.Get("msg"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(results)
}
