package zuulapi_test

import (
	"context"
	"encoding/pem"
	"errors"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/zuulapi"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// fast keeps retries quick in tests.
func fast(o zuulapi.Options) zuulapi.Options {
	o.RetryWaitMin = time.Millisecond
	o.RetryWaitMax = 5 * time.Millisecond
	return o
}

func newClient(t *testing.T, o zuulapi.Options) *zuulapi.Client {
	t.Helper()
	c, err := zuulapi.New(fast(o))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func addBuild(t *testing.T, s *zuultest.Server, spec zuultest.BuildSpec) zuultest.Build {
	t.Helper()
	b, err := s.AddBuild(spec)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func writeToken(t *testing.T, dir, token string) string {
	t.Helper()
	p := filepath.Join(dir, "zuul.token")
	if err := os.WriteFile(p, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestNewRejectsBadURLs(t *testing.T) {
	for _, u := range []string{"", "zuul.example.com", "ftp://zuul.example.com/", "http://"} {
		if _, err := zuulapi.New(zuulapi.Options{APIURL: u}); err == nil {
			t.Errorf("New accepted api-url %q", u)
		}
	}
}

func TestBuildsBothShapes(t *testing.T) {
	s := zuultest.NewServer(zuultest.ServerOptions{Tenant: "t1"})
	defer s.Close()
	end := time.Date(2024, 6, 1, 12, 0, 0, 0, time.UTC)
	branch := addBuild(t, s, zuultest.BuildSpec{
		Job: "build-debian", Project: "org/images", Branch: "main", Pipeline: "periodic",
		StartTime: end.Add(-30 * time.Minute), EndTime: end,
		Artifacts: []zuultest.ArtifactSpec{{Name: "debian qcow2", File: "debian.qcow2", Data: []byte("qcow"),
			Metadata: map[string]any{"type": "zuul_image", "format": "qcow2"}}},
	})
	change := addBuild(t, s, zuultest.BuildSpec{Job: "build-debian", Change: 4321, Patchset: "2", Pipeline: "check", Result: "FAILURE"})

	for _, shape := range []int{zuultest.Shape9, zuultest.Shape10} {
		s.SetShape(shape)
		c := newClient(t, zuulapi.Options{APIURL: s.URL(), Tenant: "t1"})
		got, err := c.Builds(context.Background(), zuulapi.Query{JobName: "build-debian"})
		if err != nil {
			t.Fatalf("shape %d: %v", shape, err)
		}
		if len(got) != 2 {
			t.Fatalf("shape %d: %d builds", shape, len(got))
		}
		cb, bb := got[0], got[1]
		if bb.ID != branch.ID || bb.UUID != branch.UUID || cb.ID != change.ID || cb.ID <= bb.ID {
			t.Errorf("shape %d: ids %d/%s %d/%s", shape, bb.ID, bb.UUID, cb.ID, cb.UUID)
		}
		// A periodic build's ref is the timer's: a branch with no revisions.
		wantRef := zuulapi.Ref{Project: "org/images", Branch: "main", Ref: "refs/heads/main",
			RefURL: "https://review.example.com/gitweb?p=org/images.git;a=commitdiff;h=None"}
		if bb.Ref != wantRef {
			t.Errorf("shape %d: ref %+v, want %+v", shape, bb.Ref, wantRef)
		}
		if cb.Ref.Change != "4321" || cb.Ref.Patchset != "2" || cb.Result != "FAILURE" || cb.Pipeline != "check" {
			t.Errorf("shape %d: change build %+v", shape, cb)
		}
		if !bb.EndTime.Equal(end) || !bb.StartTime.Equal(end.Add(-30*time.Minute)) || bb.Duration != 1800 {
			t.Errorf("shape %d: times %v %v %v", shape, bb.StartTime, bb.EndTime, bb.Duration)
		}
		if bb.Result != "SUCCESS" || !bb.Final || !bb.Voting || bb.Held || bb.LogURL != branch.LogURL || bb.BuildsetUUID == "" {
			t.Errorf("shape %d: build %+v", shape, bb)
		}
		if len(bb.Artifacts) != 2 || bb.Artifacts[0].Name != "Zuul Manifest" || bb.Artifacts[0].URL != branch.Manifest.URL {
			t.Fatalf("shape %d: artifacts %+v, want the manifest and the image", shape, bb.Artifacts)
		}
		a := bb.Artifacts[1]
		if a.Name != "debian qcow2" || a.URL != branch.Artifacts[0].URL || a.Metadata["format"] != "qcow2" ||
			a.Metadata["sha256"] != branch.Artifacts[0].SHA256 {
			t.Errorf("shape %d: artifact %+v", shape, a)
		}
	}
}

func TestAPIURLFormsAndQuery(t *testing.T) {
	s := zuultest.NewServer(zuultest.ServerOptions{Tenant: "my tenant"})
	defer s.Close()
	addBuild(t, s, zuultest.BuildSpec{Job: "j", Pipeline: "post"})
	q := zuulapi.Query{Project: "org/images", Branch: "master", JobName: "j", Pipelines: []string{"periodic", "post"},
		Result: "SUCCESS", Complete: true, Limit: 10, Skip: 0}
	for _, root := range []string{s.URL(), s.URL() + "/"} {
		c := newClient(t, zuulapi.Options{APIURL: root, Tenant: "my tenant"})
		got, err := c.Builds(context.Background(), q)
		if err != nil {
			t.Fatalf("api-url %s: %v", root, err)
		}
		if len(got) != 1 {
			t.Errorf("api-url %s: %d builds, want 1", root, len(got))
		}
	}
	calls := s.BuildsCalls()
	for _, call := range calls {
		if call.Path != "/api/tenant/my tenant/builds" {
			t.Errorf("path %q", call.Path)
		}
		want := "project=org%2Fimages&job_name=j&pipeline=periodic&pipeline=post&branch=master&result=SUCCESS&complete=true&limit=10"
		if call.RawQuery != want {
			t.Errorf("query %q, want %q", call.RawQuery, want)
		}
		if call.Authorization != "" {
			t.Errorf("Authorization %q sent without a token file", call.Authorization)
		}
	}
}

func TestWhiteLabel(t *testing.T) {
	s := zuultest.NewServer(zuultest.ServerOptions{Tenant: "t1", WhiteLabel: true})
	defer s.Close()
	addBuild(t, s, zuultest.BuildSpec{UUID: "wl"})
	ctx := context.Background()

	t.Run("no tenant", func(t *testing.T) {
		c := newClient(t, zuulapi.Options{APIURL: s.URL() + "/"})
		for range 2 {
			got, err := c.Builds(ctx, zuulapi.Query{})
			if err != nil || len(got) != 1 || got[0].UUID != "wl" {
				t.Fatalf("builds %+v, %v", got, err)
			}
		}
	})
	t.Run("its own tenant", func(t *testing.T) {
		c := newClient(t, zuulapi.Options{APIURL: s.URL(), Tenant: "t1"})
		before := len(s.BuildsCalls())
		for range 2 {
			got, err := c.Builds(ctx, zuulapi.Query{})
			if err != nil || len(got) != 1 {
				t.Fatalf("builds %+v, %v", got, err)
			}
		}
		var paths []string
		for _, call := range s.BuildsCalls()[before:] {
			paths = append(paths, call.Path)
		}
		// The tenant path 404s once; afterwards the root is known.
		want := []string{"/api/tenant/t1/builds", "/api/builds", "/api/builds"}
		if !slices.Equal(paths, want) {
			t.Errorf("paths %v, want %v", paths, want)
		}
	})
	t.Run("another tenant", func(t *testing.T) {
		c := newClient(t, zuulapi.Options{APIURL: s.URL(), Tenant: "t2"})
		_, err := c.Builds(ctx, zuulapi.Query{})
		if !errors.Is(err, zuulapi.ErrUnknownTenant) || !strings.Contains(err.Error(), `white-labelled for tenant "t1"`) {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("multi-tenant root without tenant", func(t *testing.T) {
		m := zuultest.NewServer(zuultest.ServerOptions{Tenant: "t1"})
		defer m.Close()
		c := newClient(t, zuulapi.Options{APIURL: m.URL()})
		_, err := c.Builds(ctx, zuulapi.Query{})
		if !errors.Is(err, zuulapi.ErrNoTenant) || !strings.Contains(err.Error(), "set tenant") {
			t.Errorf("err = %v", err)
		}
	})
}

func TestTokens(t *testing.T) {
	s := zuultest.NewServer(zuultest.ServerOptions{Tenant: "t1", Token: "tok-1", ForbiddenToken: "no-access"})
	defer s.Close()
	addBuild(t, s, zuultest.BuildSpec{})
	dir := t.TempDir()
	ctx := context.Background()
	tokenFile := writeToken(t, dir, "  tok-1\n")
	c := newClient(t, zuulapi.Options{APIURL: s.URL(), Tenant: "t1", TokenFile: tokenFile})

	if _, err := c.Builds(ctx, zuulapi.Query{}); err != nil {
		t.Fatalf("good token: %v", err)
	}
	if got := s.BuildsCalls()[0].Authorization; got != "Bearer tok-1" {
		t.Errorf("Authorization %q, want the trimmed token", got)
	}

	// The operator rotates the token: the next call must use the new one.
	s.SetToken("tok-2")
	writeToken(t, dir, "tok-2")
	if _, err := c.Builds(ctx, zuulapi.Query{}); err != nil {
		t.Fatalf("rotated token: %v", err)
	}

	writeToken(t, dir, "stale")
	before := len(s.BuildsCalls())
	_, err := c.Builds(ctx, zuulapi.Query{})
	var zerr *zuulapi.Error
	if !errors.Is(err, zuulapi.ErrUnauthorized) || !errors.As(err, &zerr) || zerr.StatusCode != 401 {
		t.Fatalf("wrong token: err = %v", err)
	}
	for _, want := range []string{"refused the token from " + tokenFile, "Invalid signature", "check auth-token-file"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if n := len(s.BuildsCalls()) - before; n != 1 {
		t.Errorf("a 401 was tried %d times, want once", n)
	}

	writeToken(t, dir, "no-access")
	_, err = c.Builds(ctx, zuulapi.Query{})
	if !errors.Is(err, zuulapi.ErrForbidden) || !strings.Contains(err.Error(), `no access to Zuul tenant "t1"`) {
		t.Errorf("forbidden token: err = %v", err)
	}

	noToken := newClient(t, zuulapi.Options{APIURL: s.URL(), Tenant: "t1"})
	_, err = noToken.Builds(ctx, zuulapi.Query{})
	if !errors.Is(err, zuulapi.ErrUnauthorized) || !strings.Contains(err.Error(), `Zuul tenant "t1" requires a token`) ||
		!strings.Contains(err.Error(), "set auth-token-file") {
		t.Errorf("no token: err = %v", err)
	}

	os.Remove(tokenFile)
	_, err = c.Builds(ctx, zuulapi.Query{})
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "auth-token-file") {
		t.Errorf("missing token file: err = %v", err)
	}
	writeToken(t, dir, "\n")
	if _, err = c.Builds(ctx, zuulapi.Query{}); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("empty token file: err = %v", err)
	}
}

func TestTenantErrors(t *testing.T) {
	s := zuultest.NewServer(zuultest.ServerOptions{Tenant: "t1"})
	defer s.Close()
	ctx := context.Background()

	_, err := newClient(t, zuulapi.Options{APIURL: s.URL(), Tenant: "nope"}).Builds(ctx, zuulapi.Query{})
	if !errors.Is(err, zuulapi.ErrUnknownTenant) || !strings.Contains(err.Error(), `no tenant "nope"`) {
		t.Errorf("unknown tenant: err = %v", err)
	}

	s.SetUnloaded(true)
	before := len(s.BuildsCalls())
	_, err = newClient(t, zuulapi.Options{APIURL: s.URL(), Tenant: "t1"}).Builds(ctx, zuulapi.Query{})
	if !errors.Is(err, zuulapi.ErrTenantNotLoaded) || !strings.Contains(err.Error(), "retry later") {
		t.Errorf("unloaded tenant: err = %v", err)
	}
	if n := len(s.BuildsCalls()) - before; n != 1 {
		t.Errorf("a 422 was tried %d times, want once", n)
	}
}

func TestServerErrorsAreRetried(t *testing.T) {
	s := zuultest.NewServer(zuultest.ServerOptions{})
	defer s.Close()
	addBuild(t, s, zuultest.BuildSpec{})
	ctx := context.Background()
	c := newClient(t, zuulapi.Options{APIURL: s.URL(), Tenant: "example", RetryMax: 3})

	s.FailBuilds(2, http.StatusInternalServerError)
	got, err := c.Builds(ctx, zuulapi.Query{})
	if err != nil || len(got) != 1 {
		t.Fatalf("after two 500s: %v, %d builds", err, len(got))
	}
	if n := len(s.BuildsCalls()); n != 3 {
		t.Errorf("%d calls, want 3", n)
	}

	s.FailBuilds(100, http.StatusInternalServerError)
	_, err = c.Builds(ctx, zuulapi.Query{})
	var zerr *zuulapi.Error
	if !errors.Is(err, zuulapi.ErrServer) || !errors.As(err, &zerr) || zerr.StatusCode != 500 {
		t.Fatalf("persistent 500: err = %v", err)
	}
	if !strings.Contains(err.Error(), "500 Internal Server Error") || !strings.Contains(err.Error(), "after 4 attempts") {
		t.Errorf("error %q does not give the status and attempts", err)
	}
	if n := len(s.BuildsCalls()); n != 3+4 {
		t.Errorf("%d calls, want 7", n)
	}
}

func TestSmallHandlerStatuses(t *testing.T) {
	tests := []struct {
		status   int
		body     string
		want     error
		wantText string
		calls    int32
	}{
		{404, "<html><p>Unknown tenant</p></html>", zuulapi.ErrUnknownTenant, "Unknown tenant", 1},
		{422, "<html><p>Tenant t isn't ready</p></html>", zuulapi.ErrTenantNotLoaded, "isn't ready", 1},
		{400, "bad", zuulapi.ErrUnexpected, "400 Bad Request", 1},
		{503, "", zuulapi.ErrServer, "after 3 attempts", 3},
		{501, "", zuulapi.ErrServer, "after 1 attempt", 1},
	}
	for _, tt := range tests {
		t.Run(http.StatusText(tt.status), func(t *testing.T) {
			var calls atomic.Int32
			h := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if strings.HasSuffix(r.URL.Path, "/builds") {
					calls.Add(1)
				}
				w.WriteHeader(tt.status)
				io.WriteString(w, tt.body)
			}))
			defer h.Close()
			c := newClient(t, zuulapi.Options{APIURL: h.URL, Tenant: "t", RetryMax: 2})
			_, err := c.Builds(context.Background(), zuulapi.Query{})
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.wantText) {
				t.Errorf("err = %v, want %v mentioning %q", err, tt.want, tt.wantText)
			}
			if got := calls.Load(); got != tt.calls {
				t.Errorf("%d calls, want %d", got, tt.calls)
			}
		})
	}
}

func TestNotZuul(t *testing.T) {
	h := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "<html>a login page</html>")
	}))
	defer h.Close()
	_, err := newClient(t, zuulapi.Options{APIURL: h.URL, Tenant: "t"}).Builds(context.Background(), zuulapi.Query{})
	if !errors.Is(err, zuulapi.ErrUnexpected) || !strings.Contains(err.Error(), "api-url") {
		t.Errorf("err = %v", err)
	}
}

