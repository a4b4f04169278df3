package builder

import (
	"context"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/uploader"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

func TestZuulClientTrustsCACert(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("image")) }))
	defer srv.Close()
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644)

	plain, err := zuulClient("")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Get(srv.URL); err == nil {
		t.Fatal("a client without the ca-cert trusted the test server")
	}
	trusting, err := zuulClient(ca)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := trusting.Get(srv.URL)
	if err != nil {
		t.Fatalf("a client with the ca-cert: %v", err)
	}
	resp.Body.Close()

	bad := filepath.Join(dir, "bad.pem")
	os.WriteFile(bad, []byte("not a certificate"), 0o644)
	if _, err := zuulClient(bad); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Fatalf("bad ca-cert: %v", err)
	}
	if _, err := zuulClient(filepath.Join(dir, "missing.pem")); err == nil {
		t.Fatal("missing ca-cert accepted")
	}
}

// TestZuulImagesShareConnections: the zuul-images of one Zuul share its
// connections, so a --once over many of them opens about one for each poll
// that runs at once, not one for each image. (A few more than onceParallel may
// open: a request that finds no idle connection dials one, and the one freed
// meanwhile may serve it first.)
func TestZuulImagesShareConnections(t *testing.T) {
	zuul := zuultest.NewServer(zuultest.ServerOptions{})
	t.Cleanup(zuul.Close)
	const images = 20 * onceParallel
	var cfg strings.Builder
	cfg.WriteString("images-dir: %s\nzuul-images:\n")
	for i := range images {
		fmt.Fprintf(&cfg, "  - name: zimg-%d\n    api-url: %s\n    tenant: example\n    project: org/images\n"+
			"    job: build-zimg-%d\n    formats: [raw]\n", i, zuul.URL(), i)
	}
	r := newRig(t, cfg.String())
	if err := r.b.Once(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := len(zuul.BuildsCalls()); n != images {
		t.Fatalf("Zuul was asked %d times, want once per zuul-image (%d)", n, images)
	}
	if n := zuul.Connections(); n > images/4 {
		t.Errorf("%d connections to Zuul for %d zuul-images polled %d at a time, want about %d", n, images, onceParallel, onceParallel)
	}
}

// TestProvidersShareTheirCloud: providers of one clouds.yaml entry and region
// get one cloud client (one login, one listing per leak sweep); another region
// gets its own.
func TestProvidersShareTheirCloud(t *testing.T) {
	const shared = `images-dir: %s
diskimages:
  - name: img-a
    elements: [e]
    pause: true
providers:
  - name: pa
    cloud: c
    image-format: raw
    diskimages: [{name: img-a}]
  - name: pb
    cloud: c
    image-format: raw
    diskimages: [{name: img-a}]
  - name: pc
    cloud: c
    region-name: other
    image-format: raw
    diskimages: [{name: img-a}]
`
	var opened []string
	clouds := map[string]*gatedCloud{}
	r := newRig(t, shared, func(o *Options) {
		o.OpenCloud = func(_ context.Context, p *config.Provider) (uploader.Cloud, error) {
			opened = append(opened, p.Name)
			clouds[p.Name] = newGatedCloud()
			return clouds[p.Name], nil
		}
	})
	if want := []string{"pa", "pc"}; !slices.Equal(opened, want) {
		t.Fatalf("clouds opened for %v, want %v (pb shares pa's)", opened, want)
	}
	if err := r.b.Once(context.Background()); err != nil {
		t.Fatal(err)
	}
	for name, c := range clouds {
		c.mu.Lock()
		lists := c.lists
		c.mu.Unlock()
		if lists != 1 {
			t.Errorf("the leak sweep listed %s's cloud %d times, want once", name, lists)
		}
	}
}

// TestFetchersGetNAT64Prefixes: builder.nat64-prefixes reaches the fetcher of
// every zuul-image (artifacts judges the addresses).
func TestFetchersGetNAT64Prefixes(t *testing.T) {
	r := newRig(t, "images-dir: %s\nbuilder:\n  nat64-prefixes: ['2a00:1:64::/96']\nzuul-images:\n"+
		"  - {name: a, api-url: 'https://zuul.example.com/', tenant: t, project: org/images, job: build-a}\n")
	cfg := r.b.cur.Load().cfg
	_, fetchers, err := r.b.zuulClients(cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("2a00:1:64::/96")}
	if f := fetchers["a"]; f == nil || !slices.Equal(f.NAT64Prefixes, want) {
		t.Errorf("the fetcher of zuul-image a: %+v; want NAT64Prefixes %v", f, want)
	}
}
