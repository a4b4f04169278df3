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
	// InProgress reports the build as running: no result, end time, log URL,
	// final, held or artifacts yet.
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
	// Oldrev and Newrev are the revisions of a branch ref. A build in a
	// pipeline whose name starts with "periodic" ran on the timer trigger's
	// ref, which has none; any other branch build ran on a ref-updated event,
	// and gets commit-id-shaped ones when they are empty.
	Oldrev string
	Newrev string
	// SuccessMessage and FailureMessage are the job's success-message and
	// failure-message, which Zuul's MQTT reports give in place of the build's
	// result (formatJobResult in zuul/model.py); its database, and so the
	// builds API, keeps the result.
	SuccessMessage string
	FailureMessage string
	// Artifacts are published by the build and served by the Server, after
	// the Zuul manifest (see ArtifactSpec for the order), once it finished.
	Artifacts []ArtifactSpec
}

// Build is what AddBuild created.
type Build struct {
	ID     int64
	UUID   string
	LogURL string
	// Artifacts are those of BuildSpec.Artifacts, in its order.
	Artifacts []Artifact
	// Manifest is the "Zuul Manifest" artifact; nil with
	// ServerOptions.NoManifest.
	Manifest *Artifact
}

type build struct {
	id       int64
	spec     BuildSpec
	buildset string
	eventID  string // the trigger event's zuul_event_id
	itemUUID string // the queue item's uuid
	jobUUID  string // the frozen job's uuid
	logURL   string
	// triggered and enqueued are when the trigger event came and the item
	// was enqueued: shortly before the build started.
	triggered time.Time
	enqueued  time.Time
	arts      []Artifact
	manifest  *Artifact
}

