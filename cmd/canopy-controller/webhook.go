package main

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net/http"
	"time"

	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/canopy-mesh/canopy/controller/admission"
	"github.com/canopy-mesh/canopy/controller/index"
	"github.com/canopy-mesh/canopy/controller/inject"
	"github.com/canopy-mesh/canopy/internal/httpserve"
)

// webhook is the controller's admission webhooks as it runs them: sidecar
// injection (controller/inject, on /inject) and, unless turned off, the
// validation of Istio configuration (controller/admission, on /validate),
// over HTTPS with the CA's serving certificate (which names
// canopy-controller.<ns>.svc and istiod.<ns>.svc). The webhook
// configurations' caBundle is kept by the writers, on the leader.
type webhook struct {
	addr   string
	server *http.Server
	log    *slog.Logger
}

// Timeouts and limits of the webhook's HTTP server. The API server gives a
// webhook 10 s by default and 30 s at most; the handler bounds its own
// work to inject.RequestTimeout.
const (
	webhookReadHeaderTimeout = 10 * time.Second
	webhookReadTimeout       = 30 * time.Second
	webhookWriteTimeout      = 30 * time.Second
	webhookIdleTimeout       = 90 * time.Second
	webhookMaxHeaderBytes    = 64 << 10
	// webhookQueueWait is how long a request beyond the concurrency limit
	// waits for a slot before it is answered 503.
	webhookQueueWait = time.Second
)

// newWebhook builds the webhook.
func newWebhook(cfg config, ca *caParts, ns inject.Namespaces, log *slog.Logger) (*webhook, error) {
	if cfg.inject.DenyReason != "" {
		log.Warn("the injection webhook has no proxy image: it denies the pods it would inject", "reason", cfg.inject.DenyReason)
	}
	injector, err := inject.NewHandler(cfg.inject, ns, log)
	if err != nil {
		return nil, err
	}
	h := http.NewServeMux()
	h.Handle("/inject", injector)
	h.Handle("/inject/", injector)
	if cfg.validation {
		validator := admission.NewHandler(log)
		h.Handle("/validate", validator)
		h.Handle("/validate/", validator)
	}
	return &webhook{
		addr: cfg.webhookAddr,
		server: &http.Server{
			Handler:           httpserve.Limit(h, cfg.webhookMaxRequests, webhookQueueWait),
			TLSConfig:         &tls.Config{GetCertificate: ca.serving.GetCertificate, MinVersion: tls.VersionTLS12},
			ReadHeaderTimeout: webhookReadHeaderTimeout,
			ReadTimeout:       webhookReadTimeout,
			WriteTimeout:      webhookWriteTimeout,
			IdleTimeout:       webhookIdleTimeout,
			MaxHeaderBytes:    webhookMaxHeaderBytes,
			ErrorLog:          slog.NewLogLogger(log.With("component", "webhook-server").Handler(), slog.LevelDebug),
		},
		log: log,
	}, nil
}

func (w *webhook) start(ctx context.Context, g *errgroup.Group) {
	httpserve.Serve(ctx, g, "admission webhooks", "tcp", w.addr, w.server, w.log)
}

// indexNamespaces gives the webhook namespace labels from the informers'
// index. A namespace the index does not hold yet (created a moment ago,
// its pod following at once) is read from the API server within the
// request's deadline; until the informers have synced, lookups wait.
type indexNamespaces struct {
	tables *index.Index
	synced <-chan struct{}
	client kubernetes.Interface
}

var _ inject.Namespaces = indexNamespaces{}

// NamespaceLabels implements inject.Namespaces.
func (n indexNamespaces) NamespaceLabels(ctx context.Context, name string) (map[string]string, bool) {
	select {
	case <-n.synced:
	case <-ctx.Done():
		return nil, false
	}
	if l, ok := n.tables.NamespaceLabels(name); ok {
		return l, true
	}
	ns, err := n.client.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, false
	}
	return ns.Labels, true
}
