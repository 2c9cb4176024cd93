package echo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
)

// ServerConfig configures a Server. Empty addresses disable a listener.
type ServerConfig struct {
	HTTPAddr string
	TCPAddr  string
	// Name identifies the server in responses; default the hostname.
	Name string
	// Ready, when set, must return nil for GET /healthz to answer 200 (the
	// gRPC mode's xDS server is ready once the mesh configured it).
	Ready func() error
	// Handlers are more routes (ServeMux patterns), such as the gRPC
	// mode's GET /grpc.
	Handlers map[string]http.Handler
}

// Server serves HTTP and TCP echo.
type Server struct {
	cfg      ServerConfig
	log      *slog.Logger
	unready  atomic.Bool
	client   *http.Client
	dialer   net.Dialer
	httpLn   net.Listener
	tcpLn    net.Listener
	hostname string

	// load is the current or last load run (GET /load/start, /load/stop,
	// /load/result); stopLoad ends the current one early.
	loadMu   sync.Mutex
	loading  bool
	stopLoad context.CancelFunc
	report   *LoadReport
	loadErr  error
}

// Reply is the JSON body of GET /.
type Reply struct {
	Name       string              `json:"name"`
	Hostname   string              `json:"hostname"`
	RemoteAddr string              `json:"remoteAddr"`
	Host       string              `json:"host"`
	Method     string              `json:"method"`
	Path       string              `json:"path"`
	Headers    map[string][]string `json:"headers"`
}

// NewServer binds the configured listeners, so that a caller knows they
// accept connections once it returns.
func NewServer(cfg ServerConfig, log *slog.Logger) (*Server, error) {
	host, _ := os.Hostname()
	if cfg.Name == "" {
		cfg.Name = host
	}
	s := &Server{
		cfg:      cfg,
		log:      log,
		hostname: host,
		client:   &http.Client{Timeout: 10 * time.Second},
		dialer:   net.Dialer{Timeout: 10 * time.Second},
	}
	var err error
	if cfg.HTTPAddr != "" {
		if s.httpLn, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
			return nil, fmt.Errorf("listen http: %w", err)
		}
	}
	if cfg.TCPAddr != "" {
		if s.tcpLn, err = net.Listen("tcp", cfg.TCPAddr); err != nil {
			if s.httpLn != nil {
				s.httpLn.Close()
			}
			return nil, fmt.Errorf("listen tcp: %w", err)
		}
	}
	return s, nil
}

// HTTPAddr returns the bound HTTP address, or nil.
func (s *Server) HTTPAddr() net.Addr { return addr(s.httpLn) }

// TCPAddr returns the bound TCP echo address, or nil.
func (s *Server) TCPAddr() net.Addr { return addr(s.tcpLn) }

func addr(l net.Listener) net.Addr {
	if l == nil {
		return nil
	}
	return l.Addr()
}

// Run serves until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	if s.httpLn != nil {
		srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
		g.Go(func() error {
			if err := srv.Serve(s.httpLn); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serve http: %w", err)
			}
			return nil
		})
		g.Go(func() error {
			<-ctx.Done()
			shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return srv.Shutdown(shutdown)
		})
	}
	if s.tcpLn != nil {
		g.Go(func() error { return s.serveTCP(ctx) })
		g.Go(func() error {
			<-ctx.Done()
			return s.tcpLn.Close()
		})
	}
	s.log.Info("serving", "http", s.HTTPAddr(), "tcp", s.TCPAddr())
	return g.Wait()
}

func (s *Server) serveTCP(ctx context.Context) error {
	for {
		conn, err := s.tcpLn.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("accept tcp: %w", err)
		}
		go func() {
			defer conn.Close()
			if _, err := io.Copy(conn, conn); err != nil {
				s.log.Debug("tcp echo ended", "remote", conn.RemoteAddr(), "err", err)
			}
		}()
	}
}

// Handler returns the HTTP handler.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", s.describe)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if s.unready.Load() {
			http.Error(w, "readiness failed on request", http.StatusServiceUnavailable)
			return
		}
		if s.cfg.Ready != nil {
			if err := s.cfg.Ready(); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("POST /healthz/fail", func(w http.ResponseWriter, _ *http.Request) { s.unready.Store(true) })
	mux.HandleFunc("POST /healthz/ok", func(w http.ResponseWriter, _ *http.Request) { s.unready.Store(false) })
	mux.HandleFunc("GET /fetch", s.fetch)
	mux.HandleFunc("GET /dial", s.dial)
	mux.HandleFunc("GET /resolve", s.resolve)
	mux.HandleFunc("GET /load/start", s.loadStart)
	mux.HandleFunc("GET /load/stop", s.loadStop)
	mux.HandleFunc("GET /load/result", s.loadResult)
	for pattern, h := range s.cfg.Handlers {
		mux.Handle(pattern, h)
	}
	return mux
}

