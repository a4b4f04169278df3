package zuultest

import (
	"cmp"
	"crypto/rand"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// BuildSpec describes a build to add. Zero fields get plausible values.
type BuildSpec struct {
	Job      string // "build-image" when empty
	Project  string // "org/images" when empty
	Branch   string // "master" when empty
	Pipeline string // "periodic" when empty
	// Result is "SUCCESS" when empty, unless InProgress is set.
	Result string
	// InProgress reports the build as running: no result, end time or log URL.
	InProgress bool
	// NonFinal marks a build that Zuul retried (final: false).
	NonFinal bool
	UUID     string // a random uuid4 hex when empty
	// ID is the build's _id; 0: one above the last given. Builds are
	// answered by _id, highest first.
	ID int64
	// StartTime and EndTime default to ten minutes ago and now.
	StartTime time.Time
	EndTime   time.Time
	// Change and Patchset describe a change ref; 0 means a branch ref.
	Change   int
	Patchset string
	Newrev   string
	// Artifacts are published by the build and served by the Server.
	Artifacts []ArtifactSpec
}

// Build is what AddBuild created.
type Build struct {
	ID        int64
	UUID      string
	LogURL    string
	Artifacts []Artifact
}

type build struct {
	id       int64
	spec     BuildSpec
	buildset string
	eventID  string
	logURL   string
	arts     []Artifact
}

// artifactsJSON is the build's artifacts as Zuul shows them, in its builds API
// and in its MQTT reports.
func (b *build) artifactsJSON() []any {
	arts := []any{}
	for _, a := range b.arts {
		o := map[string]any{"name": a.Name, "url": a.published}
		if len(a.Metadata) > 0 {
			o["metadata"] = a.Metadata
		}
		arts = append(arts, o)
	}
	return arts
}

func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return hex.EncodeToString(b[:])
}

// AddBuild records a build, prepares its artifacts for serving and returns
// its id, uuid, log URL and artifact details. It fails when an artifact's
// file cannot be read or compressed.
func (s *Server) AddBuild(spec BuildSpec) (Build, error) {
	if spec.Job == "" {
		spec.Job = "build-image"
	}
	if spec.Project == "" {
		spec.Project = "org/images"
	}
	if spec.Branch == "" {
		spec.Branch = "master"
	}
	if spec.Pipeline == "" {
		spec.Pipeline = "periodic"
	}
	if spec.Result == "" && !spec.InProgress {
		spec.Result = "SUCCESS"
	}
	if spec.InProgress {
		spec.Result = ""
		spec.EndTime = time.Time{}
	}
	if spec.UUID == "" {
		spec.UUID = newUUID()
	}
	if spec.EndTime.IsZero() && !spec.InProgress {
		spec.EndTime = time.Now().UTC().Truncate(time.Second)
	}
	if spec.StartTime.IsZero() {
		ref := spec.EndTime
		if ref.IsZero() {
			ref = time.Now().UTC()
		}
		spec.StartTime = ref.Add(-10 * time.Minute).Truncate(time.Second)
	}
	if spec.Newrev == "" {
		// A stable, commit-id-shaped value derived from the build.
		sum := sha1.Sum([]byte(spec.UUID))
		spec.Newrev = hex.EncodeToString(sum[:])
	}
	b := &build{
		spec:     spec,
		buildset: newUUID(),
		eventID:  newUUID(),
		logURL:   s.url + "/logs/" + spec.UUID + "/",
	}
	files := map[string]*file{}
	for i, as := range spec.Artifacts {
		f, art, err := s.prepareArtifact(b.logURL, "/logs/"+spec.UUID+"/", as, spec.EndTime)
		if err != nil {
			return Build{}, fmt.Errorf("add build %s: artifact %d (%s): %w", spec.UUID, i, as.Name, err)
		}
		files[art.Path] = f
		b.arts = append(b.arts, art)
	}
	s.mu.Lock()
	maps.Copy(s.files, files)
	if spec.ID != 0 {
		b.id = spec.ID
	} else {
		s.nextID++
		b.id = s.nextID
	}
	s.builds = append(s.builds, b)
	slices.SortStableFunc(s.builds, func(x, y *build) int { return cmp.Compare(x.id, y.id) })
	s.mu.Unlock()
	out := Build{ID: b.id, UUID: spec.UUID, LogURL: b.logURL}
	for _, a := range b.arts {
		a.Metadata = maps.Clone(a.Metadata)
		out.Artifacts = append(out.Artifacts, a)
	}
	return out, nil
}

func zuulTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UTC().Format("2006-01-02T15:04:05")
}