func TestTimeoutIsRetried(t *testing.T) {
	var calls atomic.Int32
	h := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
			return
		}
		io.WriteString(w, `[{"_id": 1, "uuid": "late"}]`)
	}))
	defer h.Close()
	c := newClient(t, zuulapi.Options{APIURL: h.URL, Tenant: "t", Timeout: 200 * time.Millisecond})
	got, err := c.Builds(context.Background(), zuulapi.Query{})
	if err != nil || len(got) != 1 || got[0].UUID != "late" {
		t.Fatalf("builds %+v, err %v", got, err)
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("%d calls, want 2", n)
	}
}

func TestConnectionErrorsAndCancel(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	c := newClient(t, zuulapi.Options{APIURL: "http://" + addr, Tenant: "t", RetryMax: 2})
	_, err = c.Builds(context.Background(), zuulapi.Query{})
	var zerr *zuulapi.Error
	if err == nil || errors.As(err, &zerr) || !strings.Contains(err.Error(), "3 attempts") {
		t.Errorf("refused connection: err = %v", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s := zuultest.NewServer(zuultest.ServerOptions{})
	defer s.Close()
	_, err = newClient(t, zuulapi.Options{APIURL: s.URL(), Tenant: "example"}).Builds(ctx, zuulapi.Query{})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: err = %v", err)
	}
}

// TestArtifactURLs: every artifact reaches the client as an absolute URL that
// serves its file: the manifest and an image the job returned relative to its
// log URL, which Zuul joined onto it, and an image on the object store, on
// another host.
func TestArtifactURLs(t *testing.T) {
	s := zuultest.NewServer(zuultest.ServerOptions{})
	defer s.Close()
	b := addBuild(t, s, zuultest.BuildSpec{Artifacts: []zuultest.ArtifactSpec{
		{Name: "raw image", Data: []byte("raw bytes"), Compress: "zst", Relative: true},
		{Name: "qcow2 image", File: "debian.qcow2", Data: []byte("qcow2 bytes"), OnObjectStore: true},
	}})
	got, err := newClient(t, zuulapi.Options{APIURL: s.URL(), Tenant: "example"}).Builds(context.Background(), zuulapi.Query{})
	if err != nil || len(got) != 1 {
		t.Fatalf("builds %+v, %v", got, err)
	}
	want := []struct {
		name, url string
		size      int64
	}{
		{"Zuul Manifest", b.LogURL + "zuul-manifest.json", b.Manifest.ServedSize},
		{"raw image", b.LogURL + "raw%20image.zst", b.Artifacts[0].ServedSize},
		{"qcow2 image", s.ObjectStoreURL() + "/images/" + b.UUID + "-debian.qcow2", b.Artifacts[1].ServedSize},
	}
	if len(got[0].Artifacts) != len(want) {
		t.Fatalf("artifacts %+v, want %d", got[0].Artifacts, len(want))
	}
	for i, w := range want {
		a := got[0].Artifacts[i]
		if a.Name != w.name || a.URL != w.url {
			t.Errorf("artifact %d: %s at %s, want %s at %s", i, a.Name, a.URL, w.name, w.url)
			continue
		}
		resp, err := http.Get(a.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.ContentLength != w.size {
			t.Errorf("GET %s: %d, %d bytes, want 200, %d", a.URL, resp.StatusCode, resp.ContentLength, w.size)
		}
	}
}

func TestCACertFile(t *testing.T) {
	h := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `[{"_id": 3, "uuid": "tls"}]`)
	}))
	defer h.Close()
	ctx := context.Background()

	_, err := newClient(t, zuulapi.Options{APIURL: h.URL, Tenant: "t"}).Builds(ctx, zuulapi.Query{})
	if err == nil || !strings.Contains(err.Error(), "(1 attempt)") {
		t.Errorf("untrusted certificate: err = %v, want a failure without retries", err)
	}

	caFile := filepath.Join(t.TempDir(), "ca.pem")
	pemData := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: h.Certificate().Raw})
	if err := os.WriteFile(caFile, pemData, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := newClient(t, zuulapi.Options{APIURL: h.URL, Tenant: "t", CACertFile: caFile}).Builds(ctx, zuulapi.Query{})
	if err != nil || len(got) != 1 || got[0].UUID != "tls" {
		t.Errorf("with ca-cert: %+v, %v", got, err)
	}

	bad := filepath.Join(t.TempDir(), "bad.pem")
	os.WriteFile(bad, []byte("not a certificate"), 0o644)
	if _, err := zuulapi.New(zuulapi.Options{APIURL: h.URL, CACertFile: bad}); err == nil {
		t.Error("New accepted a ca-cert without certificates")
	}
}
