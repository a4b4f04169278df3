// Package zuultest runs a stand-in Zuul web server that speaks Zuul's real
// builds API and serves build artifacts, under their log URLs or on an object
// store of their own, for tests and demos. Its answers follow zuul-web's
// (zuul/web/__init__.py) and its MQTT reports Zuul's MQTT reporter
// (zuul/driver/mqtt/mqttreporter.py); each shape says where it comes from.
package zuultest

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Shapes of the builds API.
const (
	// Shape9 puts project, branch, change, patchset, ref, oldrev, newrev
	// and ref_url on the build itself, as Zuul 9 and older do.
	Shape9 = 9
	// Shape10 nests them under "ref", as Zuul 10 and newer do.
	Shape10 = 10
)

// ServerOptions configure a Server. The zero value serves tenant "example"
// in the Zuul 10 shape without auth, from a database that matches names as
// MySQL does, with a Zuul manifest among each finished build's artifacts.
type ServerOptions struct {
	// Tenant is the one tenant served; "example" when empty.
	Tenant string
	// WhiteLabel serves the tenant at the root: /api/info names it and the
	// builds are at /api/builds; /api/tenant/... then does not exist.
	WhiteLabel bool
	// Shape is Shape9 or Shape10 (default).
	Shape int
	// Token, when set, makes the tenant require "Authorization: Bearer
	// <Token>" for reading builds.
	Token string
	// ForbiddenToken is accepted as a valid token that has no access to
	// the tenant (403).
	ForbiddenToken string
	// Unloaded makes the tenant answer 422, as before Zuul loaded it.
	Unloaded bool
	// IgnoreFilters makes a hostile Zuul: the builds API answers every build,
	// newest first, whatever project, job, pipeline, branch, result or other
	// filter the query names (limit and skip still count).
	IgnoreFilters bool
	// IgnoreLimit makes a hostile Zuul answer more builds than the query's
	// limit: every build past those skipped.
	IgnoreLimit bool
	// ProjectAnswer makes a hostile Zuul: the project endpoint answers any
	// project asked, these fields (of Project.toDict: name, canonical_name,
	// connection_name) in place of those of the project asked, e.g. a name
	// of "*".
	ProjectAnswer map[string]string
	// Addr is the listen address; "127.0.0.1:0" when empty.
	Addr string
	// PostgreSQL matches the builds API's filters as Zuul does on
	// PostgreSQL: names with their case. Without it they match as on MySQL
	// and MariaDB, which Zuul's documentation sets up: regardless of case.
	PostgreSQL bool
	// NoManifest leaves out the "Zuul Manifest" artifact that the base jobs
	// of zuul-jobs (generate-zuul-manifest) add to every build.
	NoManifest bool
	// ObjectStore publishes every artifact of every build on the object
	// store (see ArtifactSpec.OnObjectStore) rather than under its log URL.
	ObjectStore bool
	// ObjectStoreAddr is the object store's listen address; "127.0.0.2:0"
	// when empty: another host than the API's, as a real object store is.
	ObjectStoreAddr string
}

// Server is a running stand-in Zuul. Its methods are safe for concurrent use.
type Server struct {
	url  string
	srv  *http.Server
	done chan struct{}

	conns atomic.Int64 // connections clients opened, to the server and its object store

	mu       sync.Mutex
	opts     ServerOptions
	builds   []*build
	nextID   int64
	files    map[string]*file // by URL path under /logs/
	served   map[string]int64
	requests map[string][]RequestInfo
	drops    map[string]int64
	calls    []APICall
	failN    int
	failCode int
	tmpDir   string
	redirs   map[string]string // by path under /redirect/: the target
	store    *objectStore      // nil until asked for
}

// RequestInfo is one request for an artifact file.
type RequestInfo struct {
	Method string
	Range  string // the Range header, "" when absent
	// UserAgent is the User-Agent header, which tells the builder's
	// downloads from a cloud's fetch of the artifact (web-download).
	UserAgent string
}

// APICall is one request to a builds endpoint, as the server saw it, and
// when it arrived.
type APICall struct {
	Path          string
	RawQuery      string
	Query         url.Values
	Authorization string
	Time          time.Time
}

// Connections is how many connections clients opened to the server and to
// its object store.
func (s *Server) Connections() int64 { return s.conns.Load() }

