package openstack

import (
	"bytes"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/uploader"
)

// TestGlance runs against a real standalone Glance; the subtests share it because it
// takes seconds to start, and keep apart by the property values they use.
func TestGlance(t *testing.T) {
	g := testenv.NewGlance(t)
	ctx := t.Context()
	cloud, err := Open(ctx, Options{Cloud: g.Cloud, CloudsFile: g.CloudsFile})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("create upload get", func(t *testing.T) {
		props := map[string]string{
			"nodepool_build_id":                "0123456789abcdef",
			"owner_specified.openstack.sha256": strings.Repeat("ab", 32),
			"owner_specified.openstack.md5":    strings.Repeat("cd", 16),
			"hw_disk_bus":                      "scsi",
		}
		id, err := cloud.Create(ctx, uploader.ImageSpec{Name: "debian-bookworm-1700000000", DiskFormat: "qcow2", Properties: props})
		if err != nil {
			t.Fatal(err)
		}
		img, err := cloud.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if img.Status != "queued" || img.Name != "debian-bookworm-1700000000" || img.DiskFormat != "qcow2" {
			t.Errorf("before upload: %+v, want queued qcow2 named as created", img)
		}
		// Without authentication there is no project to compare owners with.
		if p, err := cloud.Project(ctx); err != nil || p != "" || img.Owner != "" {
			t.Errorf("project %q (%v), owner %q; want none without authentication", p, err, img.Owner)
		}

		data := bytes.Repeat([]byte("not really a qcow2 "), 5000)
		if err := cloud.Upload(ctx, id, bytes.NewReader(data), int64(len(data))); err != nil {
			t.Fatal(err)
		}
		img, err = cloud.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		sum := md5.Sum(data)
		if img.ID != id || img.Status != "active" || img.Size != int64(len(data)) || img.Checksum != hex.EncodeToString(sum[:]) {
			t.Errorf("after upload: %+v, want active, size %d, checksum %x", img, len(data), sum)
		}
		for k, v := range props {
			if img.Properties[k] != v {
				t.Errorf("property %s = %q, want %q", k, img.Properties[k], v)
			}
		}
		for _, core := range []string{"os_hash_algo", "os_hash_value", "status", "name"} {
			if _, ok := img.Properties[core]; ok {
				t.Errorf("Glance field %s shows up as a property", core)
			}
		}
		var raw struct {
			Visibility      string `json:"visibility"`
			ContainerFormat string `json:"container_format"`
		}
		getJSON(t, g.Endpoint+"/v2/images/"+id, &raw)
		if raw.Visibility != "private" || raw.ContainerFormat != "bare" {
			t.Errorf("visibility %q, container format %q; want private, bare", raw.Visibility, raw.ContainerFormat)
		}
	})

	t.Run("upload of unknown size", func(t *testing.T) {
		id := create(t, cloud, map[string]string{"case": "chunked"})
		data := []byte("sent without a Content-Length")
		if err := cloud.Upload(ctx, id, io.MultiReader(bytes.NewReader(data[:5]), bytes.NewReader(data[5:])), -1); err != nil {
			t.Fatal(err)
		}
		img, err := cloud.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if img.Status != "active" || img.Size != int64(len(data)) {
			t.Errorf("image = %+v, want active with %d bytes", img, len(data))
		}
	})

	t.Run("upload shorter than announced fails", func(t *testing.T) {
		id := create(t, cloud, map[string]string{"case": "short"})
		if err := cloud.Upload(ctx, id, strings.NewReader("ten bytes!"), 1000); err == nil {
			t.Fatal("Upload of 10 bytes announced as 1000 succeeded")
		}
		img, err := cloud.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if img.Status == "active" {
			t.Errorf("image became active from a short upload: %+v", img)
		}
	})

	t.Run("upload to a missing image", func(t *testing.T) {
		err := cloud.Upload(ctx, "00000000-0000-0000-0000-00000000feed", strings.NewReader("x"), 1)
		if !errors.Is(err, uploader.ErrNotFound) {
			t.Errorf("err = %v, want ErrNotFound", err)
		}
	})

	t.Run("list by properties across pages", func(t *testing.T) {
		var gets atomic.Int32
		paged, err := Open(ctx, Options{Cloud: g.Cloud, CloudsFile: g.CloudsFile, HTTPClient: &http.Client{
			Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
				if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/v2/images") {
					gets.Add(1)
				}
				return http.DefaultTransport.RoundTrip(r)
			}),
		}})
		if err != nil {
			t.Fatal(err)
		}
		paged.pageSize = 2

		var wantX, wantAll []string
		for i := range 5 {
			id := create(t, paged, map[string]string{"nodepool_builder_id": "list-a", "kind": "x", "owner_specified.openstack.sha256": fmt.Sprint("sum-", i%2)})
			wantX = append(wantX, id)
		}
		wantAll = append(wantAll, wantX...)
		for range 2 {
			wantAll = append(wantAll, create(t, paged, map[string]string{"nodepool_builder_id": "list-a", "kind": "y"}))
		}
		other := create(t, paged, map[string]string{"nodepool_builder_id": "list-b", "kind": "x"})

		gets.Store(0)
		got := listIDs(t, paged, map[string]string{"nodepool_builder_id": "list-a", "kind": "x"})
		if !sameSet(got, wantX) {
			t.Errorf("builder list-a, kind x: got %v, want %v", got, wantX)
		}
		if n := gets.Load(); n < 3 {
			t.Errorf("5 images in pages of 2 took %d list requests, want at least 3", n)
		}
		if got := listIDs(t, paged, map[string]string{"nodepool_builder_id": "list-a"}); !sameSet(got, wantAll) {
			t.Errorf("builder list-a: got %v, want %v", got, wantAll)
		}
		if got := listIDs(t, paged, map[string]string{"nodepool_builder_id": "list-a", "owner_specified.openstack.sha256": "sum-1"}); !sameSet(got, []string{wantX[1], wantX[3]}) {
			t.Errorf("by dotted key: got %v, want %v", got, []string{wantX[1], wantX[3]})
		}
		if got := listIDs(t, paged, map[string]string{"nodepool_builder_id": "list-b"}); !sameSet(got, []string{other}) {
			t.Errorf("builder list-b: got %v, want [%s]", got, other)
		}
		if got := listIDs(t, paged, map[string]string{"nodepool_builder_id": "list-c"}); len(got) != 0 {
			t.Errorf("builder list-c: got %v, want none", got)
		}
	})

	t.Run("delete", func(t *testing.T) {
		id := create(t, cloud, map[string]string{"case": "delete"})
		if err := cloud.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
		if _, err := cloud.Get(ctx, id); !errors.Is(err, uploader.ErrNotFound) {
			t.Errorf("Get after Delete: err = %v, want ErrNotFound", err)
		}
		if err := cloud.Delete(ctx, id); err != nil {
			t.Errorf("second Delete: %v, want nil", err)
		}
		if err := cloud.Delete(ctx, "00000000-0000-0000-0000-000000000000"); err != nil {
			t.Errorf("Delete of an image that never existed: %v, want nil", err)
		}
	})

	t.Run("get missing", func(t *testing.T) {
		const id = "00000000-0000-0000-0000-00000000abcd"
		_, err := cloud.Get(ctx, id)
		if !errors.Is(err, uploader.ErrNotFound) {
			t.Fatalf("err = %v, want ErrNotFound", err)
		}
		for _, want := range []string{id, "cloud " + g.Cloud, "HTTP 404"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not mention %q", err, want)
			}
		}
	})

	t.Run("other errors carry the status", func(t *testing.T) {
		_, err := cloud.Create(ctx, uploader.ImageSpec{Name: "bad", DiskFormat: "not-a-format"})
		if err == nil {
			t.Fatal("Create with an unknown disk format succeeded")
		}
		if errors.Is(err, uploader.ErrNotFound) || !strings.Contains(err.Error(), "HTTP 400") || !strings.Contains(err.Error(), `"bad"`) {
			t.Errorf("error %q should name the image and HTTP 400", err)
		}
	})

	t.Run("64 MiB upload streams", func(t *testing.T) {
		const size = 64 << 20
		id := create(t, cloud, map[string]string{"case": "stream"})
		data := &noise{left: size, state: 1, sum: md5.New()}

		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		if err := cloud.Upload(ctx, id, data, size); err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&after)

		// TotalAlloc counts every allocation, freed or not, so a buffered copy of the
		// image would show up here even if the collector had already reclaimed it.
		grew := after.TotalAlloc - before.TotalAlloc
		t.Logf("uploading %d bytes allocated %d bytes", size, grew)
		if grew > size/8 {
			t.Errorf("uploading %d bytes allocated %d bytes; the data is being buffered", size, grew)
		}
		img, err := cloud.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if want := hex.EncodeToString(data.sum.Sum(nil)); img.Status != "active" || img.Size != size || img.Checksum != want {
			t.Errorf("image = status %s size %d checksum %s, want active %d %s", img.Status, img.Size, img.Checksum, size, want)
		}
	})
}

