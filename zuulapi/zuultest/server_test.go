package zuultest

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
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
		{"exclude_result=SUCCESS", []string{"e", "b"}},
		{"complete=true&job_name=build-debian", []string{"f", "d", "b", "a"}},
		{"complete=false", []string{"e"}},
		{"final=true&pipeline=post", []string{"b"}},
		{"uuid=c", []string{"c"}},
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

func TestBuildShapes(t *testing.T) {
	s := NewServer(ServerOptions{})
	defer s.Close()
	end := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	mustAdd(t, s, BuildSpec{UUID: "u1", Project: "org/images", Branch: "main", EndTime: end, StartTime: end.Add(-time.Minute)})
	mustAdd(t, s, BuildSpec{UUID: "u2", Change: 1234, Patchset: "3", Pipeline: "check"})

	for _, shape := range []int{Shape9, Shape10} {
		s.SetShape(shape)
		_, body := get(t, "GET", s.URL()+"/api/tenant/example/builds", nil)
		var builds []map[string]any
		if err := json.Unmarshal(body, &builds); err != nil {
			t.Fatal(err)
		}
		if len(builds) != 2 {
			t.Fatalf("shape %d: got %d builds", shape, len(builds))
		}
		change, branchBuild := builds[0], builds[1]
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
			if _, flat := branchBuild["project"]; flat {
				t.Errorf("shape 10 has a flat project field")
			}
		} else if r, ok := branchBuild["ref"].(string); !ok || r != "refs/heads/main" {
			t.Errorf("shape 9: ref is %#v, want the string refs/heads/main", branchBuild["ref"])
		}
		if ref["project"] != "org/images" || ref["branch"] != "main" || ref["change"] != nil {
			t.Errorf("shape %d: branch ref %v", shape, ref)
		}
		if changeRef["change"] != 1234.0 || changeRef["patchset"] != "3" {
			t.Errorf("shape %d: change ref %v", shape, changeRef)
		}
		if bs, ok := branchBuild["buildset"].(map[string]any); !ok || bs["uuid"] == "" {
			t.Errorf("shape %d: buildset %v", shape, branchBuild["buildset"])
		}
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
		{"bad limit", builds + "?limit=x", "Bearer good", 400, ""},
		{"root builds on a multi-tenant root", s.URL() + "/api/builds", "Bearer good", 404, ""},
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
	if pub[0]["url"] != a.URL || pub[0]["name"] != "disk image" {
		t.Errorf("published %v", pub[0])
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
	want := []RequestInfo{{"GET", "bytes=10-19"}, {"HEAD", ""}, {"GET", ""}}
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
	pub := publishedArtifacts(t, s)
	if pub[0]["url"] != "raw%20image" {
		t.Errorf("relative url published as %v", pub[0]["url"])
	}
	if a.URL != b.LogURL+"raw%20image" {
		t.Errorf("absolute URL %s", a.URL)
	}
	if _, body := get(t, "GET", a.URL, nil); string(body) != "abc" {
		t.Errorf("served %q", body)
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
// its buildset: the item's tenant, pipeline and ref, and the build with its
// job, uuid and result; a change's build carries the change's number.
func TestMQTTReport(t *testing.T) {
	s := NewServer(ServerOptions{})
	defer s.Close()
	post := mustAdd(t, s, BuildSpec{Job: "build-debian", Pipeline: "post"})
	check := mustAdd(t, s, BuildSpec{Job: "build-debian", Pipeline: "check", Change: 123, Patchset: "4", Result: "FAILURE"})
	type reportBuild struct {
		JobName string          `json:"job_name"`
		UUID    string          `json:"uuid"`
		Result  string          `json:"result"`
		Change  json.RawMessage `json:"change"`
	}
	type report struct {
		Action, Tenant, Pipeline, Project, Branch, Ref string
		Change                                         any
		Buildset                                       struct {
			Builds []reportBuild `json:"builds"`
		} `json:"buildset"`
	}
	for _, c := range []struct {
		uuid, topic, action, pipeline, result, ref string
		change                                     any
	}{
		{post.UUID, "zuul/example/post/org/images", "success", "post", "SUCCESS", "refs/heads/master", ""},
		{check.UUID, "zuul/example/check/org/images", "failure", "check", "FAILURE", "refs/changes/23/123/4", 123.0},
	} {
		topic, payload, err := s.MQTTReport(c.uuid)
		if err != nil {
			t.Fatal(err)
		}
		var r report
		if err := json.Unmarshal(payload, &r); err != nil {
			t.Fatalf("the report of %s: %v\n%s", c.uuid, err, payload)
		}
		if topic != c.topic || r.Action != c.action || r.Tenant != "example" || r.Pipeline != c.pipeline ||
			r.Project != "org/images" || r.Branch != "master" || r.Ref != c.ref || r.Change != c.change ||
			len(r.Buildset.Builds) != 1 {
			t.Fatalf("the report of %s on %s: %+v", c.uuid, topic, r)
		}
		if b := r.Buildset.Builds[0]; b.JobName != "build-debian" || b.UUID != c.uuid || b.Result != c.result || len(b.Change) == 0 {
			t.Errorf("the build in the report of %s: %+v", c.uuid, b)
		}
	}
	if _, _, err := s.MQTTReport("0123"); err == nil {
		t.Error("a report of a build the server does not have")
	}
}
