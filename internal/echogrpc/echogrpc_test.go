package echogrpc

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/credentials"
)

func startServer(t *testing.T, version string) *Server {
	t.Helper()
	s, err := NewServer(ServerConfig{Addr: "127.0.0.1:0", Hostname: "echo-" + version, Version: version}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Run(t.Context()) }()
	return s
}

func TestCallsReportServerAndPeer(t *testing.T) {
	s := startServer(t, "v1")
	if err := s.Ready(); err != nil {
		t.Fatalf("a plaintext server is ready at once: %v", err)
	}
	c, err := NewClient(false)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got, err := c.Call(t.Context(), "passthrough:///"+s.Addr().String(), 3, "hi")
	if err != nil {
		t.Fatal(err)
	}
	want := []Result{{Hostname: "echo-v1", Version: "v1", Code: "OK"}}
	want = append(want, want[0], want[0])
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("results (-want +got):\n%s", d)
	}
}

func TestHTTPBounds(t *testing.T) {
	s := startServer(t, "v1")
	c, err := NewClient(false)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h := httptest.NewServer(c)
	defer h.Close()
	get := func(q string) (int, string) {
		resp, err := http.Get(h.URL + "/grpc?" + q)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	target := url.QueryEscape("passthrough:///" + s.Addr().String())
	for _, q := range []string{"", "target=" + target + "&n=0", "target=" + target + "&n=1001", "target=" + target + "&n=x"} {
		if code, body := get(q); code != http.StatusBadRequest {
			t.Errorf("GET /grpc?%s = %d %q, want 400", q, code, body)
		}
	}
	if code, body := get("target=" + target + "&n=2"); code != http.StatusOK {
		t.Errorf("GET two calls = %d %q", code, body)
	}
	// Every distinct target costs a connection: a caller cannot make the
	// client hold more than maxTargets (one is held already).
	for i := range maxTargets - 1 {
		if _, err := c.conn(fmt.Sprintf("passthrough:///127.0.0.1:%d", 1+i)); err != nil {
			t.Fatalf("target %d of %d: %v", i+2, maxTargets, err)
		}
	}
	if code, body := get("target=" + url.QueryEscape("passthrough:///127.0.0.1:99") + "&n=1"); code != http.StatusBadGateway {
		t.Errorf("target %d: %d %q, want 502 (too many targets)", maxTargets+1, code, body)
	}
}

func TestPrincipal(t *testing.T) {
	spiffe, _ := url.Parse("spiffe://cluster.local/ns/grpc-demo/sa/client")
	withURI := tls.ConnectionState{PeerCertificates: []*x509.Certificate{{URIs: []*url.URL{spiffe}}}}
	for _, tc := range []struct {
		name   string
		info   credentials.AuthInfo
		want   string
		secure bool
	}{
		{"plaintext", nil, "", false},
		{"tls without client certificate", credentials.TLSInfo{}, "", true},
		{"mutual tls", credentials.TLSInfo{State: withURI}, spiffe.String(), true},
		{"mutual tls by pointer", &credentials.TLSInfo{State: withURI}, spiffe.String(), true},
	} {
		got, secure := principal(tc.info)
		if got != tc.want || secure != tc.secure {
			t.Errorf("%s: principal = %q, %v; want %q, %v", tc.name, got, secure, tc.want, tc.secure)
		}
	}
}
