package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// loopbackService is a service only the builder's host can reach, serving
// what would pass for a raw image; it counts the requests it gets.
type loopbackService struct {
	*httptest.Server
	requests atomic.Int64
}

func newLoopbackService(t *testing.T, content []byte) *loopbackService {
	s := &loopbackService{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.requests.Add(1)
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(content))
	}))
	t.Cleanup(s.Close)
	return s
}

// TestArtifactOnLoopbackServiceRefused: a build whose artifact URL points at a
// service on loopback, directly or through a redirect from Zuul's own host,
// is refused: the service gets no request, nothing reaches Glance, and the
// build is not fetched again. The service is on Zuul's loopback address, but
// on another port than the api-url's, the one the operator named.
func TestArtifactOnLoopbackServiceRefused(t *testing.T) {
	secret := append([]byte("LOOPBACK-ONLY-SERVICE "), make([]byte, 1<<20)...)
	secret = secret[:1<<20] // a plausible raw image: only where it comes from is wrong
	tests := []struct {
		name    string
		extra   string // added to the zuul-image
		publish func(e *env, service string) func(string) string
		says    []string
	}{
		{name: "direct", publish: func(e *env, service string) func(string) string {
			return func(string) string { return service }
		}, says: []string{"refused to connect to 127.0.0.1", "artifact-hosts"}},
		{name: "through a redirect from Zuul", publish: func(e *env, service string) func(string) string {
			return func(string) string { return e.zuul.Redirect(service) }
		}, says: []string{"refused to connect to 127.0.0.1", "artifact-hosts"}},
		{name: "direct, with artifact-hosts", extra: "    artifact-hosts: ['{{ZUULHOST}}']\n",
			publish: func(e *env, service string) func(string) string {
				return func(string) string { return service }
			}, says: []string{"refused URL http://127.0.0.1:", "not among the allowed artifact hosts"}},
		{name: "through a redirect, with artifact-hosts", extra: "    artifact-hosts: ['{{ZUULHOST}}']\n",
			publish: func(e *env, service string) func(string) string {
				return func(string) string { return e.zuul.Redirect(service) }
			}, says: []string{"refused redirect to http://127.0.0.1:", "not among the allowed artifact hosts"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
			service := newLoopbackService(t, secret)
			zu, _ := url.Parse(e.zuul.URL())
			e.oneProvider("raw", strings.ReplaceAll(tt.extra, "{{ZUULHOST}}", zu.Host), "")
			zb := e.addBuild(image{}, zuultest.BuildSpec{Artifacts: []zuultest.ArtifactSpec{{
				Name: "debian raw", Data: secret, Metadata: zuulImageMeta("raw"),
				Publish: tt.publish(e, service.URL+"/internal/disk.raw"),
			}}})
			e.refusedOnce(zb, "debian raw", tt.says...)
			if n := service.requests.Load(); n != 0 {
				t.Errorf("the loopback service got %d requests", n)
			}
		})
	}
}

// TestArtifactOnNamedHostFetched: a host the operator names in artifact-hosts
// is fetched from, even on loopback, also through a redirect from Zuul.
func TestArtifactOnNamedHostFetched(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	img := e.makeImage(1)
	data, err := os.ReadFile(img.raw)
	if err != nil {
		t.Fatal(err)
	}
	service := newLoopbackService(t, data)
	zu, _ := url.Parse(e.zuul.URL())
	su, _ := url.Parse(service.URL)
	e.oneProvider("raw", "    artifact-hosts: ['"+zu.Host+"', '"+su.Host+"']\n", "")
	zb := e.addBuild(image{}, zuultest.BuildSpec{Artifacts: []zuultest.ArtifactSpec{{
		Name: "debian raw", Data: data, Metadata: zuulImageMeta("raw"),
		Publish: func(string) string { return e.zuul.Redirect(service.URL + "/disk.raw") },
	}}})
	e.once(0)
	b, ok := e.zuulBuildOf(zb.UUID)
	if !ok || b.State != "ready" {
		t.Fatalf("the build on a named host was not fetched: %+v", e.buildsJSON())
	}
	if service.requests.Load() == 0 {
		t.Fatal("the named host got no request")
	}
	e.checkUploaded("cloud-x", b, "raw")
}

// TestImplausibleRawRefused: a few bytes of text published as a raw image are
// refused, and nothing is uploaded.
func TestImplausibleRawRefused(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	e.oneProvider("raw", "", "")
	zb := e.addBuild(image{}, zuultest.BuildSpec{Artifacts: []zuultest.ArtifactSpec{{
		Name: "debian raw", Data: []byte("root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:\n"), Metadata: zuulImageMeta("raw"),
	}}})
	e.refusedOnce(zb, "debian raw", "a raw image of 48 bytes is no disk image")
}
