package openstack

import (
	"bytes"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/uploader"
)

// importTimeout bounds the wait for an import Glance runs in the background:
// a few MiB take well under a second.
const importTimeout = time.Minute

// importCloud is a Glance that takes images by import, behind the shared
// Keystone, and a Cloud of an account of its own that reaches it.
type importCloud struct {
	*Cloud
	glance  *testenv.Glance
	ks      *testenv.Keystone
	account testenv.Account
}

func newImportCloud(t *testing.T, opts testenv.GlanceImportOptions) *importCloud {
	t.Helper()
	ks := testenv.SharedKeystone(t)
	ic := &importCloud{ks: ks, glance: testenv.NewGlanceWithImport(t, ks, opts), account: ks.NewAccount(t)}
	clouds := writeFile(t, filepath.Join(t.TempDir(), "clouds.yaml"), "clouds:\n"+ks.CloudEntry("import", ic.glance.Endpoint, ic.account))
	c, err := Open(t.Context(), Options{Cloud: "import", CloudsFile: clouds})
	if err != nil {
		t.Fatal(err)
	}
	ic.Cloud = c
	return ic
}

// tasks reads the image's tasks from Glance itself, with a token of the
// account's own, as the check of what the Cloud makes of them.
func (ic *importCloud) tasks(t *testing.T, id string) []imageTask {
	t.Helper()
	tok, err := ic.ks.Login(t.Context(), testenv.PasswordAuth(ic.account.User, ic.account.Password, ic.account.Project))
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, ic.glance.Endpoint+"/v2/images/"+id+"/tasks", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Auth-Token", tok.ID)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var doc struct {
		Tasks []imageTask `json:"tasks"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET the tasks of image %s: %s, %v", id, resp.Status, err)
	}
	return doc.Tasks
}

// waitStatus waits until the image has the status, and fails the test at
// once if its import fails first.
func (ic *importCloud) waitStatus(t *testing.T, id, status string) uploader.CloudImage {
	t.Helper()
	var img uploader.CloudImage
	var failure string
	testenv.WaitFor(t, importTimeout, "image "+id+" "+status, func() bool {
		var err error
		if img, err = ic.Get(t.Context(), id); err != nil {
			t.Fatal(err)
		}
		if img.Status == status {
			return true
		}
		if failure, err = ic.ImportFailure(t.Context(), id); err != nil {
			t.Fatal(err)
		}
		if failure != "" {
			t.Fatalf("the import of image %s failed (status %s): %s\nglance log: %s", id, img.Status, failure, ic.glance.LogFile)
		}
		return false
	}, func() string { return fmt.Sprintf("last seen: %+v", img) })
	return img
}

// waitFailure waits until ImportFailure says the image's import failed, and
// returns what it says.
func (ic *importCloud) waitFailure(t *testing.T, id string) string {
	t.Helper()
	var failure string
	testenv.WaitFor(t, importTimeout, "the import of image "+id+" to fail", func() bool {
		var err error
		if failure, err = ic.ImportFailure(t.Context(), id); err != nil {
			t.Fatal(err)
		}
		return failure != ""
	})
	return failure
}

// checkGlancesWords checks that the failure of the image's import says what
// Glance's failed task says, and names that task.
func (ic *importCloud) checkGlancesWords(t *testing.T, id, failure string) {
	t.Helper()
	var failed []imageTask
	for _, task := range ic.tasks(t, id) {
		if task.Status == "failure" {
			failed = append(failed, task)
		}
	}
	if len(failed) != 1 || failed[0].Message == "" {
		t.Fatalf("Glance's tasks of image %s: %+v, want one failed with a message", id, failed)
	}
	for _, want := range []string{failed[0].Message, failed[0].ID} {
		if !strings.Contains(failure, want) {
			t.Errorf("failure %q does not say %q", failure, want)
		}
	}
}

func createImage(t *testing.T, c *Cloud, format string) string {
	t.Helper()
	id, err := c.Create(t.Context(), uploader.ImageSpec{Name: "import-" + t.Name(), DiskFormat: format,
		Properties: map[string]string{"case": t.Name()}})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// artifacts serves what web-download fetches and counts its GETs: the
// artifact, whose body waits for release when its path is /held/..., and a
// 404 at /missing. Its answers have a Content-Length, as object stores'
// do: Glance 25's web-download fails on one without.
type artifacts struct {
	*httptest.Server
	data    []byte
	gets    atomic.Int32
	asked   chan struct{} // a GET of /held/ came
	release chan struct{} // /held/ may answer
}

func newArtifacts(t *testing.T, data []byte) *artifacts {
	t.Helper()
	a := &artifacts{data: data, asked: make(chan struct{}, 1), release: make(chan struct{})}
	a.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			a.gets.Add(1)
		}
		switch {
		case r.URL.Path == "/missing":
			http.NotFound(w, r)
			return
		case strings.HasPrefix(r.URL.Path, "/held/"):
			select {
			case a.asked <- struct{}{}:
			default:
			}
			select {
			case <-a.release:
			case <-r.Context().Done():
				return
			}
		}
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(a.data))
	}))
	t.Cleanup(a.Close)
	return a
}

// TestImport: images imported by glance-direct and web-download into a real
// Glance behind Keystone that converts what it imports to raw, and imports
// that fail, told in Glance's words. The subtests share the Glance.
func TestImport(t *testing.T) {
	ic := newImportCloud(t, testenv.GlanceImportOptions{Methods: []string{GlanceDirect, WebDownload}, Convert: "raw"})
	ctx := t.Context()

	t.Run("import methods", func(t *testing.T) {
		got, err := ic.ImportMethods(ctx)
		if err != nil || !slices.Equal(got, []string{GlanceDirect, WebDownload}) {
			t.Errorf("import methods = %v, %v; want glance-direct and web-download", got, err)
		}
		for _, m := range []string{GlanceDirect, WebDownload} {
			if err := ic.CheckImportMethod(ctx, m); err != nil {
				t.Errorf("check %s: %v", m, err)
			}
		}
	})

	t.Run("glance-direct", func(t *testing.T) {
		id := createImage(t, ic.Cloud, "raw")
		const size = 3 << 20
		data := &noise{left: size, state: 11, sum: md5.New()}
		if err := ic.Stage(ctx, id, data, size); err != nil {
			t.Fatal(err)
		}
		if img, err := ic.Get(ctx, id); err != nil || img.Status != "uploading" {
			t.Fatalf("staged image = %+v, %v; want uploading", img, err)
		}
		if failure, err := ic.ImportFailure(ctx, id); failure != "" || err != nil {
			t.Errorf("before its import: failure %q, %v; want none", failure, err)
		}
		if err := ic.Import(ctx, id, GlanceDirect, ""); err != nil {
			t.Fatal(err)
		}
		img := ic.waitStatus(t, id, "active")
		if want := hex.EncodeToString(data.sum.Sum(nil)); img.Size != size || img.Checksum != want || img.DiskFormat != "raw" {
			t.Errorf("imported image = %+v; want raw, %d bytes, md5 %s", img, size, want)
		}
		if failure, err := ic.ImportFailure(ctx, id); failure != "" || err != nil {
			t.Errorf("after its import: failure %q, %v; want none", failure, err)
		}
		tasks := ic.tasks(t, id)
		if len(tasks) != 1 || tasks[0].Status != "success" || tasks[0].Input.ImportReq.Method.Name != GlanceDirect {
			t.Errorf("Glance's tasks of the image: %+v, want one glance-direct import that succeeded", tasks)
		}
	})

	t.Run("glance-direct of unknown size", func(t *testing.T) {
		id := createImage(t, ic.Cloud, "raw")
		data := []byte("staged without a Content-Length")
		if err := ic.Stage(ctx, id, io.MultiReader(bytes.NewReader(data[:7]), bytes.NewReader(data[7:])), -1); err != nil {
			t.Fatal(err)
		}
		if err := ic.Import(ctx, id, GlanceDirect, ""); err != nil {
			t.Fatal(err)
		}
		sum := md5.Sum(data)
		if img := ic.waitStatus(t, id, "active"); img.Size != int64(len(data)) || img.Checksum != hex.EncodeToString(sum[:]) {
			t.Errorf("imported image = %+v; want %d bytes, md5 %x", img, len(data), sum)
		}
	})

	t.Run("glance-direct converts a qcow2 to raw", func(t *testing.T) {
		qemuImg := testenv.RequireBinary(t, "qemu-img")
		// A disk of 8 MiB with data in its first MiB and its last 64 KiB, and
		// nothing between, which the qcow2 leaves out.
		const virtual = 8 << 20
		disk := make([]byte, virtual)
		io.ReadFull(&noise{left: 1 << 20, state: 12, sum: md5.New()}, disk[:1<<20])
		io.ReadFull(&noise{left: 64 << 10, state: 13, sum: md5.New()}, disk[virtual-64<<10:])
		dir := t.TempDir()
		raw, qcow2 := filepath.Join(dir, "disk.raw"), filepath.Join(dir, "disk.qcow2")
		if err := os.WriteFile(raw, disk, 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(qemuImg, "convert", "-f", "raw", "-O", "qcow2", raw, qcow2).CombinedOutput(); err != nil {
			t.Fatalf("qemu-img convert: %v\n%s", err, out)
		}
		f, err := os.Open(qcow2)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() >= virtual/2 {
			t.Fatalf("the qcow2 takes %d bytes of the disk's %d: it proves no conversion", st.Size(), virtual)
		}

		id := createImage(t, ic.Cloud, "qcow2")
		if err := ic.Stage(ctx, id, f, st.Size()); err != nil {
			t.Fatal(err)
		}
		if err := ic.Import(ctx, id, GlanceDirect, ""); err != nil {
			t.Fatal(err)
		}
		img := ic.waitStatus(t, id, "active")
		sum := md5.Sum(disk)
		if img.DiskFormat != "raw" || img.Size != virtual || img.Checksum != hex.EncodeToString(sum[:]) {
			t.Errorf("imported image = %s, %d bytes, md5 %s; want the disk as raw: %d bytes, md5 %x (the qcow2 staged had %d)",
				img.DiskFormat, img.Size, img.Checksum, virtual, sum, st.Size())
		}
	})

	t.Run("web-download", func(t *testing.T) {
		data := bytes.Repeat([]byte("fetched by Glance itself "), 40000)
		art := newArtifacts(t, data)
		id := createImage(t, ic.Cloud, "raw")
		if err := ic.Import(ctx, id, WebDownload, art.URL+"/held/image.raw"); err != nil {
			t.Fatal(err)
		}
		select {
		case <-art.asked:
		case <-time.After(importTimeout):
			t.Fatalf("Glance did not fetch the artifact in %s\nglance log: %s", importTimeout, ic.glance.LogFile)
		}
		// Glance marks the image importing before it fetches the data.
		if img, err := ic.Get(ctx, id); err != nil || img.Status != "importing" {
			t.Errorf("image while Glance fetches its data = %+v, %v; want importing", img, err)
		}
		close(art.release)
		img := ic.waitStatus(t, id, "active")
		sum := md5.Sum(data)
		if img.Size != int64(len(data)) || img.Checksum != hex.EncodeToString(sum[:]) {
			t.Errorf("imported image = %+v; want %d bytes, md5 %x", img, len(data), sum)
		}
		if n := art.gets.Load(); n != 1 {
			t.Errorf("the artifact was fetched %d times, want once, by Glance", n)
		}
	})

	t.Run("web-download of a missing artifact fails in Glance's words", func(t *testing.T) {
		art := newArtifacts(t, nil)
		id := createImage(t, ic.Cloud, "raw")
		if err := ic.Import(ctx, id, WebDownload, art.URL+"/missing"); err != nil {
			t.Fatal(err)
		}
		failure := ic.waitFailure(t, id)
		t.Logf("failure: %s", failure)
		ic.checkGlancesWords(t, id, failure)
		if !strings.Contains(failure, WebDownload) {
			t.Errorf("failure %q does not name the method", failure)
		}
		if n := art.gets.Load(); n != 1 {
			t.Errorf("the artifact was asked for %d times, want once", n)
		}
		if img, err := ic.Get(ctx, id); err != nil || img.Status != "queued" {
			t.Errorf("image after the failed import = %+v, %v; want queued again", img, err)
		}
	})

	t.Run("a conversion that fails is told while the image stays importing", func(t *testing.T) {
		id := createImage(t, ic.Cloud, "qcow2")
		if err := ic.Stage(ctx, id, strings.NewReader(strings.Repeat("not a qcow2 ", 1000)), -1); err != nil {
			t.Fatal(err)
		}
		if err := ic.Import(ctx, id, GlanceDirect, ""); err != nil {
			t.Fatal(err)
		}
		failure := ic.waitFailure(t, id)
		t.Logf("failure: %s", failure)
		ic.checkGlancesWords(t, id, failure)
		img, err := ic.Get(ctx, id)
		if err != nil || img.Status == "active" {
			t.Fatalf("image after the failed import = %+v, %v; want not active", img, err)
		}
		t.Logf("the image's status after the failed conversion: %s", img.Status)
		if err := ic.Delete(ctx, id); err != nil {
			t.Fatalf("delete the image whose import failed: %v", err)
		}
		if _, err := ic.Get(ctx, id); !errors.Is(err, uploader.ErrNotFound) {
			t.Errorf("after delete: %v, want not found", err)
		}
	})

	t.Run("refusals come at once", func(t *testing.T) {
		id := createImage(t, ic.Cloud, "raw")
		// Glance fetches nothing from loopback but the host it was told of.
		other := fmt.Sprintf("http://127.0.0.2:%d/image.raw", testenv.FreePort(t))
		for _, tc := range []struct {
			method, uri string
			want        []string
		}{
			{WebDownload, other, []string{"HTTP 400", "does not pass filtering", other}},
			{GlanceDirect, "", []string{"HTTP 409", "staged"}},
			{WebDownload, "", []string{"no URL"}},
			{GlanceDirect, other, []string{"only web-download"}},
		} {
			err := ic.Import(ctx, id, tc.method, tc.uri)
			if err == nil {
				t.Errorf("import by %s of %q succeeded", tc.method, tc.uri)
				continue
			}
			for _, want := range append(tc.want, id, tc.method) {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
		}
		if err := ic.Import(ctx, "00000000-0000-0000-0000-00000000beef", GlanceDirect, ""); !errors.Is(err, uploader.ErrNotFound) {
			t.Errorf("import of a missing image: %v, want not found", err)
		}
		if _, err := ic.ImportFailure(ctx, "00000000-0000-0000-0000-00000000beef"); !errors.Is(err, uploader.ErrNotFound) {
			t.Errorf("import failure of a missing image: %v, want not found", err)
		}
		if img, err := ic.Get(ctx, id); err != nil || img.Status != "queued" {
			t.Errorf("image after refused imports = %+v, %v; want queued", img, err)
		}
	})
}

// countingReader counts the bytes read from it.
type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// TestImportMethodNotOffered: a cloud that offers web-download alone is asked
// for glance-direct: the error names the method and what the cloud offers,
// and no data moves. A plain upload is as before.
func TestImportMethodNotOffered(t *testing.T) {
	ic := newImportCloud(t, testenv.GlanceImportOptions{Methods: []string{WebDownload}})
	ctx := t.Context()
	if got, err := ic.ImportMethods(ctx); err != nil || !slices.Equal(got, []string{WebDownload}) {
		t.Errorf("import methods = %v, %v; want web-download", got, err)
	}
	check := func(t *testing.T, err error) {
		t.Helper()
		var notOffered *ImportMethodError
		if !errors.As(err, &notOffered) || notOffered.Method != GlanceDirect || !slices.Equal(notOffered.Offered, []string{WebDownload}) {
			t.Fatalf("err = %v, want the method glance-direct not offered, web-download offered", err)
		}
		for _, want := range []string{`"glance-direct"`, "offers web-download", ic.Name()} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %q", err, want)
			}
		}
	}

	t.Run("stage", func(t *testing.T) {
		id := createImage(t, ic.Cloud, "raw")
		data := &countingReader{r: strings.NewReader("never sent")}
		err := ic.Stage(ctx, id, data, 10)
		check(t, err)
		if n := data.n.Load(); n != 0 {
			t.Errorf("%d bytes read for a stage the cloud refuses", n)
		}
		if img, err := ic.Get(ctx, id); err != nil || img.Status != "queued" {
			t.Errorf("image = %+v, %v; want queued", img, err)
		}
	})

	t.Run("import", func(t *testing.T) {
		id := createImage(t, ic.Cloud, "raw")
		check(t, ic.Import(ctx, id, GlanceDirect, ""))
		check(t, ic.CheckImportMethod(ctx, GlanceDirect))
		if err := ic.CheckImportMethod(ctx, WebDownload); err != nil {
			t.Errorf("check web-download: %v", err)
		}
	})

	t.Run("upload is as before", func(t *testing.T) {
		id := createImage(t, ic.Cloud, "raw")
		data := []byte("put, not imported")
		if err := ic.Upload(ctx, id, bytes.NewReader(data), int64(len(data))); err != nil {
			t.Fatal(err)
		}
		img, err := ic.Get(ctx, id)
		sum := md5.Sum(data)
		if err != nil || img.Status != "active" || img.Checksum != hex.EncodeToString(sum[:]) {
			t.Errorf("uploaded image = %+v, %v; want active with md5 %x", img, err, sum)
		}
		if tasks := ic.tasks(t, id); len(tasks) != 0 {
			t.Errorf("an upload ran tasks: %+v", tasks)
		}
	})

	t.Run("a cloud that offers none says so", func(t *testing.T) {
		err := &ImportMethodError{Cloud: "c", Method: WebDownload}
		if want := `cloud c does not offer the image import method "web-download": it offers none`; err.Error() != want {
			t.Errorf("error = %q, want %q", err, want)
		}
	})
}
