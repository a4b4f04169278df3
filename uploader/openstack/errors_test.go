package openstack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/uploader"
)

// glanceAnswer is a stand-in Glance that answers every request with one status
// and body, as Glance words them.
func glanceAnswer(t *testing.T, status int, body string) (*Cloud, *httptest.Server) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=UTF-8")
		w.WriteHeader(status)
		fmt.Fprint(w, body)
	}))
	t.Cleanup(srv.Close)
	return cloudAt(t, srv.URL), srv
}

// cloudAt opens a cloud with auth_type none whose Glance is at url.
func cloudAt(t *testing.T, url string) *Cloud {
	t.Helper()
	file := filepath.Join(t.TempDir(), "clouds.yaml")
	yaml := "clouds:\n  g:\n    auth_type: none\n    image_endpoint_override: " + url + "\n"
	if err := os.WriteFile(file, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := Open(context.Background(), Options{Cloud: "g", CloudsFile: file})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestDeleteOfADeletedImage: two deletes that race get Glance's 400 "transition
// from deleted to deleted"; the image is gone, which is what a delete wants.
func TestDeleteOfADeletedImage(t *testing.T) {
	for _, from := range []string{"deleted", "pending_delete"} {
		body := "<html>\n <head>\n  <title>400 Bad Request</title>\n </head>\n <body>\n  <h1>400 Bad Request</h1>\n  " +
			"Image status transition from " + from + " to deleted is not allowed<br /><br />\n\n\n\n </body>\n</html>"
		c, _ := glanceAnswer(t, http.StatusBadRequest, body)
		if err := c.Delete(context.Background(), "5b8a2cd3-4b1e-4c52-a8f4-0a6f3e9b7d11"); err != nil {
			t.Errorf("delete answered 400 %s: %v, want no error", from, err)
		}
	}
	// Any other 400 is a failure, and says what Glance said.
	c, _ := glanceAnswer(t, http.StatusBadRequest, "<html><body><h1>400 Bad Request</h1>Image is protected<br /></body></html>")
	err := c.Delete(context.Background(), "5b8a2cd3-4b1e-4c52-a8f4-0a6f3e9b7d11")
	if err == nil || !strings.Contains(err.Error(), "Image is protected") || errors.Is(err, uploader.ErrUnavailable) {
		t.Errorf("delete answered another 400: %v", err)
	}
}

// TestUnavailableIsMarked: a refused connection and an HTTP 5xx are marked
// uploader.ErrUnavailable, a 4xx is not.
func TestUnavailableIsMarked(t *testing.T) {
	ctx := context.Background()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + l.Addr().String()
	l.Close()
	down := cloudAt(t, closed)
	unavailable, _ := glanceAnswer(t, http.StatusServiceUnavailable, "<html><body>503 Service Unavailable</body></html>")
	forbidden, _ := glanceAnswer(t, http.StatusForbidden, "<html><body>403 Forbidden</body></html>")
	spec := uploader.ImageSpec{Name: "x", DiskFormat: "raw"}
	var wg sync.WaitGroup
	for _, c := range []struct {
		name  string
		cloud *Cloud
		want  bool
	}{{"refused connection", down, true}, {"503", unavailable, true}, {"403", forbidden, false}} {
		wg.Go(func() {
			_, cerr := c.cloud.Create(ctx, spec)
			_, lerr := c.cloud.List(ctx, map[string]string{"k": "v"})
			derr := c.cloud.Delete(ctx, "5b8a2cd3-4b1e-4c52-a8f4-0a6f3e9b7d11")
			uerr := c.cloud.Upload(ctx, "5b8a2cd3-4b1e-4c52-a8f4-0a6f3e9b7d11", strings.NewReader("x"), 1)
			for _, err := range []error{cerr, lerr, derr, uerr} {
				if err == nil || errors.Is(err, uploader.ErrUnavailable) != c.want {
					t.Errorf("%s: %v; want an error, unavailable %v", c.name, err, c.want)
				}
			}
		})
	}
	wg.Wait()
}

// identity is a stand-in Keystone v3 that logs in only the password or
// application credential secret it is given, answering anything else as
// Keystone does (401 with its JSON error); refuse makes it refuse everyone, as
// after a password change or an application credential's expiry.
type identity struct {
	*httptest.Server
	secret string
	glance string
	status atomic.Int32 // when set, the status of every login
	issued atomic.Int32
}

func newIdentity(t *testing.T, secret, glance string) *identity {
	ks := &identity{secret: secret, glance: glance}
	ks.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v3/auth/tokens" {
			http.NotFound(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		status := int(ks.status.Load())
		if status == 0 && !strings.Contains(string(body), `"`+ks.secret+`"`) {
			status = http.StatusUnauthorized
		}
		if status != 0 {
			w.WriteHeader(status)
			fmt.Fprintf(w, `{"error": {"code": %d, "message": "The request you have made requires authentication.", "title": %q}}`,
				status, http.StatusText(status))
			return
		}
		w.Header().Set("X-Subject-Token", fmt.Sprintf("token-%d", ks.issued.Add(1)))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"token": {"expires_at": "2099-01-01T00:00:00.000000Z", "methods": ["password"],
			"user": {"id": "u1", "name": "nodepool", "domain": {"id": "default", "name": "Default"}},
			"project": {"id": "p1", "name": "ci", "domain": {"id": "default", "name": "Default"}},
			"catalog": [{"type": "image", "name": "glance", "id": "s1", "endpoints": [
				{"id": "e1", "interface": "public", "region": "RegionOne", "region_id": "RegionOne", "url": %q}]}]}}`, ks.glance)
	}))
	t.Cleanup(ks.Close)
	return ks
}

// TestKeystoneRefusalIsKeystones: a login Keystone refuses, at start or when
// a token is renewed, is reported as Keystone's, at the cloud's auth_url, with
// what to check, and never with the secret; Glance's own 401 stays Glance's.
func TestKeystoneRefusalIsKeystones(t *testing.T) {
	const secret = "s3cret-Pa55"
	tests := []struct {
		name        string
		auth        string // the cloud's auth section, below auth_url
		loginAs     int32  // Keystone's answer to every login from the start; 0: checks the secret
		renewAs     int32  // Keystone's answer to logins after the first Glance request; 0: checks the secret
		glance      int    // Glance's answer to a valid token after the first request; 0: 200
		want        []string
		notWant     []string
		unavailable bool
	}{
		{name: "wrong password", auth: "username: nodepool\n      password: wrong-" + secret + "\n      user_domain_name: Default\n      project_name: ci\n      project_domain_name: Default",
			want:    []string{"Keystone", "/v3", "refused the credentials", "401", "auth.password"},
			notWant: []string{"Glance", secret}},
		{name: "expired application credential", auth: "application_credential_id: app\n      application_credential_secret: old-" + secret,
			want:    []string{"Keystone", "/v3", "refused the credentials", "application credential", "expired"},
			notWant: []string{"Glance", secret}},
		{name: "refused when the token is renewed", auth: "username: nodepool\n      password: " + secret + "\n      user_domain_name: Default\n      project_name: ci\n      project_domain_name: Default",
			renewAs: http.StatusUnauthorized, glance: http.StatusUnauthorized,
			want:    []string{"Keystone", "/v3", "refused the credentials", "auth.password"},
			notWant: []string{"Glance answered", secret}},
		{name: "Keystone down", auth: "username: nodepool\n      password: " + secret + "\n      user_domain_name: Default\n      project_name: ci\n      project_domain_name: Default",
			loginAs: http.StatusServiceUnavailable,
			want:    []string{"Keystone", "/v3", "503"}, notWant: []string{"Glance", secret}, unavailable: true},
		{name: "Glance refuses a renewed token", auth: "username: nodepool\n      password: " + secret + "\n      user_domain_name: Default\n      project_name: ci\n      project_domain_name: Default",
			glance: http.StatusUnauthorized,
			want:   []string{"Glance answered HTTP 401"}, notWant: []string{"Keystone", secret}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var requests, status atomic.Int32
			glance := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if requests.Add(1) > 1 && status.Load() != 0 {
					w.WriteHeader(int(status.Load()))
					fmt.Fprint(w, "<html><body><h1>401 Unauthorized</h1>This server could not verify that you are authorized.</body></html>")
					return
				}
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprint(w, `{"images": []}`)
			}))
			t.Cleanup(glance.Close)
			ks := newIdentity(t, secret, glance.URL)
			ks.status.Store(tt.loginAs)
			file := filepath.Join(t.TempDir(), "clouds.yaml")
			clouds := fmt.Sprintf("clouds:\n  c:\n    image_endpoint_override: %s/v2\n    auth:\n      auth_url: %s/v3\n      %s\n",
				glance.URL, ks.URL, tt.auth)
			if err := os.WriteFile(file, []byte(clouds), 0o600); err != nil {
				t.Fatal(err)
			}
			c, err := Open(t.Context(), Options{Cloud: "c", CloudsFile: file})
			if err != nil {
				t.Fatal(err)
			}
			if tt.renewAs != 0 || tt.glance != 0 {
				if _, err := c.List(t.Context(), map[string]string{"k": "v"}); err != nil {
					t.Fatalf("first list: %v", err)
				}
				ks.status.Store(tt.renewAs)
				status.Store(int32(tt.glance))
			}
			_, err = c.List(t.Context(), map[string]string{"k": "v"})
			if err == nil {
				t.Fatal("list succeeded, want an error")
			}
			for _, s := range tt.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error does not say %q:\n%v", s, err)
				}
			}
			for _, s := range tt.notWant {
				if strings.Contains(err.Error(), s) {
					t.Errorf("error says %q:\n%v", s, err)
				}
			}
			if errors.Is(err, uploader.ErrUnavailable) != tt.unavailable {
				t.Errorf("error marked unavailable %v, want %v: %v", !tt.unavailable, tt.unavailable, err)
			}
		})
	}
}
