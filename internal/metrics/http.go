package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// DefaultAddress is --http-address's default: the node's loopback, where
// the DaemonSet's probes reach the agent (hostNetwork).
const DefaultAddress = "127.0.0.1:9753"

// Timeouts of the endpoint.
const (
	// scrapeTimeout bounds a /metrics response: past it the scraper gets a
	// 503 (the gathering goes on in the background and is thrown away).
	scrapeTimeout = 10 * time.Second
	// maxScrapesInFlight bounds concurrent /metrics requests; more get 503.
	maxScrapesInFlight = 4
)

// shutdownTimeout bounds Serve's graceful shutdown; a var for tests.
var shutdownTimeout = 2 * time.Second

// Handler serves /metrics, /healthz and /readyz; any other path is 404, and
// any method other than GET or HEAD on them 405.
func (a *Agent) Handler() http.Handler { return a.handler }

func (a *Agent) newHandler() http.Handler {
	metricsHandler := promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{
		ErrorLog: promLogger{a},
		// A collector's error (e.g. the process collector's) costs only
		// its own series, not the whole scrape.
		ErrorHandling:       promhttp.ContinueOnError,
		Registry:            a.reg, // promhttp_metric_handler_errors_total
		MaxRequestsInFlight: maxScrapesInFlight,
		Timeout:             scrapeTimeout,
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var h http.Handler
		switch r.URL.Path {
		case "/metrics":
			h = metricsHandler
		case "/healthz":
			h = probe(a.healthz)
		case "/readyz":
			h = probe(a.readyz)
		default:
			text(w, http.StatusNotFound, "not found")
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			text(w, http.StatusMethodNotAllowed, "method not allowed")
			return
		}
		h.ServeHTTP(w, r)
	})
}

// probe answers a health check: 200 when ok, 503 otherwise, and the reason.
func probe(check func() (bool, string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		ok, msg := check()
		code := http.StatusOK
		if !ok {
			code = http.StatusServiceUnavailable
		}
		text(w, code, msg)
	})
}

// text writes a one-line text/plain response.
func text(w http.ResponseWriter, code int, msg string) {
	body := msg + "\n"
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(body)) // net/http drops it for HEAD
}

// promLogger logs promhttp's errors on one line through the Agent's logger.
type promLogger struct{ a *Agent }

func (l promLogger) Println(v ...any) {
	msg := strings.TrimSpace(fmt.Sprintln(v...))
	l.a.log.Warn("serving /metrics: " + oneLine(msg, 2000))
}

// Serve listens on addr and serves h until ctx is done, then shuts down
// gracefully, waiting at most 2 s for requests in flight. A failure to
// listen (e.g. the port is taken) is returned at once; after a shutdown
// because ctx is done Serve returns nil. An empty addr disables the
// endpoint: Serve returns nil at once without listening.
func Serve(ctx context.Context, addr string, h http.Handler, log *slog.Logger) error {
	if log == nil {
		log = slog.Default()
	}
	if addr == "" {
		log.Info("metrics and health endpoint disabled (empty --http-address)")
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics and health endpoint: %w", err)
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      scrapeTimeout + 5*time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("serving /metrics, /healthz and /readyz", "addr", ln.Addr().String())

	select {
	case err := <-served:
		return fmt.Errorf("metrics and health endpoint on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("metrics and health endpoint: requests still in flight at shutdown; closing them", "err", err)
		_ = srv.Close()
	}
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("metrics and health endpoint on %s: %w", ln.Addr(), err)
	}
	return nil
}