// artifactsJSON is the build's artifacts as Zuul shows them, in its builds API
// (BuildConverter.toDict in zuul/web/__init__.py) and in its MQTT reports
// (get_artifacts_from_result_data in zuul/lib/result_data.py): the manifest
// first, none while the build runs (Zuul stores them when it ends), and
// metadata left out only when the job returned none. The SQL reporter stores
// returned metadata as its JSON text (_reportBuildEnd in
// zuul/driver/sql/sqlreporter.py), so that an empty one is "{}", which the API
// tests as true, and shows.
func (b *build) artifactsJSON() []any {
	arts := []any{}
	if b.spec.InProgress {
		return arts
	}
	all := b.arts
	if b.manifest != nil {
		all = append([]Artifact{*b.manifest}, all...)
	}
	for _, a := range all {
		o := map[string]any{"name": a.Name, "url": a.published}
		if a.Metadata != nil {
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
	if !spec.timer() && spec.Change == 0 {
		// Stable, commit-id-shaped values derived from the build.
		if spec.Newrev == "" {
			spec.Newrev = sha1Hex(spec.UUID)
		}
		if spec.Oldrev == "" {
			spec.Oldrev = sha1Hex(spec.Newrev)
		}
	}
	s.mu.Lock()
	opts := s.opts
	s.mu.Unlock()
	b := &build{
		spec:      spec,
		buildset:  newUUID(),
		eventID:   newUUID(),
		itemUUID:  newUUID(),
		jobUUID:   newUUID(),
		logURL:    s.url + "/logs/" + spec.UUID + "/",
		triggered: spec.StartTime.Add(-2 * time.Second),
		enqueued:  spec.StartTime.Add(-time.Second),
	}
	files := map[string]*file{}
	for i, as := range spec.Artifacts {
		f, art, err := s.prepareArtifact(b.logURL, spec.UUID, as, as.OnObjectStore || opts.ObjectStore, spec.EndTime)
		if err != nil {
			return Build{}, fmt.Errorf("add build %s: artifact %d (%s): %w", spec.UUID, i, as.Name, err)
		}
		files[art.Path] = f
		b.arts = append(b.arts, art)
	}
	if !opts.NoManifest {
		f, art, err := s.prepareArtifact(b.logURL, spec.UUID, manifestSpec(b.arts, files, spec.EndTime), false, spec.EndTime)
		if err != nil {
			return Build{}, fmt.Errorf("add build %s: the Zuul manifest: %w", spec.UUID, err)
		}
		f.ctype = "application/json"
		files[art.Path] = f
		b.manifest = &art
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
	if b.manifest != nil {
		m := *b.manifest
		m.Metadata = maps.Clone(m.Metadata)
		out.Manifest = &m
	}
	return out, nil
}

func sha1Hex(s string) string {
	sum := sha1.Sum([]byte(s))
	return hex.EncodeToString(sum[:])
}

// timer tells whether the build ran on the timer trigger's ref: a branch
// build of a periodic pipeline.
func (sp BuildSpec) timer() bool {
	return sp.Change == 0 && strings.HasPrefix(sp.Pipeline, "periodic")
}

// manifestSpec is the artifact zuul-jobs' generate-zuul-manifest role returns:
// "Zuul Manifest", zuul-manifest.json relative to the log URL, of type
// zuul_manifest, listing the files of the log directory (its
// generate_manifest.py: a tree of name, mimetype, encoding, last_modified and
// size).
func manifestSpec(arts []Artifact, files map[string]*file, mod time.Time) ArtifactSpec {
	if mod.IsZero() {
		mod = time.Now()
	}
	tree := []any{}
	for _, a := range arts {
		f := files[a.Path]
		if f == nil || f.onStore {
			continue
		}
		tree = append(tree, map[string]any{"name": f.name, "mimetype": "application/octet-stream",
			"encoding": nil, "last_modified": mod.Unix(), "size": a.ServedSize})
	}
	data, _ := json.Marshal(map[string]any{"tree": tree, "index_links": false})
	return ArtifactSpec{Name: "Zuul Manifest", File: "zuul-manifest.json", Data: data, Relative: true,
		Metadata: map[string]any{"type": "zuul_manifest"}, MetadataAsIs: true}
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

// reviewURL is the web root of the stand-in's Gerrit: refs and changes link there.
const reviewURL = "https://review.example.com"

// refJSON is the ref the build ran on, as Zuul's RefConverter.toDict
// (zuul/web/__init__.py) shows a row of its ref table: the Gerrit driver's
// change number (an integer column) and patchset, or a branch's revisions, with
// what the SQL reporter stores as 0 or "" shown as null (ChangeType and SHAType
// in zuul/driver/sql/sqlconnection.py). A branch ref's ref_url is the Gerrit
// driver's default gitweb link of its newrev, which Python formats as "None"
// when there is none (_getBranch and _getWebUrl in
// zuul/driver/gerrit/gerritconnection.py).
func (b *build) refJSON() map[string]any {
	sp := b.spec
	if sp.Change > 0 {
		return map[string]any{
			"project":  sp.Project,
			"branch":   sp.Branch,
			"change":   sp.Change,
			"patchset": orNull(sp.Patchset),
			"ref":      changeRef(sp.Change, sp.Patchset),
			"oldrev":   nil,
			"newrev":   nil,
			"ref_url":  fmt.Sprintf("%s/%d", reviewURL, sp.Change),
		}
	}
	return map[string]any{
		"project":  sp.Project,
		"branch":   sp.Branch,
		"change":   nil,
		"patchset": nil,
		"ref":      "refs/heads/" + sp.Branch,
		"oldrev":   orNull(sp.Oldrev),
		"newrev":   orNull(sp.Newrev),
		"ref_url":  gitwebURL(sp.Project, sp.Newrev),
	}
}

func changeRef(change int, patchset string) string {
	return fmt.Sprintf("refs/changes/%02d/%d/%s", change%100, change, patchset)
}

func gitwebURL(project, sha string) string {
	if sha == "" {
		sha = "None"
	}
	return fmt.Sprintf("%s/gitweb?p=%s.git;a=commitdiff;h=%s", reviewURL, project, sha)
}

// json renders the build as the builds list shows it, in the given shape:
// Shape10 as BuildConverter.toDict(build, buildset, skip_refs=True) in
// zuul/web/__init__.py (the ref nested, the buildset its uuid alone), Shape9
// as Zuul 9.5's buildToDict (the ref's fields on the build). Until the build
// ends, Zuul's database has only what it knew when the build started: no
// result, end time, log URL, final, held or artifacts (_createBuild and
// _reportBuildEnd in zuul/driver/sql/sqlreporter.py).
func (b *build) json(shape int) map[string]any {
	sp := b.spec
	var duration, result, logURL, final, held any
	if !sp.InProgress {
		duration = sp.EndTime.Sub(sp.StartTime).Seconds()
		result = sp.Result
		logURL = b.logURL
		final = !sp.NonFinal
		held = false
	}
	out := map[string]any{
		"_id":             b.id,
		"uuid":            sp.UUID,
		"job_name":        sp.Job,
		"result":          result,
		"held":            held,
		"start_time":      zuulTime(sp.StartTime),
		"end_time":        zuulTime(sp.EndTime),
		"duration":        duration,
		"voting":          true,
		"log_url":         logURL,
		"nodeset":         "ubuntu-noble",
		"error_detail":    nil,
		"final":           final,
		"artifacts":       b.artifactsJSON(),
		"provides":        []any{},
		"pipeline":        sp.Pipeline,
		"event_id":        b.eventID,
		"event_timestamp": zuulTime(b.triggered),
		"buildset":        map[string]any{"uuid": b.buildset},
	}
	ref := b.refJSON()
	if shape == Shape9 {
		for k, v := range ref {
			out[k] = v
		}
	} else {
		out["ref"] = ref
	}
	return out
}

// buildsParams are the query parameters of zuul-web's builds endpoint
// (ZuulWebAPI.builds in zuul/web/__init__.py); CherryPy answers 404 to any
// other.
var buildsParams = []string{
	"project", "pipeline", "change", "branch", "patchset", "ref", "newrev",
	"uuid", "job_name", "voting", "nodeset", "result", "final", "held",
	"complete", "limit", "skip", "idx_min", "idx_max", "exclude_result",
}

// filter is a builds query as Zuul's database applies it (getBuilds in
// zuul/driver/sql/sqlconnection.py).
type filter struct {
	q url.Values
	// fold compares names regardless of case, as MySQL's and MariaDB's
	// default collations do, with = and LIKE alike.
	fold bool
	// final and complete are nil when not asked.
	final, complete *bool
	idxMin, idxMax  *int64
}

// eq compares two values as the database's = does.
func (f *filter) eq(a, b string) bool {
	if f.fold {
		return strings.EqualFold(a, b)
	}
	return a == b
}

// like matches v as _getFuzzyFilterOp does: a LIKE with "*" made "%" when the
// pattern holds one ("%" and "_" escaped, so only "*" is special), else =.
func (f *filter) like(pattern, v string) bool {
	if !strings.Contains(pattern, "*") {
		return f.eq(pattern, v)
	}
	if f.fold {
		pattern, v = strings.ToLower(pattern), strings.ToLower(v)
	}
	parts := strings.Split(pattern, "*")
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

// fuzzy is listFilterFuzzy: any of the patterns, none meaning any value.
func (f *filter) fuzzy(name, v string) bool {
	ps := f.q[name]
	return len(ps) == 0 || slices.ContainsFunc(ps, func(p string) bool { return f.like(p, v) })
}

// exact is listFilter: one of the values (IN), none meaning any; a NULL
// column (v nil) matches nothing.
func (f *filter) exact(name string, v *string) bool {
	vs := f.q[name]
	return len(vs) == 0 || v != nil && slices.ContainsFunc(vs, func(w string) bool { return f.eq(w, *v) })
}

// excluded is exListFilter: NOT IN the values, which a NULL column is not
// either.
func (f *filter) excluded(name string, v *string) bool {
	vs := f.q[name]
	return len(vs) > 0 && (v == nil || slices.ContainsFunc(vs, func(w string) bool { return f.eq(w, *v) }))
}

func ptr(s string) *string { return &s }

// matches tells whether Zuul's database selects b for the query.
func (f *filter) matches(b *build) bool {
	sp := b.spec
	var result, change, patchset, newrev *string
	if !sp.InProgress {
		result = ptr(sp.Result)
	}
	// The ref's columns hold 0 and "" for none, which = finds (ChangeType,
	// SHAType).
	change, patchset, newrev = ptr("0"), ptr(""), ptr(sp.Newrev)
	ref := "refs/heads/" + sp.Branch
	if sp.Change > 0 {
		change, patchset, newrev = ptr(strconv.Itoa(sp.Change)), ptr(sp.Patchset), ptr("")
		ref = changeRef(sp.Change, sp.Patchset)
	}
	switch {
	case !f.fuzzy("pipeline", sp.Pipeline), !f.fuzzy("project", sp.Project),
		!f.fuzzy("branch", sp.Branch), !f.fuzzy("job_name", sp.Job),
		!f.exact("change", change), !f.exact("patchset", patchset),
		!f.exact("ref", &ref), !f.exact("newrev", newrev),
		!f.exact("uuid", &sp.UUID), !f.exact("nodeset", ptr("ubuntu-noble")),
		!f.exact("result", result), f.excluded("exclude_result", result):
		// voting and held are taken but not applied: nothing here asks.
		return false
	case f.final != nil && (sp.InProgress || *f.final == sp.NonFinal):
		// final is NULL until the build ends.
		return false
	case f.complete != nil && *f.complete == sp.InProgress:
		return false
	case f.idxMin != nil && b.id < *f.idxMin, f.idxMax != nil && b.id > *f.idxMax:
		return false
	}
	return true
}

// pyInt parses a number as Python's int() does a query parameter.
func pyInt(s string) (int64, error) {
	return strconv.ParseInt(strings.ReplaceAll(strings.TrimSpace(s), "_", ""), 10, 64)
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
		errorPage(w, failCode, internalError)
		return
	}
	if !s.tenantAnswers(w, r, tenant, root, opts) {
		return
	}

	q := r.URL.Query()
	for k := range q {
		if !slices.Contains(buildsParams, k) {
			// CherryPy names them only outside its production
			// environment, which zuul-web runs in.
			errorPage(w, http.StatusNotFound, "Nothing matches the given URI")
			return
		}
	}
	f, code, msg := parseFilter(q, !opts.PostgreSQL)
	if code != 0 {
		errorPage(w, code, msg)
		return
	}
	// The database refuses what is not a count (SQLAlchemy's int() of limit
	// and offset, or a negative LIMIT): an exception, so a 500.
	limit, skip := int64(50), int64(0)
	for name, dst := range map[string]*int64{"limit": &limit, "skip": &skip} {
		if vs, ok := q[name]; ok {
			n, err := pyInt(vs[0])
			if len(vs) > 1 || err != nil || n < 0 {
				errorPage(w, http.StatusInternalServerError, internalError)
				return
			}
			*dst = n
		}
	}

	s.mu.Lock()
	selected := []map[string]any{}
	for i := len(s.builds) - 1; i >= 0; i-- { // newest first by _id
		b := s.builds[i]
		if !opts.IgnoreFilters && !f.matches(b) {
			continue
		}
		if skip > 0 {
			skip--
			continue
		}
		if int64(len(selected)) >= limit && !opts.IgnoreLimit {
			break
		}
		selected = append(selected, b.json(opts.Shape))
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, selected)
}

// internalError is CherryPy's message of a 500.
const internalError = "The server encountered an unexpected condition which prevented it from fulfilling the request."

// parseFilter reads the query as zuul-web's builds endpoint does: final and
// complete are true when they say "true" in any case and false otherwise,
// idx_min and idx_max must be integers (400). A repeated parameter that the
// endpoint takes as one value fails there (a 500). code is 0 when it is fine.
func parseFilter(q url.Values, fold bool) (f *filter, code int, msg string) {
	f = &filter{q: q, fold: fold}
	for name, dst := range map[string]**bool{"final": &f.final, "complete": &f.complete} {
		if vs, ok := q[name]; ok {
			if len(vs) > 1 {
				return nil, http.StatusInternalServerError, internalError
			}
			v := strings.ToLower(vs[0]) == "true"
			*dst = &v
		}
	}
	for name, dst := range map[string]**int64{"idx_min": &f.idxMin, "idx_max": &f.idxMax} {
		if vs, ok := q[name]; ok {
			if len(vs) > 1 {
				return nil, http.StatusInternalServerError, internalError
			}
			n, err := pyInt(vs[0])
			if err != nil {
				return nil, http.StatusBadRequest, "idx_min, idx_max must be integers"
			}
			*dst = &n
		}
	}
	return f, 0, ""
}

// authorized checks the bearer token like Zuul does for a tenant with
// access rules, answering 401 or 403 itself when it fails.
// tenantAnswers tells whether the tenant of a tenant-scoped endpoint (the
// tenant's path, or the root of a white-labelled one) answers the request,
// and writes zuul-web's answer when it does not: the path not routed, an
// unknown tenant, a tenant not loaded yet, a token missing or refused.
func (s *Server) tenantAnswers(w http.ResponseWriter, r *http.Request, tenant string, root bool, opts ServerOptions) bool {
	if root != opts.WhiteLabel {
		errorPage(w, http.StatusNotFound, "Nothing matches the given URI")
		return false
	}
	if root {
		tenant = opts.Tenant
	}
	if tenant != opts.Tenant {
		errorPage(w, http.StatusNotFound, "Unknown tenant")
		return false
	}
	if opts.Unloaded {
		errorPage(w, http.StatusUnprocessableEntity, fmt.Sprintf("Tenant %s isn't ready", tenant))
		return false
	}
	return opts.Token == "" || s.authorized(w, r, opts)
}

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
