package openstack

import (
	"bytes"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/uploader"
)

// TestMain stops the Keystone the package's tests share.
func TestMain(m *testing.M) {
	code := m.Run()
	if err := testenv.StopSharedKeystone(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}

// keystoneCloud is a Glance behind the shared Keystone, reachable through the
// catalog in two regions of its own: in regionA at the public interface only,
// in regionB at the internal and the admin ones only. Every other endpoint of
// the image service in those regions leads nowhere, so a call that succeeds
// went where the cloud's region and interface say.
type keystoneCloud struct {
	ks               *testenv.Keystone
	glance           *testenv.Glance
	account          testenv.Account
	appCred          testenv.AppCredential
	regionA, regionB string
}

func newKeystoneCloud(t *testing.T) *keystoneCloud {
	t.Helper()
	ks := testenv.SharedKeystone(t)
	kc := &keystoneCloud{ks: ks, glance: testenv.NewGlanceBehind(t, ks), account: ks.NewAccount(t)}
	kc.appCred = ks.NewAppCredential(t, kc.account)
	kc.regionA, kc.regionB = ks.AddRegion(t), ks.AddRegion(t)
	nowhere := fmt.Sprintf("http://127.0.0.1:%d", testenv.FreePort(t))
	internal := testenv.NewProxy(t, strings.TrimPrefix(kc.glance.Endpoint, "http://"))
	admin := testenv.NewProxy(t, strings.TrimPrefix(kc.glance.Endpoint, "http://"))
	svc := ks.AddService(t, "image")
	for _, ep := range []struct{ region, iface, url string }{
		{kc.regionA, "public", kc.glance.Endpoint},
		{kc.regionA, "internal", nowhere},
		{kc.regionA, "admin", nowhere},
		{kc.regionB, "public", nowhere},
		{kc.regionB, "internal", internal.URL()},
		{kc.regionB, "admin", admin.URL() + "/v2"}, // some catalogs name the version
	} {
		ks.AddEndpoint(t, svc, ep.region, ep.iface, ep.url)
	}
	return kc
}

// cloudsFile writes a clouds.yaml with a password cloud, an application
// credential cloud and one with a wrong password, each with extra (region,
// interface) lines, and returns its path.
func (kc *keystoneCloud) cloudsFile(t *testing.T, extra string) string {
	t.Helper()
	indent := func(s string) string { return strings.ReplaceAll(s, "\n", "\n    ") }
	path := filepath.Join(t.TempDir(), "clouds.yaml")
	writeFile(t, path, fmt.Sprintf(`clouds:
  password:
    %[5]s
    auth:
      auth_url: %[1]s/v3
      username: %[2]s
      password: %[3]s
      project_name: %[4]s
      user_domain_name: Default
      project_domain_name: Default
  wrong-password:
    %[5]s
    auth:
      auth_url: %[1]s/v3
      username: %[2]s
      password: not-%[3]s
      project_name: %[4]s
      user_domain_name: Default
      project_domain_name: Default
  appcred:
    auth_type: v3applicationcredential
    %[5]s
    auth:
      auth_url: %[1]s/v3
      application_credential_id: %[6]s
      application_credential_secret: %[7]s
  appcred-by-name:
    %[5]s
    auth:
      auth_url: %[1]s/v3
      username: %[2]s
      user_domain_name: Default
      application_credential_name: %[8]s
      application_credential_secret: %[7]s
`, kc.ks.URL, kc.account.User, kc.account.Password, kc.account.Project, indent(extra),
		kc.appCred.ID, kc.appCred.Secret, kc.appCred.Name))
	return path
}

// roundTrip creates an image, uploads data into it, finds it by property and
// deletes it: every call the uploader and the sweep make. The image belongs to
// project, the project of the cloud's credentials.
func roundTrip(t *testing.T, c *Cloud, project string) {
	t.Helper()
	ctx := t.Context()
	props := map[string]string{"case": t.Name()}
	id, err := c.Create(ctx, uploader.ImageSpec{Name: "auth", DiskFormat: "raw", Properties: props})
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("keystone "), 4096)
	if err := c.Upload(ctx, id, bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatal(err)
	}
	img, err := c.Get(ctx, id)
	sum := md5.Sum(data)
	if err != nil || img.Status != "active" || img.Size != int64(len(data)) || img.Checksum != hex.EncodeToString(sum[:]) {
		t.Fatalf("after upload: %+v, %v; want active with %d bytes", img, err, len(data))
	}
	if p, err := c.Project(ctx); err != nil || p != project || img.Owner != project {
		t.Errorf("project of the credentials %q (%v), owner of the image %q; want both %s", p, err, img.Owner, project)
	}
	if ids := listIDs(t, c, props); len(ids) != 1 || ids[0] != id {
		t.Errorf("list by property = %v, want [%s]", ids, id)
	}
	if err := c.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, id); !errors.Is(err, uploader.ErrNotFound) {
		t.Errorf("after delete: %v, want not found", err)
	}
}

