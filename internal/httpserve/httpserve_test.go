package httpserve

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// TestLimit holds max requests inside the handler and checks that one
// more is refused with 503 after the wait, and served once a slot frees.
func TestLimit(t *testing.T) {
	t.Parallel()
	const max = 3
	entered := make(chan struct{}, max)
	release := make(chan struct{})
	h := Limit(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		entered <- struct{}{}
		<-release
		w.WriteHeader(http.StatusNoContent)
	}), max, 50*time.Millisecond)

	var wg sync.WaitGroup
	codes := make(chan int, max)
	for range max {
		wg.Go(func() {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
			codes <- rec.Code
		})
	}
	for range max {
		<-entered
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "1" {
		t.Errorf("request beyond the limit: %d, Retry-After %q; want 503, 1", rec.Code, rec.Header().Get("Retry-After"))
	}
	close(release)
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != http.StatusNoContent {
			t.Errorf("request within the limit: %d", c)
		}
	}
	// Slots are given back.
	entered = make(chan struct{}, max+1)
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	if rec.Code != http.StatusNoContent {
		t.Errorf("request after the others ended: %d", rec.Code)
	}
}