func (s *Server) describe(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(Reply{
		Name:       s.cfg.Name,
		Hostname:   s.hostname,
		RemoteAddr: r.RemoteAddr,
		Host:       r.Host,
		Method:     r.Method,
		Path:       r.URL.Path,
		Headers:    r.Header,
	})
}

func (s *Server) fetch(w http.ResponseWriter, r *http.Request) {
	target := r.URL.Query().Get("url")
	if target == "" {
		http.Error(w, "missing url parameter", http.StatusBadRequest)
		return
	}
	req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, target, nil)
	if err != nil {
		http.Error(w, fmt.Sprintf("bad url: %v", err), http.StatusBadRequest)
		return
	}
	// Every fetch opens a connection of its own, as a new client would:
	// load balancing and policy decisions are per connection, and a kept-alive
	// one would hide both.
	req.Close = true
	resp, err := s.client.Do(req)
	if err != nil {
		http.Error(w, fmt.Sprintf("fetch %s: %v", target, err), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

// resolve looks a name up as the app's resolver does (the pod's
// resolv.conf, its search list and ndots) and answers its addresses, one
// per line, sorted.
func (s *Server) resolve(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("name")
	if name == "" {
		http.Error(w, "missing name parameter", http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupHost(ctx, name)
	if err != nil {
		http.Error(w, fmt.Sprintf("resolve %s: %v", name, err), http.StatusBadGateway)
		return
	}
	slices.Sort(addrs)
	fmt.Fprintln(w, strings.Join(addrs, "\n"))
}

func (s *Server) dial(w http.ResponseWriter, r *http.Request) {
	target, msg := r.URL.Query().Get("addr"), r.URL.Query().Get("msg")
	if target == "" || msg == "" {
		http.Error(w, "missing addr or msg parameter", http.StatusBadRequest)
		return
	}
	got, err := EchoTCP(r.Context(), &s.dialer, target, msg)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	fmt.Fprint(w, got)
}

// Dialer is what EchoTCP needs of a net.Dialer.
type Dialer interface {
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
}

// EchoTCP sends msg to a TCP echo server at addr and returns what comes back.
func EchoTCP(ctx context.Context, d Dialer, addr, msg string) (string, error) {
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", fmt.Errorf("dial %s: %w", addr, err)
	}
	defer conn.Close()
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
	} else {
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	}
	if _, err := io.WriteString(conn, msg); err != nil {
		return "", fmt.Errorf("write to %s: %w", addr, err)
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(conn, buf); err != nil {
		return "", fmt.Errorf("read echo from %s: %w", addr, err)
	}
	return string(buf), nil
}

// loadStart starts a load run (LoadConfig from the query: addr, duration,
// interval, held, heldEvery) in the background; one at a time.
func (s *Server) loadStart(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	cfg := LoadConfig{Addr: q.Get("addr"), Interval: 20 * time.Millisecond, HeldEvery: 200 * time.Millisecond}
	var err error
	parseDur := func(name string, into *time.Duration) {
		if v := q.Get(name); v != "" && err == nil {
			*into, err = time.ParseDuration(v)
		}
	}
	parseDur("duration", &cfg.Duration)
	parseDur("interval", &cfg.Interval)
	parseDur("heldEvery", &cfg.HeldEvery)
	if v := q.Get("held"); v != "" && err == nil {
		cfg.Held, err = strconv.Atoi(v)
	}
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		http.Error(w, fmt.Sprintf("load: %v", err), http.StatusBadRequest)
		return
	}
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	if s.loading {
		http.Error(w, "a load run is already running", http.StatusConflict)
		return
	}
	ctx, stop := context.WithCancel(context.Background())
	s.loading, s.stopLoad, s.report, s.loadErr = true, stop, nil, nil
	go func() {
		defer stop()
		rep, err := RunLoad(ctx, &s.dialer, cfg)
		s.loadMu.Lock()
		defer s.loadMu.Unlock()
		s.loading, s.report, s.loadErr = false, &rep, err
	}()
	fmt.Fprintln(w, "started")
}

// loadStop ends the current load run now, as if its duration were over;
// its report follows on /load/result. Without a run it does nothing.
func (s *Server) loadStop(w http.ResponseWriter, _ *http.Request) {
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	if s.loading {
		s.stopLoad()
	}
	fmt.Fprintln(w, "stopped")
}

// loadResult answers the last run's report once it has ended: 409 while it
// runs, 404 before any.
func (s *Server) loadResult(w http.ResponseWriter, _ *http.Request) {
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	switch {
	case s.loading:
		http.Error(w, "the load run is still running", http.StatusConflict)
	case s.loadErr != nil:
		http.Error(w, s.loadErr.Error(), http.StatusInternalServerError)
	case s.report == nil:
		http.Error(w, "no load run yet", http.StatusNotFound)
	default:
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(s.report)
	}
}