// TestKeystone: the clouds.yaml forms users have, against a real Keystone and a
// Glance that takes only its tokens: password and application credential
// logins, the image endpoint chosen from the catalog by region and interface
// (or image_endpoint_override), and refusals that say what to fix.
func TestKeystone(t *testing.T) {
	kc := newKeystoneCloud(t)
	ctx := t.Context()

	tests := []struct {
		name   string
		cloud  string
		extra  string // region and interface lines of the clouds
		region string // Options.Region
		// wantErr, when set, is what the first call's error says; wantUnavailable
		// that it is marked uploader.ErrUnavailable.
		wantErr         []string
		wantUnavailable bool
	}{
		{name: "password, public interface by default", cloud: "password", extra: "region_name: " + kc.regionA},
		{name: "password, internal interface", cloud: "password", extra: "region_name: " + kc.regionB + "\ninterface: internal"},
		{name: "password, admin endpoint_type", cloud: "password", extra: "region_name: " + kc.regionB + "\nendpoint_type: adminURL"},
		{name: "password, region from the provider", cloud: "password", extra: "region_name: " + kc.regionA + "\ninterface: internal", region: kc.regionB},
		{name: "application credential by id", cloud: "appcred", extra: "region_name: " + kc.regionB + "\ninterface: internal"},
		{name: "application credential by name", cloud: "appcred-by-name", extra: "region_name: " + kc.regionA},
		{name: "application credential with override", cloud: "appcred", extra: "image_endpoint_override: " + kc.glance.Endpoint + "/v2"},
		// The catalog names it, but it does not answer: down, not misconfigured.
		{name: "interface the region does not serve", cloud: "password", extra: "region_name: " + kc.regionA + "\ninterface: internal",
			wantErr: []string{"connection refused", "internal"}, wantUnavailable: true},
		{name: "region missing from the catalog", cloud: "password", extra: "region_name: no-such-region",
			wantErr: []string{"find the image service in the catalog", "no-such-region"}},
		{name: "wrong password", cloud: "wrong-password", extra: "region_name: " + kc.regionA,
			wantErr: []string{"refused the credentials (HTTP 401 Unauthorized)", "auth.password", kc.ks.URL}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Open(ctx, Options{Cloud: tt.cloud, CloudsFile: kc.cloudsFile(t, tt.extra), Region: tt.region})
			if err != nil {
				t.Fatal(err)
			}
			if tt.wantErr == nil {
				roundTrip(t, c, kc.account.ProjectID)
				return
			}
			_, err = c.List(ctx, map[string]string{"case": "none"})
			if err == nil {
				t.Fatal("List succeeded")
			}
			for _, want := range tt.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			if got := errors.Is(err, uploader.ErrUnavailable); got != tt.wantUnavailable {
				t.Errorf("error %q: unavailable = %v, want %v", err, got, tt.wantUnavailable)
			}
			if strings.Contains(err.Error(), kc.account.Password) {
				t.Errorf("error %q shows the password", err)
			}
		})
	}
}

