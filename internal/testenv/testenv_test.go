package testenv

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// recordingTB stands in for a test so RequireBinary's fatal and skip paths can be seen
// without ending the real test.
type recordingTB struct {
	testing.TB
	fatal, skip string
}

func (r *recordingTB) Helper() {}
func (r *recordingTB) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
}
func (r *recordingTB) Skipf(format string, args ...any) {
	r.skip = fmt.Sprintf(format, args...)
}

func TestRequireBinary(t *testing.T) {
	const missing = "no-such-program-nodepool-builder-test"
	tests := []struct {
		name      string
		binary    string
		ci        string
		wantPath  bool
		wantFatal bool
		wantSkip  bool
	}{
		{name: "installed", binary: "sh", ci: "true", wantPath: true},
		{name: "missing in CI", binary: missing, ci: "true", wantFatal: true},
		{name: "missing outside CI", binary: missing, ci: "", wantSkip: true},
		{name: "CI not exactly true", binary: missing, ci: "1", wantSkip: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("CI", tt.ci)
			rec := &recordingTB{TB: t}
			path := RequireBinary(rec, tt.binary)
			if got := path != ""; got != tt.wantPath {
				t.Errorf("path = %q, want a path: %v", path, tt.wantPath)
			}
			if got := rec.fatal != ""; got != tt.wantFatal {
				t.Errorf("fatal = %q, want fatal: %v", rec.fatal, tt.wantFatal)
			}
			if got := rec.skip != ""; got != tt.wantSkip {
				t.Errorf("skip = %q, want skip: %v", rec.skip, tt.wantSkip)
			}
			for _, msg := range []string{rec.fatal, rec.skip} {
				if msg != "" && !strings.Contains(msg, tt.binary+" not installed; run `make deps-test`") {
					t.Errorf("message %q does not name the binary and the fix", msg)
				}
			}
		})
	}
}

func TestGlanceStartUseStop(t *testing.T) {
	RequireBinary(t, "glance-api")
	RequireBinary(t, "glance-manage")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	g, stop, err := StartGlance(ctx, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = stop()
		}
	}()

	clouds, err := os.ReadFile(g.CloudsFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{g.Cloud + ":", "auth_type: none", "image_endpoint_override: " + g.Endpoint} {
		if !bytes.Contains(clouds, []byte(want)) {
			t.Errorf("clouds.yaml lacks %q:\n%s", want, clouds)
		}
	}

	id := createImage(ctx, t, g.Endpoint)
	data := bytes.Repeat([]byte("glance test data "), 1000)
	put, err := http.NewRequestWithContext(ctx, http.MethodPut, g.Endpoint+"/v2/images/"+id+"/file", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	put.Header.Set("Content-Type", "application/octet-stream")
	resp := do(t, put, http.StatusNoContent)
	resp.Body.Close()

	get, err := http.NewRequestWithContext(ctx, http.MethodGet, g.Endpoint+"/v2/images/"+id, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp = do(t, get, http.StatusOK)
	var img struct {
		Status   string `json:"status"`
		Size     int64  `json:"size"`
		Checksum string `json:"checksum"`
	}
	err = json.NewDecoder(resp.Body).Decode(&img)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	sum := md5.Sum(data)
	if img.Status != "active" || img.Size != int64(len(data)) || img.Checksum != hex.EncodeToString(sum[:]) {
		t.Errorf("image = %+v, want active, size %d, checksum %x", img, len(data), sum)
	}
	stored, err := os.ReadFile(filepath.Join(g.DataDir, "images", id))
	if err != nil || !bytes.Equal(stored, data) {
		t.Errorf("file store does not hold the uploaded data (err %v)", err)
	}

	stopped = true
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if groupAlive(g.pgid) {
		t.Errorf("process group %d still has members after stop", g.pgid)
	}
	if pids := processesMentioning(t, g.DataDir); len(pids) > 0 {
		t.Errorf("processes left behind: %v", pids)
	}
	if _, err := http.Get(g.Endpoint + "/versions"); err == nil {
		t.Errorf("%s still answers after stop", g.Endpoint)
	}
	if err := stop(); err != nil {
		t.Errorf("second stop: %v", err)
	}
}

func createImage(ctx context.Context, t *testing.T, endpoint string) string {
	t.Helper()
	body := `{"name": "testenv", "disk_format": "raw", "container_format": "bare", "visibility": "private"}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint+"/v2/images", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp := do(t, req, http.StatusCreated)
	defer resp.Body.Close()
	var created struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&created); err != nil {
		t.Fatal(err)
	}
	if created.ID == "" || created.Status != "queued" {
		t.Fatalf("created image = %+v, want an id and status queued", created)
	}
	return created.ID
}

func do(t *testing.T, req *http.Request, want int) *http.Response {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != want {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("%s %s: status %d, want %d: %s", req.Method, req.URL, resp.StatusCode, want, body)
	}
	return resp
}

// processesMentioning lists the processes whose command line contains s.
func processesMentioning(t *testing.T, s string) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		Unavailable(t, "no /proc to look for leftovers: %v", err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(cmdline, []byte(s)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestProxyDownUpAndRate takes a proxied HTTP server down and up again on the
// same address, and paces a transfer through it.
func TestProxyDownUpAndRate(t *testing.T) {
	body := bytes.Repeat([]byte("x"), 300<<10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(body) }))
	defer srv.Close()
	p := NewProxy(t, strings.TrimPrefix(srv.URL, "http://"))
	get := func() (int, error) {
		c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
		resp, err := c.Get(p.URL())
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		return len(data), err
	}
	if n, err := get(); err != nil || n != len(body) {
		t.Fatalf("through the proxy: %d bytes, %v", n, err)
	}
	p.Down()
	if _, err := get(); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("proxy down: %v, want connection refused", err)
	}
	if err := p.Up(); err != nil {
		t.Fatal(err)
	}
	p.SetRate(1 << 20)
	start := time.Now()
	if n, err := get(); err != nil || n != len(body) {
		t.Fatalf("after up: %d bytes, %v", n, err)
	}
	// 300 KiB at 1 MiB/s takes about 0.3 s.
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Fatalf("300 KiB at 1 MiB/s took %s", d)
	}
}
