package openstack

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
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