// revokeOnPut is a transport that revokes the token of the first PUT of image
// data, uploaded or staged, before it sends it, so that Glance refuses the PUT
// as if its token had expired just then.
type revokeOnPut struct {
	t    *testing.T
	ks   *testenv.Keystone
	done atomic.Bool
	puts atomic.Int32
}

func (r *revokeOnPut) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method == http.MethodPut && (strings.HasSuffix(req.URL.Path, "/file") || strings.HasSuffix(req.URL.Path, "/stage")) {
		r.puts.Add(1)
		if r.done.CompareAndSwap(false, true) {
			r.ks.Revoke(r.t, req.Header.Get("X-Auth-Token"))
		}
	}
	return http.DefaultTransport.RoundTrip(req)
}

// TestUploadTokenRefusedAtPut: Glance refuses the token of an upload's PUT, as
// when the token expires just as the PUT starts. The upload logs in again and
// sends the data again, all of it from where the reader stood, and so does a
// stage for an import; data that cannot be sent again fails with an error that
// says so, and the next try succeeds.
func TestUploadTokenRefusedAtPut(t *testing.T) {
	kc := newKeystoneCloud(t)
	ctx := t.Context()
	clouds := kc.cloudsFile(t, "region_name: "+kc.regionA)
	const size = 8 << 20
	open := func(t *testing.T) (*Cloud, *revokeOnPut) {
		rt := &revokeOnPut{t: t, ks: kc.ks}
		c, err := Open(ctx, Options{Cloud: "password", CloudsFile: clouds, HTTPClient: &http.Client{Transport: rt}})
		if err != nil {
			t.Fatal(err)
		}
		return c, rt
	}
	check := func(t *testing.T, c *Cloud, id string, sum []byte) {
		t.Helper()
		img, err := c.Get(ctx, id)
		if want := hex.EncodeToString(sum); err != nil || img.Status != "active" || img.Size != size || img.Checksum != want {
			t.Errorf("image = %+v, %v; want active with %d bytes, md5 %s", img, err, size, want)
		}
	}

	// file is the image's data in a file, after a header the caller has
	// read past already, and its md5.
	file := func(t *testing.T, state uint64) (*os.File, []byte) {
		t.Helper()
		data := &noise{left: size, state: state, sum: md5.New()}
		f, err := os.Create(filepath.Join(t.TempDir(), "image"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		const header = 4096
		if _, err := f.Write(bytes.Repeat([]byte{'h'}, header)); err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(f, data); err != nil {
			t.Fatal(err)
		}
		if _, err := f.Seek(header, io.SeekStart); err != nil {
			t.Fatal(err)
		}
		return f, data.sum.Sum(nil)
	}

	t.Run("a file is sent again from where it stood", func(t *testing.T) {
		c, rt := open(t)
		id := create(t, c, map[string]string{"case": "refused-seekable"})
		f, sum := file(t, 3)
		if err := c.Upload(ctx, id, f, size); err != nil {
			t.Fatalf("upload with its token refused once: %v", err)
		}
		if n := rt.puts.Load(); n != 2 {
			t.Errorf("%d PUTs, want 2: the refused one and the one after the new login", n)
		}
		check(t, c, id, sum)
	})

	t.Run("a staged file is sent again from where it stood", func(t *testing.T) {
		c, rt := open(t)
		id := create(t, c, map[string]string{"case": "refused-stage"})
		f, sum := file(t, 6)
		if err := c.Stage(ctx, id, f, size); err != nil {
			t.Fatalf("stage with its token refused once: %v", err)
		}
		if n := rt.puts.Load(); n != 2 {
			t.Errorf("%d PUTs, want 2: the refused one and the one after the new login", n)
		}
		if err := c.Import(ctx, id, GlanceDirect, ""); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, importTimeout, "the import of image "+id, func() bool {
			img, err := c.Get(ctx, id)
			return err == nil && img.Status == "active"
		})
		check(t, c, id, sum)
	})

	t.Run("a stream fails clearly and the retry succeeds", func(t *testing.T) {
		c, _ := open(t)
		id := create(t, c, map[string]string{"case": "refused-stream"})
		err := c.Upload(ctx, id, &noise{left: size, state: 4, sum: md5.New()}, size)
		if err == nil {
			t.Fatal("a stream that cannot be sent again was uploaded after a refused token")
		}
		for _, want := range []string{id, "HTTP 401", "sent again"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %q", err, want)
			}
		}
		data := &noise{left: size, state: 4, sum: md5.New()}
		if err := c.Upload(ctx, id, data, size); err != nil {
			t.Fatalf("the retry: %v", err)
		}
		check(t, c, id, data.sum.Sum(nil))
	})
}