func orNull(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// json renders the build the way Zuul's BuildConverter does for the
// builds list, in the given shape.
func (b *build) json(shape int) map[string]any {
	sp := b.spec
	var duration, result, logURL any
	if !sp.InProgress {
		duration = sp.EndTime.Sub(sp.StartTime).Seconds()
		result = sp.Result
		logURL = b.logURL
	}
	arts := b.artifactsJSON()
	ref := map[string]any{
		"project":  sp.Project,
		"branch":   sp.Branch,
		"change":   nil,
		"patchset": nil,
		"ref":      "refs/heads/" + sp.Branch,
		"oldrev":   nil,
		"newrev":   sp.Newrev,
		"ref_url":  "https://git.example.com/" + sp.Project + "/commit/" + sp.Newrev,
	}
	if sp.Change > 0 {
		ref["change"] = sp.Change
		ref["patchset"] = orNull(sp.Patchset)
		ref["ref"] = fmt.Sprintf("refs/changes/%02d/%d/%s", sp.Change%100, sp.Change, sp.Patchset)
		ref["newrev"] = nil
		ref["ref_url"] = fmt.Sprintf("https://review.example.com/%d", sp.Change)
	}
	out := map[string]any{
		"_id":             b.id,
		"uuid":            sp.UUID,
		"job_name":        sp.Job,
		"result":          result,
		"held":            false,
		"start_time":      zuulTime(sp.StartTime),
		"end_time":        zuulTime(sp.EndTime),
		"duration":        duration,
		"voting":          true,
		"log_url":         logURL,
		"nodeset":         "ubuntu-noble",
		"error_detail":    nil,
		"final":           !sp.NonFinal,
		"artifacts":       arts,
		"provides":        []any{},
		"pipeline":        sp.Pipeline,
		"event_id":        b.eventID,
		"event_timestamp": zuulTime(sp.StartTime),
		"buildset":        map[string]any{"uuid": b.buildset},
	}
	if shape == Shape9 {
		for k, v := range ref {
			out[k] = v
		}
	} else {
		out["ref"] = ref
	}
	return out
}

// buildsParams are the query parameters Zuul's builds endpoint accepts;
// CherryPy answers 404 to any other.
var buildsParams = []string{
	"project", "pipeline", "change", "branch", "patchset", "ref", "newrev",
	"uuid", "job_name", "voting", "nodeset", "result", "final", "held",
	"complete", "limit", "skip", "idx_min", "idx_max", "exclude_result",
}

// match reports whether v matches one of the patterns, where "*" stands
// for any run of characters, as in Zuul's builds filters.
func match(patterns []string, v string) bool {
	if len(patterns) == 0 {
		return true
	}
	for _, p := range patterns {
		if glob(p, v) {
			return true
		}
	}
	return false
}

func glob(pattern, v string) bool {
	parts := strings.Split(pattern, "*")
	if len(parts) == 1 {
		return pattern == v
	}
	if !strings.HasPrefix(v, parts[0]) {
		return false
	}
	v = v[len(parts[0]):]
	for _, mid := range parts[1 : len(parts)-1] {
		i := strings.Index(v, mid)
		if i < 0 {
			return false
		}
		v = v[i+len(mid):]
	}
	return strings.HasSuffix(v, parts[len(parts)-1])
}

// errorPage answers like CherryPy's HTTPError does: an HTML page whose
// paragraph carries the message.
func errorPage(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "text/html;charset=utf-8")
	w.WriteHeader(code)
	status := fmt.Sprintf("%d %s", code, http.StatusText(code))
	fmt.Fprintf(w, "<!DOCTYPE html>\n<html>\n<head>\n<title>%s</title>\n</head>\n<body>\n<h2>%s</h2>\n<p>%s</p>\n</body>\n</html>\n", status, status, msg)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Access-Control-Allow-Origin", "*")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// authError answers like Zuul's AuthContext: 401 with a JSON body and a
// WWW-Authenticate header.
func authError(w http.ResponseWriter, realm, errName, desc string) {
	w.Header().Set("WWW-Authenticate", fmt.Sprintf("Bearer realm=%q\n       error=%q\n       error_description=%q", realm, errName, desc))
	writeJSON(w, http.StatusUnauthorized, map[string]string{
		"description": desc,
		"error":       errName,
		"realm":       realm,
	})
}

// RemoveBuild forgets the build with uuid, as if Zuul had never answered it.
func (s *Server) RemoveBuild(uuid string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.builds = slices.DeleteFunc(s.builds, func(b *build) bool { return b.spec.UUID == uuid })
}

// Restart forgets every build and gives ids from 1 again, as a Zuul whose
// database was rebuilt. Their artifacts are still served.
func (s *Server) Restart() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.builds, s.nextID = nil, 0
}

func (s *Server) infoDoc(tenant string) map[string]any {
	info := map[string]any{
		"capabilities": map[string]any{
			"job_history": true,
			"auth": map[string]any{
				"realms":                 map[string]any{},
				"default_realm":          nil,
				"read_protected":         false,
				"auth_log_file_requests": false,
			},
		},
		"stats":         map[string]any{"url": nil, "prefix": nil, "type": "graphite"},
		"websocket_url": nil,
	}
	if tenant != "" {
		info["tenant"] = tenant
	}
	return map[string]any{"info": info}
}

func (s *Server) handleInfo(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	tenant := ""
	if s.opts.WhiteLabel {
		tenant = s.opts.Tenant
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, s.infoDoc(tenant))
}

