package main

import (
	"context"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// TestArtifactOnHostNotAllowedWaits: a build whose artifact URL points at a
// service on loopback, directly or through a redirect from Zuul's own host,
// is not fetched: the service gets no request and nothing reaches Glance.
// That is the operator's configuration, not a bad build: --once says what
// host to allow and exits 1, image-status says what the build waits for,
// nothing is refused for good, and once the operator names the host in
// artifact-hosts the same build is fetched. The service is on Zuul's loopback
// address, but on another port than the api-url's, the one the operator named.
func TestArtifactOnHostNotAllowedWaits(t *testing.T) {
	tests := []struct {
		name    string
		named   bool // artifact-hosts names Zuul's host alone, before the service's is added
		publish func(e *env, service string) func(string) string
		says    []string
	}{
		{name: "direct", publish: func(e *env, service string) func(string) string {
			return func(string) string { return service }
		}, says: []string{"refused to connect to 127.0.0.1", "add 127.0.0.1:"}},
		{name: "through a redirect from Zuul", publish: func(e *env, service string) func(string) string {
			return func(string) string { return e.zuul.Redirect(service) }
		}, says: []string{"refused to connect to 127.0.0.1", "add 127.0.0.1:"}},
		{name: "direct, with artifact-hosts", named: true,
			publish: func(e *env, service string) func(string) string {
				return func(string) string { return service }
			}, says: []string{"refused URL http://127.0.0.1:", "not among the allowed artifact hosts", "add 127.0.0.1:"}},
		{name: "through a redirect, with artifact-hosts", named: true,
			publish: func(e *env, service string) func(string) string {
				return func(string) string { return e.zuul.Redirect(service) }
			}, says: []string{"refused redirect to http://127.0.0.1:", "not among the allowed artifact hosts", "add 127.0.0.1:"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
			data, err := os.ReadFile(e.makeImage(1).raw)
			if err != nil {
				t.Fatal(err)
			}
			service := testenv.NewFileServer(t, data)
			zu, _ := url.Parse(e.zuul.URL())
			su, _ := url.Parse(service.URL)
			allow := func(hosts ...string) {
				extra := ""
				if len(hosts) > 0 {
					extra = "    artifact-hosts: ['" + strings.Join(hosts, "', '") + "']\n"
				}
				e.oneProvider("raw", extra, "")
			}
			if tt.named {
				allow(zu.Host)
			} else {
				allow()
			}
			zb := e.addBuild(image{}, zuultest.BuildSpec{Artifacts: []zuultest.ArtifactSpec{{
				Name: "debian raw", Data: data, Metadata: zuulImageMeta("raw"),
				Publish: tt.publish(e, service.URL+"/internal/disk.raw"),
			}}})
			for run := range 2 {
				r := e.once(exitFailed)
				for _, s := range append(tt.says, zb.UUID, "artifact-hosts", "not done") {
					if !strings.Contains(r.stderr, s) {
						t.Errorf("run %d: --once does not say %q:\n%s", run, s, r.stderr)
					}
				}
				st, _ := e.status()
				row := st["debian"]
				if row.ZuulWaiting == nil || !strings.Contains(*row.ZuulWaiting, zb.UUID) || !strings.Contains(*row.ZuulWaiting, "add 127.0.0.1:") {
					t.Fatalf("run %d: image-status says the build waits for %v; want Zuul build %s and the host to add", run, row.ZuulWaiting, zb.UUID)
				}
				if row.LastZuulOutcome != nil && *row.LastZuulOutcome == "failed" {
					t.Fatalf("run %d: the Zuul build is refused for good: %v", run, *row.LastZuulReason)
				}
			}
			if n := service.Requests(); n != 0 {
				t.Errorf("the loopback service got %d requests", n)
			}
			if imgs, err := e.cloud.List(context.Background(), nil); err != nil || len(imgs) != 0 {
				t.Fatalf("Glance holds %d images (%v): %+v", len(imgs), err, imgs)
			}
			// The operator allows the host: the same build is fetched.
			allow(zu.Host, su.Host)
			e.once(0)
			b, ok := e.zuulBuildOf(zb.UUID)
			if !ok || b.State != "ready" {
				t.Fatalf("the build was not fetched once its host was allowed: %+v", e.buildsJSON())
			}
			e.checkUploaded("cloud-x", b, "raw")
			if st, _ := e.status(); st["debian"].ZuulWaiting != nil {
				t.Errorf("image-status still says the build waits: %s", *st["debian"].ZuulWaiting)
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
	service := testenv.NewFileServer(t, data)
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
	if service.Requests() == 0 {
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

// TestArtifactsOnObjectStore: an image job publishes its images on an object
// store, a host that is neither Zuul's nor its log server's (127.0.0.2 here),
// as zuul-jobs' upload-image-swift and upload-image-s3 do. With the default
// artifact hosts the newest build waits, nothing is fetched from the store,
// and --once and image-status name the entry to add; with the store's host in
// artifact-hosts, the same build is fetched from it, in both formats the
// providers take (a qcow2, and a raw compressed with zstd), and uploaded.
func TestArtifactsOnObjectStore(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example", ObjectStore: true})
	store, _ := url.Parse(e.zuul.ObjectStoreURL())
	zu, _ := url.Parse(e.zuul.URL())
	zb := e.addBuild(e.makeImage(1), zuultest.BuildSpec{})
	for _, a := range zb.Artifacts {
		if u, _ := url.Parse(a.URL); u.Host != store.Host {
			t.Fatalf("artifact %s is at %s, not on the object store %s", a.Name, a.URL, store.Host)
		}
	}
	r := e.once(exitFailed)
	for _, s := range []string{zb.UUID, "not among the allowed artifact hosts", "add " + store.Host + " to the zuul-image's artifact-hosts"} {
		if !strings.Contains(r.stderr, s) {
			t.Errorf("--once does not say %q:\n%s", s, r.stderr)
		}
	}
	if st, _ := e.status(); st["debian"].ZuulWaiting == nil || !strings.Contains(*st["debian"].ZuulWaiting, store.Host) {
		t.Fatalf("image-status does not say the build waits for %s: %+v", store.Host, st["debian"])
	}
	for _, a := range zb.Artifacts {
		if n := e.zuul.BytesServed(a.Path); n != 0 {
			t.Errorf("artifact %s: %d bytes served while its host was not allowed", a.Name, n)
		}
	}
	if builds := e.buildsJSON(); len(builds) != 0 {
		t.Fatalf("builds recorded while the build waits: %+v", builds)
	}

	e.writeConfig("    artifact-hosts: ['" + zu.Host + "', '" + store.Host + "']\n")
	e.once(0)
	b, ok := e.zuulBuildOf(zb.UUID)
	if !ok || b.State != "ready" {
		t.Fatalf("the build on the object store was not fetched: %+v", e.buildsJSON())
	}
	e.checkUploaded("cloud-q", b, "qcow2")
	e.checkUploaded("cloud-r", b, "raw")
	if st, _ := e.status(); st["debian"].ZuulWaiting != nil {
		t.Errorf("image-status still says the build waits: %s", *st["debian"].ZuulWaiting)
	}
}
