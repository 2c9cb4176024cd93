package echo

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync/atomic"
	"testing"
)

func startServer(t *testing.T) *Server {
	t.Helper()
	s, err := NewServer(ServerConfig{HTTPAddr: "127.0.0.1:0", TCPAddr: "127.0.0.1:0", Name: "test"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return s
}

func get(t *testing.T, method, u string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestServer(t *testing.T) {
	s := startServer(t)
	base := "http://" + s.HTTPAddr().String()

	code, body := get(t, http.MethodGet, base+"/")
	var r Reply
	if err := json.Unmarshal([]byte(body), &r); code != 200 || err != nil || r.Name != "test" || r.Path != "/" {
		t.Fatalf("GET / = %d %q (%v)", code, body, err)
	}

	if code, _ := get(t, http.MethodGet, base+"/healthz"); code != 200 {
		t.Errorf("healthz = %d, want 200", code)
	}
	get(t, http.MethodPost, base+"/healthz/fail")
	if code, _ := get(t, http.MethodGet, base+"/healthz"); code != 503 {
		t.Errorf("healthz after fail = %d, want 503", code)
	}
	get(t, http.MethodPost, base+"/healthz/ok")
	if code, _ := get(t, http.MethodGet, base+"/healthz"); code != 200 {
		t.Errorf("healthz after ok = %d, want 200", code)
	}

	code, body = get(t, http.MethodGet, base+"/fetch?url="+url.QueryEscape(base+"/"))
	if err := json.Unmarshal([]byte(body), &r); code != 200 || err != nil || r.Name != "test" {
		t.Errorf("fetch = %d %q (%v)", code, body, err)
	}
	if code, _ := get(t, http.MethodGet, base+"/fetch?url="+url.QueryEscape("http://127.0.0.1:1/")); code != http.StatusBadGateway {
		t.Errorf("fetch of a closed port = %d, want 502", code)
	}
	if code, _ := get(t, http.MethodGet, base+"/fetch"); code != http.StatusBadRequest {
		t.Errorf("fetch without url = %d, want 400", code)
	}

	code, body = get(t, http.MethodGet, base+"/dial?addr="+s.TCPAddr().String()+"&msg=hello")
	if code != 200 || body != "hello" {
		t.Errorf("dial = %d %q, want 200 hello", code, body)
	}

	got, err := EchoTCP(t.Context(), &net.Dialer{}, s.TCPAddr().String(), "direct")
	if err != nil || got != "direct" {
		t.Errorf("EchoTCP = %q, %v", got, err)
	}
}

// TestFetchOpensAConnectionEach: load balancing and authorization act per
// connection, so each fetch must reach the target on a new one.
func TestFetchOpensAConnectionEach(t *testing.T) {
	var opened atomic.Int32
	target := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
	target.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			opened.Add(1)
		}
	}
	target.Start()
	defer target.Close()
	base := "http://" + startServer(t).HTTPAddr().String()
	for range 3 {
		if code, body := get(t, http.MethodGet, base+"/fetch?url="+url.QueryEscape(target.URL)); code != 200 || body != "ok" {
			t.Fatalf("fetch = %d %q", code, body)
		}
	}
	if got := opened.Load(); got != 3 {
		t.Errorf("3 fetches opened %d connections to the target, want 3", got)
	}
}