// NewServer starts a Server on a loopback port. It panics when it cannot
// listen, like net/http/httptest does.
func NewServer(opts ServerOptions) *Server {
	if opts.Tenant == "" {
		opts.Tenant = "example"
	}
	if opts.Shape == 0 {
		opts.Shape = Shape10
	}
	addr := opts.Addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		panic(fmt.Sprintf("zuultest: listen on %s: %v", addr, err))
	}
	s := &Server{
		url:      "http://" + ln.Addr().String(),
		done:     make(chan struct{}),
		opts:     opts,
		files:    map[string]*file{},
		served:   map[string]int64{},
		requests: map[string][]RequestInfo{},
		drops:    map[string]int64{},
		redirs:   map[string]string{},
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/info", s.handleInfo)
	mux.HandleFunc("GET /api/tenant/{tenant}/info", s.handleTenantInfo)
	mux.HandleFunc("GET /api/tenant/{tenant}/builds", s.handleTenantBuilds)
	mux.HandleFunc("GET /api/builds", s.handleRootBuilds)
	mux.HandleFunc("GET /api/tenant/{tenant}/project/{project...}", s.handleTenantProject)
	mux.HandleFunc("GET /api/project/{project...}", s.handleRootProject)
	mux.HandleFunc("GET /logs/", s.handleFile)
	mux.HandleFunc("GET /redirect/{id}", s.handleRedirect)
	s.srv = s.httpServer(mux)
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			panic(fmt.Sprintf("zuultest: serve: %v", err))
		}
	}()
	if opts.ObjectStore {
		s.mu.Lock()
		s.objectStoreLocked()
		s.mu.Unlock()
	}
	return s
}

// httpServer serves h, counting the connections clients open.
func (s *Server) httpServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second,
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateNew {
				s.conns.Add(1)
			}
		}}
}

// URL is the Zuul web root to use as api-url, without a trailing slash.
func (s *Server) URL() string { return s.url }

// Close stops the server, drops open connections and removes the
// compressed copies it made of path-backed artifacts.
func (s *Server) Close() {
	_ = s.srv.Close()
	<-s.done
	s.mu.Lock()
	dir := s.tmpDir
	s.tmpDir = ""
	store := s.store
	s.mu.Unlock()
	if store != nil {
		store.close()
	}
	if dir != "" {
		_ = os.RemoveAll(dir)
	}
}

// Tenant returns the name of the tenant served.
func (s *Server) Tenant() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opts.Tenant
}

// SetShape switches the builds API between Shape9 and Shape10.
func (s *Server) SetShape(shape int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opts.Shape = shape
}

// SetToken changes the token the tenant requires; "" makes it public.
func (s *Server) SetToken(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opts.Token = token
}

// SetUnloaded makes the tenant answer 422 (true) or serve again (false).
func (s *Server) SetUnloaded(unloaded bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opts.Unloaded = unloaded
}

// SetWhiteLabel switches between a white-labelled and a multi-tenant root.
func (s *Server) SetWhiteLabel(whiteLabel bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opts.WhiteLabel = whiteLabel
}

// SetIgnoreFilters makes the builds API answer every build whatever the query
// asks (true), or honour its filters again (false).
func (s *Server) SetIgnoreFilters(ignore bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opts.IgnoreFilters = ignore
}

// SetIgnoreLimit makes the builds API answer more builds than the limit
// asks for (true), or honour it again (false).
func (s *Server) SetIgnoreLimit(ignore bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opts.IgnoreLimit = ignore
}

// SetProjectAnswer makes the project endpoint answer any project asked with
// these fields in place of Zuul's (see ServerOptions.ProjectAnswer); nil
// makes it answer as zuul-web again.
func (s *Server) SetProjectAnswer(fields map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opts.ProjectAnswer = fields
}

// FailBuilds makes the next n builds API requests answer status (e.g.
// 500, as Zuul does on a database timeout) before anything else is checked.
func (s *Server) FailBuilds(n, status int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failN, s.failCode = n, status
}

// BuildsCalls returns the builds API requests seen so far, oldest first.
func (s *Server) BuildsCalls() []APICall {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]APICall, len(s.calls))
	copy(out, s.calls)
	return out
}

// artifactPath accepts an artifact's URL or its path on this server.
func artifactPath(p string) string {
	if strings.HasPrefix(p, "http://") || strings.HasPrefix(p, "https://") {
		if u, err := url.Parse(p); err == nil {
			return u.Path
		}
	}
	return p
}

// BytesServed returns how many body bytes of the artifact at path (its URL
// or URL path) have been sent, over all requests.
func (s *Server) BytesServed(path string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.served[artifactPath(path)]
}

// ArtifactRequests returns the requests made for the artifact at path.
func (s *Server) ArtifactRequests(path string) []RequestInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	reqs := s.requests[artifactPath(path)]
	out := make([]RequestInfo, len(reqs))
	copy(out, reqs)
	return out
}

// DropAfter makes the next GET of the artifact at path that carries no
// Range header send n body bytes and then break the connection.
func (s *Server) DropAfter(path string, n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.drops[artifactPath(path)] = n
}

// Redirect makes the server answer a URL of its own with a 302 to target, as a
// log server in front of object storage does, and returns that URL. Publish it
// with ArtifactSpec.Publish to send an artifact's download through it.
func (s *Server) Redirect(target string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := strconv.Itoa(len(s.redirs) + 1)
	s.redirs[id] = target
	return s.url + "/redirect/" + id
}

func (s *Server) handleRedirect(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	target, ok := s.redirs[r.PathValue("id")]
	s.mu.Unlock()
	if !ok {
		http.NotFound(w, r)
		return
	}
	http.Redirect(w, r, target, http.StatusFound)
}