// countLogins is a transport that counts the logins sent through it.
type countLogins struct{ n atomic.Int32 }

func (c *countLogins) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method == http.MethodPost && strings.HasSuffix(req.URL.Path, "/auth/tokens") {
		c.n.Add(1)
	}
	return http.DefaultTransport.RoundTrip(req)
}

// TestTokenExpiry: with tokens that live a few seconds, an upload and a leak
// sweep's listing that take longer, slowed down on the way to Glance, succeed,
// logging in again as their tokens expire.
func TestTokenExpiry(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Keystone of its own and outlasts its tokens, a minute or so; make test runs it")
	}
	const lifetime = 8 * time.Second
	ks := testenv.NewKeystone(t, testenv.KeystoneOptions{TokenLifetime: lifetime})
	g := testenv.NewGlanceBehind(t, ks)
	account := ks.NewAccount(t)
	region := ks.AddRegion(t)
	slow := testenv.NewProxy(t, strings.TrimPrefix(g.Endpoint, "http://"))
	ks.AddEndpoint(t, ks.AddService(t, "image"), region, "public", slow.URL())
	kc := &keystoneCloud{ks: ks, glance: g, account: account}
	logins := &countLogins{}
	ctx := t.Context()
	c, err := Open(ctx, Options{Cloud: "password", CloudsFile: kc.cloudsFile(t, "region_name: "+region),
		HTTPClient: &http.Client{Transport: logins}})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("an upload outlasts its token", func(t *testing.T) {
		id := create(t, c, map[string]string{"case": "expiry-upload"})
		before := logins.n.Load()
		// At 64 KiB/s, 768 KiB take 12 s.
		const size = 768 << 10
		slow.SetRate(64 << 10)
		defer slow.SetRate(0)
		data := &noise{left: size, state: 5, sum: md5.New()}
		start := time.Now()
		if err := c.Upload(ctx, id, data, size); err != nil {
			t.Fatalf("upload: %v", err)
		}
		if took := time.Since(start); took < lifetime {
			t.Fatalf("the upload took %s, less than a token's lifetime: the test proved nothing", took)
		}
		img, err := c.Get(ctx, id)
		if want := hex.EncodeToString(data.sum.Sum(nil)); err != nil || img.Status != "active" || img.Size != size || img.Checksum != want {
			t.Errorf("image = %+v, %v; want active with %d bytes, md5 %s", img, err, size, want)
		}
		if logins.n.Load() == before {
			t.Errorf("no login after the upload, whose token had expired")
		}
	})

	t.Run("a listing outlasts its token", func(t *testing.T) {
		match := map[string]string{"case": "expiry-list"}
		var want []string
		for range 5 {
			want = append(want, create(t, c, match))
		}
		before := logins.n.Load()
		// One image a page, each page a few seconds on the way.
		c.pageSize = 1
		defer func() { c.pageSize = defaultPageSize }()
		slow.SetRate(500)
		defer slow.SetRate(0)
		start := time.Now()
		got := listIDs(t, c, match)
		if took := time.Since(start); took < lifetime {
			t.Fatalf("the listing took %s, less than a token's lifetime: the test proved nothing", took)
		}
		if !sameSet(got, want) {
			t.Errorf("listed %v, want %v", got, want)
		}
		if logins.n.Load() == before {
			t.Errorf("no login during the listing, which outlasted its token")
		}
	})
}
