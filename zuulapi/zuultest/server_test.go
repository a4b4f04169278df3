package zuultest

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
)

func get(t *testing.T, method, u string, header map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read %s: %v", u, err)
	}
	return resp, body
}

func mustAdd(t *testing.T, s *Server, spec BuildSpec) Build {
	t.Helper()
	b, err := s.AddBuild(spec)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func uuids(t *testing.T, body []byte) []string {
	t.Helper()
	var builds []struct {
		UUID string `json:"uuid"`
	}
	if err := json.Unmarshal(body, &builds); err != nil {
		t.Fatalf("decode builds %s: %v", body, err)
	}
	out := []string{}
	for _, b := range builds {
		out = append(out, b.UUID)
	}
	return out
}

// TestBuildsFilters: the builds API selects as Zuul's getBuilds does on MySQL.
func TestBuildsFilters(t *testing.T) {
	s := NewServer(ServerOptions{Tenant: "t1"})
	defer s.Close()
	specs := []BuildSpec{
		{UUID: "a", Job: "build-debian", Project: "org/images", Pipeline: "periodic"},
		{UUID: "b", Job: "build-debian", Project: "org/images", Pipeline: "post", Result: "FAILURE"},
		{UUID: "c", Job: "build-ubuntu", Project: "org/images", Pipeline: "periodic", Branch: "stable"},
		{UUID: "d", Job: "build-debian", Project: "org/other", Pipeline: "gate"},
		{UUID: "e", Job: "build-debian", Project: "org/images", Pipeline: "periodic", InProgress: true},
		{UUID: "f", Job: "build-debian", Project: "org/images", Pipeline: "post", NonFinal: true},
	}
	for _, sp := range specs {
		mustAdd(t, s, sp)
	}
	tests := []struct {
		query string
		want  []string
	}{
		{"", []string{"f", "e", "d", "c", "b", "a"}},
		{"project=org/images", []string{"f", "e", "c", "b", "a"}},
		{"project=org/images&project=org/other", []string{"f", "e", "d", "c", "b", "a"}},
		{"job_name=build-debian&pipeline=periodic&pipeline=post", []string{"f", "e", "b", "a"}},
		{"job_name=build-*", []string{"f", "e", "d", "c", "b", "a"}},
		{"branch=stable", []string{"c"}},
		{"result=SUCCESS", []string{"f", "d", "c", "a"}},
		{"result=SUCCESS&result=FAILURE&project=org/images", []string{"f", "c", "b", "a"}},
		// NOT IN leaves out the running build, whose result is NULL.
		{"exclude_result=SUCCESS", []string{"b"}},
		{"exclude_result=SUCCESS&exclude_result=FAILURE", []string{}},
		{"complete=true&job_name=build-debian", []string{"f", "d", "b", "a"}},
		{"complete=false", []string{"e"}},
		{"complete=", []string{"e"}},
		{"complete=TRUE&project=org/images", []string{"f", "c", "b", "a"}},
		{"final=true&pipeline=post", []string{"b"}},
		// final is NULL while a build runs: it is neither final nor not.
		{"final=true&job_name=build-debian", []string{"d", "b", "a"}},
		{"final=false", []string{"f"}},
		{"final=yes", []string{"f"}},
		{"uuid=c", []string{"c"}},
		{"uuid=C", []string{"c"}},
		{"uuid=c*", []string{}},
		// Only project, pipeline, branch and job_name take "*", anywhere.
		{"result=SUCC*", []string{}},
		{"job_name=*-debian&pipeline=p*c", []string{"e", "a"}},
		{"job_name=build*ian&project=*/*", []string{"f", "e", "d", "b", "a"}},
		{"job_name=build-%25", []string{}},
		{"job_name=build_debian", []string{}},
		// MySQL matches names regardless of case.
		{"project=ORG/Images&branch=MASTER", []string{"f", "e", "b", "a"}},
		{"job_name=BUILD-*&pipeline=Periodic", []string{"e", "c", "a"}},
		{"result=success", []string{"f", "d", "c", "a"}},
		{"ref=refs/heads/stable", []string{"c"}},
		{"change=0&newrev=", []string{"e", "c", "a"}},
		{"idx_min=2&idx_max=4", []string{"d", "c", "b"}},
		{"limit=2", []string{"f", "e"}},
		{"limit=2&skip=2", []string{"d", "c"}},
		{"skip=5", []string{"a"}},
		{"skip=9", []string{}},
	}
	for _, tt := range tests {
		t.Run(tt.query, func(t *testing.T) {
			resp, body := get(t, "GET", s.URL()+"/api/tenant/t1/builds?"+tt.query, nil)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			if got := uuids(t, body); !slices.Equal(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

// TestBuildsFiltersPostgreSQL: on PostgreSQL, Zuul's filters match names with
// their case, = as LIKE.
func TestBuildsFiltersPostgreSQL(t *testing.T) {
	s := NewServer(ServerOptions{PostgreSQL: true})
	defer s.Close()
	mustAdd(t, s, BuildSpec{UUID: "a", Project: "org/images"})
	mustAdd(t, s, BuildSpec{UUID: "b", Project: "Org/Images"})
	for query, want := range map[string][]string{
		"project=org/images": {"a"},
		"project=Org/Images": {"b"},
		"project=ORG/*":      {},
		"project=*/images":   {"a"},
		"result=success":     {},
	} {
		_, body := get(t, "GET", s.URL()+"/api/tenant/example/builds?"+query, nil)
		if got := uuids(t, body); !slices.Equal(got, want) {
			t.Errorf("%s: got %v, want %v", query, got, want)
		}
	}
}

// TestBuildsIgnoreFilters: a hostile Zuul answers every build whatever the
// query's filters, within limit and skip.
func TestBuildsIgnoreFilters(t *testing.T) {
	s := NewServer(ServerOptions{Tenant: "t1", IgnoreFilters: true})
	defer s.Close()
	mustAdd(t, s, BuildSpec{UUID: "a", Job: "build-debian", Project: "org/images"})
	mustAdd(t, s, BuildSpec{UUID: "b", Job: "build-evil", Project: "org/evil", Pipeline: "check", Result: "FAILURE", NonFinal: true})
	mustAdd(t, s, BuildSpec{UUID: "c", InProgress: true})
	query := "/api/tenant/t1/builds?project=org/images&job_name=build-debian&pipeline=periodic&result=SUCCESS&complete=true"
	for _, tt := range []struct {
		ignore bool
		page   string
		want   []string
	}{
		{true, "", []string{"c", "b", "a"}},
		{true, "&limit=1&skip=1", []string{"b"}},
		{false, "", []string{"a"}},
	} {
		s.SetIgnoreFilters(tt.ignore)
		_, body := get(t, "GET", s.URL()+query+tt.page, nil)
		if got := uuids(t, body); !slices.Equal(got, tt.want) {
			t.Errorf("ignore filters %v%s: got %v, want %v", tt.ignore, tt.page, got, tt.want)
		}
	}
}

// TestProjectEndpoint: the project endpoint answers as zuul-web's: a project
// the tenant knows, by its name or its canonical name, with their case, as
// Project.toDict and the metadata of its project stanza show it; any other
// name is a 404, whatever the builds API's filters match. A hostile Zuul
// answers its own fields for any name.
func TestProjectEndpoint(t *testing.T) {
	s := NewServer(ServerOptions{})
	defer s.Close()
	mustAdd(t, s, BuildSpec{Project: "org/images"})
	want := map[string]any{
		"name": "org/images", "connection_name": "gerrit", "canonical_name": "review.example.com/org/images",
		"configs":  []any{},
		"metadata": map[string]any{"merge_mode": "merge-resolve", "default_branch": "master", "is_template": false, "queue_name": nil},
	}
	for _, asked := range []string{"org/images", "review.example.com/org/images"} {
		resp, body := get(t, "GET", s.URL()+"/api/tenant/example/project/"+asked, nil)
		var got map[string]any
		if err := json.Unmarshal(body, &got); resp.StatusCode != http.StatusOK || err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%s: %d %s (%v); want %v", asked, resp.StatusCode, body, err, want)
		}
	}
	for _, asked := range []string{"Org/Images", "review.example.com/ORG/images", "git.example.org/org/images", "org/*", "*"} {
		if resp, body := get(t, "GET", s.URL()+"/api/tenant/example/project/"+asked, nil); resp.StatusCode != http.StatusNotFound ||
			!strings.Contains(string(body), "<p>Unknown project</p>") {
			t.Errorf("%s: %d %s; want 404 Unknown project", asked, resp.StatusCode, body)
		}
	}
	s.SetProjectAnswer(map[string]string{"name": "*"})
	resp, body := get(t, "GET", s.URL()+"/api/tenant/example/project/evil/other", nil)
	var got map[string]any
	if err := json.Unmarshal(body, &got); resp.StatusCode != http.StatusOK || err != nil || got["name"] != "*" ||
		got["canonical_name"] != "review.example.com/evil/other" {
		t.Errorf("hostile: %d %s (%v); want name * for any project", resp.StatusCode, body, err)
	}
}

func TestBuildsDefaultLimit(t *testing.T) {
	s := NewServer(ServerOptions{})
	defer s.Close()
	for range 55 {
		mustAdd(t, s, BuildSpec{})
	}
	_, body := get(t, "GET", s.URL()+"/api/tenant/example/builds", nil)
	if n := len(uuids(t, body)); n != 50 {
		t.Errorf("got %d builds without limit, want Zuul's default of 50", n)
	}
}

// buildsJSON returns the builds the server answers, decoded.
func buildsJSON(t *testing.T, s *Server, query string) []map[string]any {
	t.Helper()
	_, body := get(t, "GET", s.URL()+"/api/tenant/"+s.Tenant()+"/builds"+query, nil)
	var builds []map[string]any
	if err := json.Unmarshal(body, &builds); err != nil {
		t.Fatalf("decode builds %s: %v", body, err)
	}
	return builds
}

func keys(m map[string]any) []string {
	out := slices.Collect(maps.Keys(m))
	slices.Sort(out)
	return out
}

// TestBuildShapes: a build carries the fields of zuul-web's builds list, with
// its ref nested (Zuul 10 and later, BuildConverter.toDict with skip_refs) or
// flat on the build (Zuul 9.5's buildToDict), and its buildset as its uuid.
func TestBuildShapes(t *testing.T) {
	s := NewServer(ServerOptions{})
	defer s.Close()
	end := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	mustAdd(t, s, BuildSpec{UUID: "u1", Project: "org/images", Branch: "main", EndTime: end, StartTime: end.Add(-time.Minute)})
	mustAdd(t, s, BuildSpec{UUID: "u2", Change: 1234, Patchset: "3", Pipeline: "check"})
	common := []string{"_id", "artifacts", "buildset", "duration", "end_time", "error_detail", "event_id", "event_timestamp",
		"final", "held", "job_name", "log_url", "nodeset", "pipeline", "provides", "ref", "result", "start_time", "uuid", "voting"}
	flat := append(slices.Clone(common), "branch", "change", "newrev", "oldrev", "patchset", "project", "ref_url")
	slices.Sort(flat)

	for _, shape := range []int{Shape9, Shape10} {
		s.SetShape(shape)
		builds := buildsJSON(t, s, "")
		if len(builds) != 2 {
			t.Fatalf("shape %d: got %d builds", shape, len(builds))
		}
		change, branchBuild := builds[0], builds[1]
		want := common
		if shape == Shape9 {
			want = flat
		}
		for _, b := range builds {
			if got := keys(b); !slices.Equal(got, want) {
				t.Errorf("shape %d: fields %v, want %v", shape, got, want)
			}
		}
		if branchBuild["end_time"] != "2024-05-06T07:08:09" || branchBuild["start_time"] != "2024-05-06T07:07:09" {
			t.Errorf("shape %d: times %v %v", shape, branchBuild["start_time"], branchBuild["end_time"])
		}
		if branchBuild["duration"] != 60.0 || branchBuild["_id"] != 1.0 {
			t.Errorf("shape %d: duration %v _id %v", shape, branchBuild["duration"], branchBuild["_id"])
		}
		ref := branchBuild
		changeRef := change
		if shape == Shape10 {
			var ok bool
			if ref, ok = branchBuild["ref"].(map[string]any); !ok {
				t.Fatalf("shape 10: ref is %T, want an object", branchBuild["ref"])
			}
			changeRef = change["ref"].(map[string]any)
		} else if r, ok := branchBuild["ref"].(string); !ok || r != "refs/heads/main" {
			t.Errorf("shape 9: ref is %#v, want the string refs/heads/main", branchBuild["ref"])
		}
		if ref["project"] != "org/images" || ref["branch"] != "main" || ref["change"] != nil {
			t.Errorf("shape %d: branch ref %v", shape, ref)
		}
		if changeRef["change"] != 1234.0 || changeRef["patchset"] != "3" {
			t.Errorf("shape %d: change ref %v", shape, changeRef)
		}
		if bs, ok := branchBuild["buildset"].(map[string]any); !ok || len(bs) != 1 || !zuulUUID(bs["uuid"]) {
			t.Errorf("shape %d: buildset %v, want its uuid alone", shape, branchBuild["buildset"])
		}
	}
}

func zuulUUID(v any) bool {
	s, ok := v.(string)
	if !ok || len(s) != 32 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// TestBuildRefsAndStates: each kind of build has the ref and the values
// zuul-web gives it: the timer's branch ref without revisions, a ref-updated
// branch ref with both, a Gerrit change; and a running build, of which Zuul's
// database knows no result, end, log URL, final, held or artifacts yet.
func TestBuildRefsAndStates(t *testing.T) {
	s := NewServer(ServerOptions{})
	defer s.Close()
	gitweb := "https://review.example.com/gitweb?p=org/images.git;a=commitdiff;h="
	art := []ArtifactSpec{{Name: "qcow2 image", Data: []byte("q")}}
	tests := []struct {
		name  string
		spec  BuildSpec
		ref   map[string]any
		build map[string]any
	}{
		{
			name: "periodic",
			spec: BuildSpec{Pipeline: "periodic", Artifacts: art},
			ref: map[string]any{"project": "org/images", "branch": "master", "change": nil, "patchset": nil,
				"ref": "refs/heads/master", "oldrev": nil, "newrev": nil, "ref_url": gitweb + "None"},
			build: map[string]any{"result": "SUCCESS", "final": true, "held": false, "voting": true, "error_detail": nil},
		},
		{
			name: "periodic with a newrev given",
			spec: BuildSpec{Pipeline: "periodic-weekly", Newrev: "c0ffee"},
			ref: map[string]any{"project": "org/images", "branch": "master", "change": nil, "patchset": nil,
				"ref": "refs/heads/master", "oldrev": nil, "newrev": "c0ffee", "ref_url": gitweb + "c0ffee"},
		},
		{
			name: "post",
			spec: BuildSpec{Pipeline: "post", Oldrev: "0ld", Newrev: "c0ffee"},
			ref: map[string]any{"project": "org/images", "branch": "master", "change": nil, "patchset": nil,
				"ref": "refs/heads/master", "oldrev": "0ld", "newrev": "c0ffee", "ref_url": gitweb + "c0ffee"},
		},
		{
			name: "check",
			spec: BuildSpec{Pipeline: "check", Change: 1234, Patchset: "3", Result: "FAILURE"},
			ref: map[string]any{"project": "org/images", "branch": "master", "change": 1234.0, "patchset": "3",
				"ref": "refs/changes/34/1234/3", "oldrev": nil, "newrev": nil, "ref_url": "https://review.example.com/1234"},
			build: map[string]any{"result": "FAILURE", "final": true},
		},
		{
			name:  "retried",
			spec:  BuildSpec{Pipeline: "periodic", NonFinal: true, Result: "ERROR"},
			build: map[string]any{"result": "ERROR", "final": false, "held": false},
		},
		{
			name: "running",
			spec: BuildSpec{Pipeline: "periodic", InProgress: true, Artifacts: art},
			build: map[string]any{"result": nil, "final": nil, "held": nil, "end_time": nil, "duration": nil,
				"log_url": nil, "artifacts": []any{}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := mustAdd(t, s, tt.spec)
			got := buildsJSON(t, s, "?uuid="+b.UUID)
			if len(got) != 1 {
				t.Fatalf("%d builds", len(got))
			}
			if ref := got[0]["ref"].(map[string]any); tt.ref != nil && !reflect.DeepEqual(ref, tt.ref) {
				t.Errorf("ref %v\nwant %v", ref, tt.ref)
			}
			for k, v := range tt.build {
				if !reflect.DeepEqual(got[0][k], v) {
					t.Errorf("%s is %#v, want %#v", k, got[0][k], v)
				}
			}
		})
	}

	// A post build's revisions default to commit ids.
	b := mustAdd(t, s, BuildSpec{Pipeline: "post"})
	ref := buildsJSON(t, s, "?uuid="+b.UUID)[0]["ref"].(map[string]any)
	for _, k := range []string{"oldrev", "newrev"} {
		if v, _ := ref[k].(string); len(v) != 40 {
			t.Errorf("a post build's %s is %v, want a commit id", k, ref[k])
		}
	}
	if ref["ref_url"] != gitweb+ref["newrev"].(string) {
		t.Errorf("ref_url %v", ref["ref_url"])
	}
}

func TestTenantsAndAuth(t *testing.T) {
	s := NewServer(ServerOptions{Tenant: "t1", Token: "good", ForbiddenToken: "nope"})
	defer s.Close()
	mustAdd(t, s, BuildSpec{})
	builds := s.URL() + "/api/tenant/t1/builds"
	tests := []struct {
		name       string
		url        string
		auth       string
		wantStatus int
		wantError  string // the "error" of a 401 body
	}{
		{"ok", builds, "Bearer good", 200, ""},
		{"lower-case scheme", builds, "bearer good", 200, ""},
		{"missing", builds, "", 401, "MissingAuthError"},
		{"not bearer", builds, "Basic Zm9vOmJhcg==", 401, "InvalidAuthFormat"},
		{"wrong", builds, "Bearer bad", 401, "AuthTokenInvalidSignatureException"},
		{"forbidden", builds, "Bearer nope", 403, ""},
		{"unknown tenant", s.URL() + "/api/tenant/t2/builds", "Bearer good", 404, ""},
		{"unexpected parameter", builds + "?job=x", "Bearer good", 404, ""},
		{"bad limit", builds + "?limit=x", "Bearer good", 500, ""},
		{"root builds on a multi-tenant root", s.URL() + "/api/builds", "Bearer good", 404, ""},
		{"bad idx_min", builds + "?idx_min=x", "Bearer good", 400, ""},
		{"negative skip", builds + "?skip=-1", "Bearer good", 500, ""},
		{"limit twice", builds + "?limit=1&limit=2", "Bearer good", 500, ""},
		{"final twice", builds + "?final=true&final=true", "Bearer good", 500, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hdr := map[string]string{}
			if tt.auth != "" {
				hdr["Authorization"] = tt.auth
			}
			resp, body := get(t, "GET", tt.url, hdr)
			if resp.StatusCode != tt.wantStatus {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.wantStatus, body)
			}
			if tt.wantError == "" {
				return
			}
			var doc map[string]string
			if err := json.Unmarshal(body, &doc); err != nil {
				t.Fatalf("401 body %s: %v", body, err)
			}
			if doc["error"] != tt.wantError || doc["realm"] != "t1" || doc["description"] == "" {
				t.Errorf("401 body %v", doc)
			}
			if !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer realm=") {
				t.Errorf("WWW-Authenticate %q", resp.Header.Get("WWW-Authenticate"))
			}
		})
	}

	calls := s.BuildsCalls()
	if len(calls) != len(tests) {
		t.Fatalf("logged %d builds calls, want %d", len(calls), len(tests))
	}
	if calls[0].Authorization != "Bearer good" || calls[2].Authorization != "" {
		t.Errorf("logged authorizations %q, %q", calls[0].Authorization, calls[2].Authorization)
	}
	if calls[7].Query.Get("job") != "x" {
		t.Errorf("logged query %v", calls[7].Query)
	}
	// zuul-web runs CherryPy in its production environment, which does not
	// name the parameters it does not know.
	if _, body := get(t, "GET", builds+"?job=x", map[string]string{"Authorization": "Bearer good"}); !bytes.Contains(body, []byte("<p>Nothing matches the given URI</p>")) {
		t.Errorf("an unknown parameter answered %s", body)
	}

	s.SetToken("")
	if resp, _ := get(t, "GET", builds, map[string]string{"Authorization": "Bearer whatever"}); resp.StatusCode != 200 {
		t.Errorf("public tenant answered %d to an unknown token, want 200 as Zuul ignores it", resp.StatusCode)
	}
	s.SetUnloaded(true)
	if resp, body := get(t, "GET", builds, nil); resp.StatusCode != 422 || !bytes.Contains(body, []byte("isn't ready")) {
		t.Errorf("unloaded tenant answered %d %s", resp.StatusCode, body)
	}
	s.SetUnloaded(false)
	s.FailBuilds(2, 500)
	for i, want := range []int{500, 500, 200} {
		if resp, _ := get(t, "GET", builds, nil); resp.StatusCode != want {
			t.Errorf("request %d after FailBuilds: %d, want %d", i, resp.StatusCode, want)
		}
	}
}

func TestInfoAndWhiteLabel(t *testing.T) {
	s := NewServer(ServerOptions{Tenant: "t1"})
	defer s.Close()
	mustAdd(t, s, BuildSpec{UUID: "x"})
	tenantOf := func(path string) (int, any) {
		resp, body := get(t, "GET", s.URL()+path, nil)
		if resp.StatusCode != 200 {
			return resp.StatusCode, nil
		}
		var doc struct {
			Info map[string]any `json:"info"`
		}
		if err := json.Unmarshal(body, &doc); err != nil || doc.Info == nil {
			t.Fatalf("info %s: %v", body, err)
		}
		if _, ok := doc.Info["capabilities"]; !ok {
			t.Errorf("info without capabilities: %s", body)
		}
		return 200, doc.Info["tenant"]
	}
	if code, tenant := tenantOf("/api/info"); code != 200 || tenant != nil {
		t.Errorf("multi-tenant /api/info: %d tenant %v", code, tenant)
	}
	if code, tenant := tenantOf("/api/tenant/t1/info"); code != 200 || tenant != "t1" {
		t.Errorf("tenant info: %d tenant %v", code, tenant)
	}

	s.SetWhiteLabel(true)
	if code, tenant := tenantOf("/api/info"); code != 200 || tenant != "t1" {
		t.Errorf("white-label /api/info: %d tenant %v", code, tenant)
	}
	if code, _ := tenantOf("/api/tenant/t1/info"); code != 404 {
		t.Errorf("white-label tenant info: %d, want 404", code)
	}
	if resp, body := get(t, "GET", s.URL()+"/api/builds", nil); resp.StatusCode != 200 || !slices.Equal(uuids(t, body), []string{"x"}) {
		t.Errorf("white-label /api/builds: %d %s", resp.StatusCode, body)
	}
	if resp, _ := get(t, "GET", s.URL()+"/api/tenant/t1/builds", nil); resp.StatusCode != 404 {
		t.Errorf("white-label /api/tenant/t1/builds: %d, want 404", resp.StatusCode)
	}
}

func publishedArtifacts(t *testing.T, s *Server) []map[string]any {
	t.Helper()
	_, body := get(t, "GET", s.URL()+"/api/tenant/"+s.Tenant()+"/builds", nil)
	var builds []struct {
		Artifacts []map[string]any `json:"artifacts"`
	}
	if err := json.Unmarshal(body, &builds); err != nil || len(builds) == 0 {
		t.Fatalf("builds %s: %v", body, err)
	}
	return builds[0].Artifacts
}

func TestArtifactRangeHeadAndCounters(t *testing.T) {
	s := NewServer(ServerOptions{})
	defer s.Close()
	data := []byte("0123456789abcdefghijklmnopqrstuvwxyz")
	b := mustAdd(t, s, BuildSpec{Artifacts: []ArtifactSpec{{Name: "disk image", File: "image.qcow2", Data: data, Metadata: map[string]any{"type": "zuul_image", "format": "qcow2"}}}})
	a := b.Artifacts[0]
	if a.URL != b.LogURL+"image.qcow2" || a.Path != "/logs/"+b.UUID+"/image.qcow2" {
		t.Fatalf("artifact URL %s path %s", a.URL, a.Path)
	}
	sum := sha256.Sum256(data)
	if a.Metadata["sha256"] != hex.EncodeToString(sum[:]) || a.Metadata["type"] != "zuul_image" || a.Size != int64(len(data)) {
		t.Errorf("artifact %+v", a)
	}
	pub := publishedArtifacts(t, s)
	if pub[1]["url"] != a.URL || pub[1]["name"] != "disk image" {
		t.Errorf("published %v", pub[1])
	}

	resp, body := get(t, "GET", a.URL, map[string]string{"Range": "bytes=10-19"})
	if resp.StatusCode != http.StatusPartialContent || string(body) != "abcdefghij" {
		t.Errorf("range: %d %q", resp.StatusCode, body)
	}
	resp, body = get(t, "HEAD", a.URL, nil)
	if resp.StatusCode != 200 || resp.ContentLength != int64(len(data)) || len(body) != 0 {
		t.Errorf("HEAD: %d length %d body %d", resp.StatusCode, resp.ContentLength, len(body))
	}
	resp, body = get(t, "GET", a.URL, nil)
	if resp.StatusCode != 200 || !bytes.Equal(body, data) {
		t.Errorf("GET: %d %q", resp.StatusCode, body)
	}
	if got := s.BytesServed(a.Path); got != 10+int64(len(data)) {
		t.Errorf("BytesServed = %d, want %d", got, 10+len(data))
	}
	if got := s.BytesServed(a.URL); got != 10+int64(len(data)) {
		t.Errorf("BytesServed by URL = %d", got)
	}
	want := []RequestInfo{{"GET", "bytes=10-19", goAgent}, {"HEAD", "", goAgent}, {"GET", "", goAgent}}
	if got := s.ArtifactRequests(a.Path); !slices.Equal(got, want) {
		t.Errorf("ArtifactRequests = %v, want %v", got, want)
	}
	if resp, _ := get(t, "GET", b.LogURL+"missing", nil); resp.StatusCode != 404 {
		t.Errorf("missing file: %d", resp.StatusCode)
	}
}

func TestDropAfter(t *testing.T) {
	s := NewServer(ServerOptions{})
	defer s.Close()
	data := bytes.Repeat([]byte("0123456789"), 10000)
	a := mustAdd(t, s, BuildSpec{Artifacts: []ArtifactSpec{{Name: "image.raw", Data: data}}}).Artifacts[0]
	s.DropAfter(a.Path, 1000)

	// A ranged request is not the one to drop.
	if resp, body := get(t, "GET", a.URL, map[string]string{"Range": "bytes=0-9"}); resp.StatusCode != 206 || len(body) != 10 {
		t.Fatalf("range before drop: %d %d bytes", resp.StatusCode, len(body))
	}

	resp, err := http.Get(a.URL)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("read of a dropped download: err %v, want unexpected EOF", err)
	}
	if len(got) != 1000 || !bytes.Equal(got, data[:1000]) {
		t.Errorf("got %d bytes before the drop, want the first 1000", len(got))
	}

	// Resume where the drop left off; the drop was one-shot.
	resp2, body := get(t, "GET", a.URL, map[string]string{"Range": "bytes=1000-"})
	if resp2.StatusCode != 206 || !bytes.Equal(append(got, body...), data) {
		t.Errorf("resume: %d, %d bytes", resp2.StatusCode, len(body))
	}
	if _, body := get(t, "GET", a.URL, nil); !bytes.Equal(body, data) {
		t.Errorf("second full GET got %d bytes", len(body))
	}
	if got, want := s.BytesServed(a.Path), int64(10+1000+len(data)-1000+len(data)); got != want {
		t.Errorf("BytesServed = %d, want %d", got, want)
	}
}

func decompress(t *testing.T, kind string, data []byte) []byte {
	t.Helper()
	var r io.Reader
	switch kind {
	case "zst":
		d, err := zstd.NewReader(bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		r = d
	case "gz":
		g, err := gzip.NewReader(bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		r = g
	default:
		return data
	}
	out, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("decompress %s: %v", kind, err)
	}
	return out
}

func TestArtifactCompressionAndSources(t *testing.T) {
	content := bytes.Repeat([]byte("nodepool image bytes "), 5000)
	dir := t.TempDir()
	onDisk := filepath.Join(dir, "image.raw")
	if err := os.WriteFile(onDisk, content, 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(content)
	tests := []struct {
		name     string
		spec     ArtifactSpec
		wantFile string
	}{
		{"data plain", ArtifactSpec{Name: "raw", Data: content}, "raw"},
		{"data zst", ArtifactSpec{Name: "image.raw", Data: content, Compress: "zst"}, "image.raw.zst"},
		{"data gz", ArtifactSpec{Name: "image.raw", Data: content, Compress: "gz"}, "image.raw.gz"},
		{"path plain", ArtifactSpec{Name: "image.raw", Path: onDisk}, "image.raw"},
		{"path zst", ArtifactSpec{Name: "image.raw", Path: onDisk, Compress: "zst"}, "image.raw.zst"},
		{"path gz", ArtifactSpec{Name: "image.raw", Path: onDisk, Compress: "gz"}, "image.raw.gz"},
	}
	s := NewServer(ServerOptions{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := mustAdd(t, s, BuildSpec{Artifacts: []ArtifactSpec{tt.spec}}).Artifacts[0]
			if !strings.HasSuffix(a.URL, "/"+tt.wantFile) {
				t.Errorf("URL %s, want it to end in %s", a.URL, tt.wantFile)
			}
			if a.Metadata["sha256"] != hex.EncodeToString(sum[:]) || a.Size != int64(len(content)) {
				t.Errorf("sha256 %v size %d, want those of the uncompressed content", a.Metadata["sha256"], a.Size)
			}
			resp, body := get(t, "GET", a.URL, nil)
			if resp.ContentLength != a.ServedSize || int64(len(body)) != a.ServedSize {
				t.Errorf("Content-Length %d, body %d, ServedSize %d", resp.ContentLength, len(body), a.ServedSize)
			}
			if tt.spec.Compress != "" && a.ServedSize >= a.Size {
				t.Errorf("compressed size %d not below %d", a.ServedSize, a.Size)
			}
			if got := decompress(t, tt.spec.Compress, body); !bytes.Equal(got, content) {
				t.Errorf("served content differs from the original (%d bytes)", len(got))
			}
		})
	}
	var scratch string
	s.mu.Lock()
	scratch = s.tmpDir
	s.mu.Unlock()
	s.Close()
	if scratch == "" {
		t.Fatal("path-backed compression used no scratch directory")
	}
	if _, err := os.Stat(scratch); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("scratch directory %s left after Close: %v", scratch, err)
	}
	if _, err := os.Stat(onDisk); err != nil {
		t.Errorf("the source file must stay: %v", err)
	}
}

func TestArtifactMetadataOverrideAndRelative(t *testing.T) {
	s := NewServer(ServerOptions{})
	defer s.Close()
	b := mustAdd(t, s, BuildSpec{Artifacts: []ArtifactSpec{{
		Name:     "raw image",
		Data:     []byte("abc"),
		Metadata: map[string]any{"sha256": "0000", "type": "image-raw"},
		Relative: true,
	}}})
	a := b.Artifacts[0]
	if a.Metadata["sha256"] != "0000" || a.SHA256 == "0000" {
		t.Errorf("metadata sha256 %v, true sha256 %s", a.Metadata["sha256"], a.SHA256)
	}
	if _, ok := a.Metadata["md5sum"]; !ok {
		t.Errorf("md5sum not filled in: %v", a.Metadata)
	}
	// Zuul joins a relative URL onto the log URL before it stores it.
	pub := publishedArtifacts(t, s)
	if pub[1]["url"] != b.LogURL+"raw%20image" || a.URL != b.LogURL+"raw%20image" {
		t.Errorf("a relative url published as %v, with the URL %s", pub[1]["url"], a.URL)
	}
	if _, body := get(t, "GET", a.URL, nil); string(body) != "abc" {
		t.Errorf("served %q", body)
	}
}

// TestArtifactsJSON: a build's artifacts are listed as Zuul lists them: the
// manifest first, then those of the spec in its order; metadata as the job
// returned it, {} included, and none when it returned none.
func TestArtifactsJSON(t *testing.T) {
	specs := []ArtifactSpec{
		{Name: "raw image", Data: []byte("raw"), Compress: "zst", Metadata: map[string]any{"type": "zuul_image", "format": "raw"}},
		{Name: "no metadata", Data: []byte("a"), MetadataAsIs: true},
		{Name: "empty metadata", Data: []byte("b"), Metadata: map[string]any{}, MetadataAsIs: true},
		{Name: "qcow2 image", File: "x.qcow2", Data: []byte("q"), OnObjectStore: true,
			Metadata: map[string]any{"type": "zuul_image", "format": "qcow2"}},
	}
	for _, noManifest := range []bool{false, true} {
		t.Run(fmt.Sprintf("NoManifest %v", noManifest), func(t *testing.T) {
			s := NewServer(ServerOptions{NoManifest: noManifest})
			defer s.Close()
			b := mustAdd(t, s, BuildSpec{Artifacts: specs})
			want := []map[string]any{
				{"name": "raw image", "url": b.LogURL + "raw%20image.zst", "metadata": map[string]any{"type": "zuul_image", "format": "raw",
					"sha256": b.Artifacts[0].SHA256, "md5sum": b.Artifacts[0].MD5}},
				{"name": "no metadata", "url": b.LogURL + "no%20metadata"},
				{"name": "empty metadata", "url": b.LogURL + "empty%20metadata", "metadata": map[string]any{}},
				{"name": "qcow2 image", "url": s.ObjectStoreURL() + "/images/" + b.UUID + "-x.qcow2", "metadata": map[string]any{
					"type": "zuul_image", "format": "qcow2", "sha256": b.Artifacts[3].SHA256, "md5sum": b.Artifacts[3].MD5}},
			}
			if !noManifest {
				want = append([]map[string]any{{"name": "Zuul Manifest", "url": b.LogURL + "zuul-manifest.json",
					"metadata": map[string]any{"type": "zuul_manifest"}}}, want...)
			}
			if got := publishedArtifacts(t, s); !reflect.DeepEqual(got, want) {
				t.Errorf("artifacts\n%v\nwant\n%v", got, want)
			}
			if noManifest {
				if b.Manifest != nil {
					t.Errorf("a manifest %+v without one published", b.Manifest)
				}
				return
			}
			// The manifest lists the log directory, the object store's file not.
			resp, body := get(t, "GET", b.Manifest.URL, nil)
			var doc struct {
				Tree []struct {
					Name string `json:"name"`
					Size int64  `json:"size"`
				} `json:"tree"`
				IndexLinks *bool `json:"index_links"`
			}
			if err := json.Unmarshal(body, &doc); err != nil || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("manifest %s (%s): %v", body, resp.Header.Get("Content-Type"), err)
			}
			var names []string
			for _, e := range doc.Tree {
				names = append(names, e.Name)
			}
			if !slices.Equal(names, []string{"raw image.zst", "no metadata", "empty metadata"}) || doc.Tree[0].Size != b.Artifacts[0].ServedSize ||
				doc.IndexLinks == nil || *doc.IndexLinks {
				t.Errorf("manifest %s", body)
			}
		})
	}
}

// TestObjectStore: artifacts on the object store are served there, at
// <container>/<build uuid>-<file> on another loopback address, as the
// upload-image roles publish them, with Range, HEAD, the byte counts and drops
// as on the log server; neither host serves the other's files.
func TestObjectStore(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789"), 1000)
	tests := []struct {
		name string
		opts ServerOptions
		spec ArtifactSpec
	}{
		{"ObjectStore on the server", ServerOptions{ObjectStore: true}, ArtifactSpec{Name: "raw image", Data: data, Compress: "zst"}},
		{"OnObjectStore on the artifact", ServerOptions{}, ArtifactSpec{Name: "raw image", Data: data, Compress: "zst", OnObjectStore: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewServer(tt.opts)
			defer s.Close()
			b := mustAdd(t, s, BuildSpec{Artifacts: []ArtifactSpec{tt.spec}})
			a := b.Artifacts[0]
			store := s.ObjectStoreURL()
			if !strings.HasPrefix(store, "http://127.0.0.2:") {
				t.Fatalf("object store at %s, want another loopback address than the API's %s", store, s.URL())
			}
			if a.URL != store+"/images/"+b.UUID+"-raw%20image.zst" || a.Path != "/images/"+b.UUID+"-raw image.zst" {
				t.Fatalf("artifact at %s (path %s)", a.URL, a.Path)
			}
			if pub := publishedArtifacts(t, s); pub[1]["url"] != a.URL {
				t.Errorf("published at %v", pub[1]["url"])
			}
			if resp, _ := get(t, "GET", s.URL()+escapePath(a.Path), nil); resp.StatusCode != 404 {
				t.Errorf("the API host serves the object store's file: %d", resp.StatusCode)
			}
			if resp, _ := get(t, "GET", store+escapePath("/logs/"+b.UUID+"/zuul-manifest.json"), nil); resp.StatusCode != 404 {
				t.Errorf("the object store serves the log server's file: %d", resp.StatusCode)
			}

			resp, body := get(t, "GET", a.URL, map[string]string{"Range": "bytes=0-9"})
			if resp.StatusCode != http.StatusPartialContent || len(body) != 10 {
				t.Errorf("range: %d, %d bytes", resp.StatusCode, len(body))
			}
			if resp, _ := get(t, "HEAD", a.URL, nil); resp.StatusCode != 200 || resp.ContentLength != a.ServedSize {
				t.Errorf("HEAD: %d, length %d, want %d", resp.StatusCode, resp.ContentLength, a.ServedSize)
			}
			s.DropAfter(a.URL, 5)
			resp, err := http.Get(a.URL)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !errors.Is(err, io.ErrUnexpectedEOF) || len(got) != 5 {
				t.Errorf("the dropped GET: %d bytes, %v", len(got), err)
			}
			resp, body = get(t, "GET", a.URL, map[string]string{"Range": "bytes=5-"})
			if whole := append(got, body...); resp.StatusCode != 206 || !bytes.Equal(decompress(t, "zst", whole), data) {
				t.Errorf("resumed: %d, %d bytes", resp.StatusCode, len(body))
			}
			if n, want := s.BytesServed(a.Path), 10+5+a.ServedSize-5; n != want {
				t.Errorf("BytesServed = %d, want %d", n, want)
			}
			want := []RequestInfo{{"GET", "bytes=0-9", goAgent}, {"HEAD", "", goAgent}, {"GET", "", goAgent}, {"GET", "bytes=5-", goAgent}}
			if got := s.ArtifactRequests(a.URL); !slices.Equal(got, want) {
				t.Errorf("ArtifactRequests = %v, want %v", got, want)
			}
		})
	}
}

func TestAddBuildErrors(t *testing.T) {
	s := NewServer(ServerOptions{})
	defer s.Close()
	tests := []struct {
		name string
		spec ArtifactSpec
	}{
		{"no name", ArtifactSpec{Data: []byte("x")}},
		{"missing file", ArtifactSpec{Name: "x", Path: filepath.Join(t.TempDir(), "absent")}},
		{"both sources", ArtifactSpec{Name: "x", Data: []byte("x"), Path: "y"}},
		{"unknown compression", ArtifactSpec{Name: "x", Data: []byte("x"), Compress: "bz2"}},
		{"relative on the object store", ArtifactSpec{Name: "x", Data: []byte("x"), Relative: true, OnObjectStore: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := s.AddBuild(BuildSpec{Artifacts: []ArtifactSpec{tt.spec}}); err == nil {
				t.Error("AddBuild succeeded")
			}
		})
	}
	_, body := get(t, "GET", s.URL()+"/api/tenant/example/builds", nil)
	if n := len(uuids(t, body)); n != 0 {
		t.Errorf("failed AddBuild calls left %d builds", n)
	}
}

func TestRedirect(t *testing.T) {
	s := NewServer(ServerOptions{})
	defer s.Close()
	u := s.Redirect("http://files.example.com/disk.raw?sig=x")
	if !strings.HasPrefix(u, s.URL()+"/") {
		t.Fatalf("Redirect URL %s is not on the server %s", u, s.URL())
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != "http://files.example.com/disk.raw?sig=x" {
		t.Fatalf("GET %s: %s to %q", u, resp.Status, resp.Header.Get("Location"))
	}
	resp, err = client.Get(s.URL() + "/redirect/99")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("an unknown redirect answered %s", resp.Status)
	}
}

// TestMQTTReport: the report of a build is Zuul's MQTT reporter's message for
// its buildset (MQTTReporter.report in zuul/driver/mqtt/mqttreporter.py): the
// item's tenant, pipeline and change, and the build with its job, uuid and
// result, or its job's success-message or failure-message in its place.
func TestMQTTReport(t *testing.T) {
	s := NewServer(ServerOptions{})
	defer s.Close()
	gitweb := "https://review.example.com/gitweb?p=org/images.git;a=commitdiff;h="
	branch := func(sha string) map[string]any {
		return map[string]any{"project": "org/images", "branch": "master", "change_url": gitweb + sha,
			"change": "", "patchset": "", "commit_id": "", "owner": "", "ref": "refs/heads/master"}
	}
	tests := []struct {
		name                        string
		spec                        BuildSpec
		topic, action, message      string
		buildsetResult, buildResult any
		change                      map[string]any
	}{
		{"post", BuildSpec{Job: "build-debian", Pipeline: "post", Newrev: "c0ffee"},
			"zuul/example/post/org/images", "success", "Build succeeded.", "SUCCESS", "SUCCESS", branch("c0ffee")},
		{"periodic", BuildSpec{Job: "build-debian", Pipeline: "periodic"},
			"zuul/example/periodic/org/images", "success", "Build succeeded.", "SUCCESS", "SUCCESS", branch("None")},
		{"a success-message", BuildSpec{Job: "build-debian", Pipeline: "periodic", SuccessMessage: "Image built."},
			"zuul/example/periodic/org/images", "success", "Build succeeded.", "SUCCESS", "Image built.", branch("None")},
		{"a failure-message", BuildSpec{Job: "build-debian", Pipeline: "periodic", Result: "POST_FAILURE",
			SuccessMessage: "Image built.", FailureMessage: "No image."},
			"zuul/example/periodic/org/images", "failure", "Build failed.", "FAILURE", "No image.", branch("None")},
		{"check", BuildSpec{Job: "build-debian", Pipeline: "check", Change: 123, Patchset: "4", Result: "FAILURE"},
			"zuul/example/check/org/images", "failure", "Build failed.", "FAILURE", "FAILURE",
			map[string]any{"project": "org/images", "branch": "master", "change_url": "https://review.example.com/123",
				"change": "123", "patchset": "4", "commit_id": "", "owner": "developer", "ref": "refs/changes/23/123/4"}},
		{"running", BuildSpec{Job: "build-debian", Pipeline: "periodic", InProgress: true},
			"zuul/example/periodic/org/images", "start", "Starting periodic jobs.", nil, nil, branch("None")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := mustAdd(t, s, tt.spec)
			topic, payload, err := s.MQTTReport(b.UUID)
			if err != nil {
				t.Fatal(err)
			}
			var r map[string]any
			if err := json.Unmarshal(payload, &r); err != nil {
				t.Fatalf("%v\n%s", err, payload)
			}
			wantKeys := []string{"action", "branch", "buildset", "change", "change_url", "changes", "commit_id", "enqueue_time",
				"message", "owner", "patchset", "pipeline", "project", "ref", "tenant", "timestamp", "trigger_time", "uuid",
				"zuul_event_id", "zuul_ref"}
			if got := keys(r); !slices.Equal(got, wantKeys) {
				t.Errorf("fields %v, want %v", got, wantKeys)
			}
			if topic != tt.topic || r["action"] != tt.action || r["message"] != tt.message || r["tenant"] != "example" ||
				r["pipeline"] != tt.spec.Pipeline {
				t.Errorf("on %s: %v", topic, r)
			}
			if tt.change["commit_id"] == "" && tt.change["change"] != "" {
				tt.change["commit_id"] = r["commit_id"] // a change's patchset: any commit id
			}
			for k, v := range tt.change {
				if r[k] != v {
					t.Errorf("the item's %s is %#v, want %#v", k, r[k], v)
				}
			}
			changes, _ := r["changes"].([]any)
			if len(changes) != 1 || !reflect.DeepEqual(changes[0], tt.change) {
				t.Errorf("changes %v, want [%v]", r["changes"], tt.change)
			}
			bs := r["buildset"].(map[string]any)
			if !zuulUUID(bs["uuid"]) || r["zuul_ref"] != "Z"+bs["uuid"].(string) || bs["result"] != tt.buildsetResult ||
				!zuulUUID(r["uuid"]) || !zuulUUID(r["zuul_event_id"]) || r["uuid"] == r["zuul_event_id"] {
				t.Errorf("the buildset %v, zuul_ref %v, uuid %v, event %v", bs, r["zuul_ref"], r["uuid"], r["zuul_event_id"])
			}
			for _, k := range []string{"timestamp", "trigger_time", "enqueue_time"} {
				if _, ok := r[k].(float64); !ok {
					t.Errorf("%s is %#v, want seconds", k, r[k])
				}
			}
			builds := bs["builds"].([]any)
			if len(builds) != 1 || len(bs["retry_builds"].([]any)) != 0 {
				t.Fatalf("builds %v, retry_builds %v", bs["builds"], bs["retry_builds"])
			}
			job := builds[0].(map[string]any)
			if job["job_name"] != "build-debian" || !zuulUUID(job["job_uuid"]) || job["voting"] != true {
				t.Errorf("the job %v", job)
			}
			if tt.spec.InProgress {
				// The report of a start names the jobs: none has a build yet.
				if len(job) != 3 {
					t.Errorf("the job of a start report %v", job)
				}
				return
			}
			wantKeys = []string{"artifacts", "change", "dependencies", "end_time", "events", "execute_time", "job_dependencies",
				"job_name", "job_uuid", "log_url", "result", "start_time", "uuid", "voting", "web_url"}
			if got := keys(job); !slices.Equal(got, wantKeys) {
				t.Errorf("the build's fields %v, want %v", got, wantKeys)
			}
			if job["uuid"] != b.UUID || job["result"] != tt.buildResult || job["log_url"] != b.LogURL ||
				!reflect.DeepEqual(job["change"], tt.change) || job["web_url"] != s.URL()+"/t/example/build/"+b.UUID {
				t.Errorf("the build %v", job)
			}
			for _, k := range []string{"start_time", "end_time", "execute_time"} {
				if _, ok := job[k].(float64); !ok {
					t.Errorf("the build's %s is %#v, want seconds", k, job[k])
				}
			}
			arts := job["artifacts"].([]any)
			if len(arts) != 1 || arts[0].(map[string]any)["url"] != b.Manifest.URL {
				t.Errorf("the build's artifacts %v, want the manifest's", arts)
			}
		})
	}
	if _, _, err := s.MQTTReport("0123"); err == nil {
		t.Error("a report of a build the server does not have")
	}
}

// goAgent is the User-Agent of Go's HTTP client, which the tests' requests carry.
const goAgent = "Go-http-client/1.1"
