// Package webapp owns the builder's status pages: the listings as text and JSON,
// a page for people, /healthz and /metrics, served where builder.webapp says.
package webapp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/listing"
	"github.com/nodepool-builder/nodepool-builder/progress"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// Options say what the pages show.
type Options struct {
	Store *store.Store
	// Config is the config the builder runs now; it changes on reloads.
	Config func() *config.Config
	// Health says whether the builder works (nil: yes); nil: /healthz is 404.
	Health func(context.Context) error
	// Progress holds the long work running now; nil shows none.
	Progress *progress.Tracker
	// Metrics serves /metrics; nil: /metrics is 404.
	Metrics http.Handler
	// HostNames are names, besides the ones every server answers to (see
	// allowHost), that requests may carry as their Host. Listen adds the
	// name it listens on.
	HostNames []string
	Logger    *slog.Logger
}

// Timeouts of a request: the pages are small and read the state once.
const (
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 10 * time.Second
	writeTimeout      = 30 * time.Second
	idleTimeout       = 2 * time.Minute
	healthTimeout     = 10 * time.Second // what /healthz gives Health
	shutdownGrace     = 5 * time.Second
)

// Handler serves the pages.
func Handler(opts Options) http.Handler {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	h := &handler{opts: opts}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", h.page)
	mux.HandleFunc("GET /image-list", h.text(h.uploadsText))
	mux.HandleFunc("GET /image-list.json", h.json(h.uploadsJSON))
	mux.HandleFunc("GET /dib-image-list", h.text(h.buildsText))
	mux.HandleFunc("GET /dib-image-list.json", h.json(h.buildsJSON))
	mux.HandleFunc("GET /image-status", h.text(h.statusText))
	mux.HandleFunc("GET /image-status.json", h.json(h.statusJSON))
	if opts.Health != nil {
		mux.HandleFunc("GET /healthz", h.healthz)
	}
	if opts.Metrics != nil {
		mux.Handle("GET /metrics", opts.Metrics)
	}
	return checkHost(mux, opts.HostNames)
}

// checkHost answers only requests whose Host is one allowHost takes, and says
// nosniff on every answer, so that no browser reads a listing as a script or
// a page.
func checkHost(next http.Handler, names []string) http.Handler {
	own := map[string]bool{"localhost": true}
	if name, err := os.Hostname(); err == nil {
		own[hostKey(name)] = true
	}
	for _, n := range names {
		own[hostKey(n)] = true
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Content-Type-Options", "nosniff")
		if !allowHost(r.Host, own) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusMisdirectedRequest)
			io.WriteString(w, "the status pages answer only to an address, localhost, this host's name or the name they listen on\n")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// allowHost says whether a request's Host (with or without a port) names
// this server. DNS rebinding, where a site's name is made to resolve to the
// builder's address so that the site's script reads the pages, needs a name
// of the attacker's making, so an IP address is taken whatever it is: a
// browser sends one only to the origin of that address, the server itself,
// and a scraper sends the address it scrapes, the builder's own or one that a
// NAT or a container's published port forwards to it. Names are taken only
// when they are loopback's (localhost), this host's own, or one the pages
// listen on.
func allowHost(host string, own map[string]bool) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if _, err := netip.ParseAddr(host); err == nil {
		return true
	}
	return host != "" && own[hostKey(host)]
}

// hostKey is a name as Host carries it, compared: in any case, with or
// without the final dot of a fully qualified name.
func hostKey(name string) string { return strings.ToLower(strings.TrimSuffix(name, ".")) }

type handler struct{ opts Options }

// text serves what write prints as plain text, or 500 when it fails.
func (h *handler) text(write func(context.Context, io.Writer) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var buf bytes.Buffer
		if err := write(r.Context(), &buf); err != nil {
			h.fail(w, r, err)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write(buf.Bytes())
	}
}

// json serves what rows returns as the CLI's --json prints it.
func (h *handler) json(rows func(context.Context) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v, err := rows(r.Context())
		var buf bytes.Buffer
		if err == nil {
			err = listing.WriteJSON(&buf, v)
		}
		if err != nil {
			h.fail(w, r, err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(buf.Bytes())
	}
}

func (h *handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	h.opts.Logger.Warn("status page failed", "path", r.URL.Path, "error", err)
	http.Error(w, "the builder's state could not be read: "+err.Error(), http.StatusInternalServerError)
}

func (h *handler) uploadsText(ctx context.Context, w io.Writer) error {
	rows, err := listing.Uploads(ctx, h.opts.Store)
	if err == nil {
		listing.WriteUploads(w, rows)
	}
	return err
}

func (h *handler) uploadsJSON(ctx context.Context) (any, error) {
	return listing.Uploads(ctx, h.opts.Store)
}

func (h *handler) buildsText(ctx context.Context, w io.Writer) error {
	rows, err := listing.Builds(ctx, h.opts.Store)
	if err == nil {
		listing.WriteBuilds(w, rows)
	}
	return err
}

func (h *handler) buildsJSON(ctx context.Context) (any, error) {
	return listing.Builds(ctx, h.opts.Store)
}

func (h *handler) statusText(ctx context.Context, w io.Writer) error {
	cfg := h.opts.Config()
	images, err := listing.ImageStatus(ctx, h.opts.Store, cfg)
	if err != nil {
		return err
	}
	return listing.WriteImageStatusText(w, h.opts.Store, cfg, images)
}

func (h *handler) statusJSON(ctx context.Context) (any, error) {
	images, err := listing.ImageStatus(ctx, h.opts.Store, h.opts.Config())
	if err != nil {
		return nil, err
	}
	return listing.ImagesJSON(images), nil
}

// healthz is 200 "ok" when Health says the builder works; 200 "degraded"
// and why when it works but something waits for the operator (Health's error
// has a method Degraded() bool that says true); 503 and why not otherwise.
func (h *handler) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), healthTimeout)
	defer cancel()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	err := h.opts.Health(ctx)
	if d, ok := err.(interface{ Degraded() bool }); ok && d.Degraded() {
		fmt.Fprintf(w, "degraded: %v\n", err)
		return
	}
	if err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "unhealthy: %v\n", err)
		return
	}
	io.WriteString(w, "ok\n")
}

// Server serves the pages on a bound address.
type Server struct {
	ln  net.Listener
	srv *http.Server
}

// Listen binds addr (host:port) for the pages; it fails when the port cannot
// be had, before anything is served.
func Listen(addr string, opts Options) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for the status pages on %s: %w", addr, err)
	}
	if host, _, err := net.SplitHostPort(addr); err == nil && host != "" {
		opts.HostNames = append(slices.Clone(opts.HostNames), host)
	}
	srv := &http.Server{
		Handler:           Handler(opts),
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
	}
	if opts.Logger != nil {
		srv.ErrorLog = slog.NewLogLogger(opts.Logger.Handler(), slog.LevelWarn)
	}
	return &Server{ln: ln, srv: srv}, nil
}

// URL is where the pages are, e.g. http://127.0.0.1:8006/.
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() + "/" }

// Serve serves the pages until ctx ends, then lets the requests under way
// finish for a few seconds.
func (s *Server) Serve(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(s.ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve the status pages: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
	defer cancel()
	err := s.srv.Shutdown(sctx)
	if err != nil {
		s.srv.Close() // requests that outlived the grace are cut
	}
	if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	if err != nil {
		return fmt.Errorf("stop the status pages: %w", err)
	}
	return nil
}