// noise is size bytes of pseudo-random data made as it is read, with their md5.
type noise struct {
	left  int64
	state uint64
	sum   hash.Hash
}

func (n *noise) Read(p []byte) (int, error) {
	if n.left == 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > n.left {
		p = p[:n.left]
	}
	for i := range p {
		n.state = n.state*6364136223846793005 + 1442695040888963407
		p[i] = byte(n.state >> 56)
	}
	n.left -= int64(len(p))
	n.sum.Write(p)
	return len(p), nil
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func create(t *testing.T, c *Cloud, props map[string]string) string {
	t.Helper()
	id, err := c.Create(t.Context(), uploader.ImageSpec{Name: "test-" + t.Name(), DiskFormat: "raw", Properties: props})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func listIDs(t *testing.T, c *Cloud, match map[string]string) []string {
	t.Helper()
	imgs, err := c.List(t.Context(), match)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, 0, len(imgs))
	for _, img := range imgs {
		ids = append(ids, img.ID)
	}
	return ids
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

func getJSON(t *testing.T, u string, v any) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", u, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkUpload shows that allocations per upload stay flat whatever the image size.
func BenchmarkUpload(b *testing.B) {
	g := testenv.NewGlance(b)
	cloud, err := Open(b.Context(), Options{Cloud: g.Cloud, CloudsFile: g.CloudsFile})
	if err != nil {
		b.Fatal(err)
	}
	for _, size := range []int64{1 << 20, 16 << 20, 64 << 20} {
		b.Run(fmt.Sprintf("%dMiB", size>>20), func(b *testing.B) {
			b.SetBytes(size)
			for b.Loop() {
				id, err := cloud.Create(b.Context(), uploader.ImageSpec{Name: "bench", DiskFormat: "raw"})
				if err != nil {
					b.Fatal(err)
				}
				if err := cloud.Upload(b.Context(), id, &noise{left: size, state: 1, sum: md5.New()}, size); err != nil {
					b.Fatal(err)
				}
				if err := cloud.Delete(b.Context(), id); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