func (s *Server) handleTenantInfo(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	wl := s.opts.WhiteLabel
	s.mu.Unlock()
	if wl {
		errorPage(w, http.StatusNotFound, "Nothing matches the given URI")
		return
	}
	// Like Zuul, tenant info is answered for any name.
	writeJSON(w, http.StatusOK, s.infoDoc(r.PathValue("tenant")))
}

func (s *Server) handleTenantBuilds(w http.ResponseWriter, r *http.Request) {
	s.serveBuilds(w, r, r.PathValue("tenant"), false)
}

func (s *Server) handleRootBuilds(w http.ResponseWriter, r *http.Request) {
	s.serveBuilds(w, r, "", true)
}

func (s *Server) serveBuilds(w http.ResponseWriter, r *http.Request, tenant string, root bool) {
	s.mu.Lock()
	s.calls = append(s.calls, APICall{
		Path:          r.URL.Path,
		RawQuery:      r.URL.RawQuery,
		Query:         r.URL.Query(),
		Authorization: r.Header.Get("Authorization"),
		Time:          time.Now(),
	})
	opts := s.opts
	failCode := 0
	if s.failN > 0 {
		s.failN--
		failCode = s.failCode
	}
	s.mu.Unlock()

	if failCode != 0 {
		errorPage(w, failCode, "The server encountered an unexpected condition which prevented it from fulfilling the request.")
		return
	}
	if root != opts.WhiteLabel {
		errorPage(w, http.StatusNotFound, "Nothing matches the given URI")
		return
	}
	if root {
		tenant = opts.Tenant
	}
	if tenant != opts.Tenant {
		errorPage(w, http.StatusNotFound, "Unknown tenant")
		return
	}
	if opts.Unloaded {
		errorPage(w, http.StatusUnprocessableEntity, fmt.Sprintf("Tenant %s isn't ready", tenant))
		return
	}
	if opts.Token != "" && !s.authorized(w, r, opts) {
		return
	}

	q := r.URL.Query()
	var unexpected []string
	for k := range q {
		if !slices.Contains(buildsParams, k) {
			unexpected = append(unexpected, k)
		}
	}
	if len(unexpected) > 0 {
		slices.Sort(unexpected)
		errorPage(w, http.StatusNotFound, "Unexpected query string parameters: "+strings.Join(unexpected, ", "))
		return
	}
	limit, skip := 50, 0
	for name, dst := range map[string]*int{"limit": &limit, "skip": &skip} {
		if v := q.Get(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				errorPage(w, http.StatusBadRequest, fmt.Sprintf("%s must be a non-negative integer", name))
				return
			}
			*dst = n
		}
	}

	s.mu.Lock()
	var selected []map[string]any
	for i := len(s.builds) - 1; i >= 0; i-- { // newest first by _id
		b := s.builds[i]
		if !opts.IgnoreFilters && !b.matches(q) {
			continue
		}
		if skip > 0 {
			skip--
			continue
		}
		if len(selected) >= limit {
			break
		}
		selected = append(selected, b.json(opts.Shape))
	}
	s.mu.Unlock()
	if selected == nil {
		selected = []map[string]any{}
	}
	writeJSON(w, http.StatusOK, selected)
}

// authorized checks the bearer token like Zuul does for a tenant with
// access rules, answering 401 or 403 itself when it fails.
func (s *Server) authorized(w http.ResponseWriter, r *http.Request, opts ServerOptions) bool {
	realm := opts.Tenant
	h := r.Header.Get("Authorization")
	switch {
	case h == "":
		authError(w, realm, "MissingAuthError", `Missing "Authorization" header`)
		return false
	case !strings.HasPrefix(strings.ToLower(h), "bearer "):
		authError(w, realm, "InvalidAuthFormat", `"Authorization" header must start with "Bearer"`)
		return false
	}
	token := h[len("Bearer "):]
	switch {
	case token == opts.Token:
		return true
	case opts.ForbiddenToken != "" && token == opts.ForbiddenToken:
		w.Header().Set("Content-Length", "0")
		w.WriteHeader(http.StatusForbidden)
		return false
	default:
		authError(w, realm, "AuthTokenInvalidSignatureException", "Invalid signature")
		return false
	}
}

func (b *build) matches(q url.Values) bool {
	sp := b.spec
	if !match(q["project"], sp.Project) ||
		!match(q["job_name"], sp.Job) ||
		!match(q["pipeline"], sp.Pipeline) ||
		!match(q["branch"], sp.Branch) ||
		!match(q["uuid"], sp.UUID) {
		return false
	}
	if rs := q["result"]; len(rs) > 0 && (sp.InProgress || !match(rs, sp.Result)) {
		return false
	}
	if ex := q["exclude_result"]; len(ex) > 0 && !sp.InProgress && match(ex, sp.Result) {
		return false
	}
	if v := q.Get("complete"); v != "" && strings.EqualFold(v, "true") == sp.InProgress {
		return false
	}
	if v := q.Get("final"); v != "" && strings.EqualFold(v, "true") == sp.NonFinal {
		return false
	}
	return true
}
