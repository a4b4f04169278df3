package artifacts

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"github.com/nodepool-builder/nodepool-builder/internal/diskspace"
	"github.com/nodepool-builder/nodepool-builder/internal/partial"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/internal/untrusted"
	"github.com/nodepool-builder/nodepool-builder/progress"
)

// testImage returns size bytes that compress to roughly half, so a compressed stream
// spans many blocks.
func testImage(size int) []byte {
	r := rand.New(rand.NewPCG(1, 2))
	b := make([]byte, size)
	for i := range b {
		b[i] = "abcdefghijklmnop"[r.IntN(16)]
	}
	return b
}

func compress(t testing.TB, comp string, data []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	switch comp {
	case "":
		return data
	case "zst":
		w, err := zstd.NewWriter(&buf)
		if err != nil {
			t.Fatal(err)
		}
		w.Write(data)
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	case "gz":
		w := gzip.NewWriter(&buf)
		w.Write(data)
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

func suffix(comp string) string {
	if comp == "" {
		return ""
	}
	return "." + comp
}

func digests(data []byte) (string, string) {
	s, m := sha256.Sum256(data), md5.Sum(data)
	return hex.EncodeToString(s[:]), hex.EncodeToString(m[:])
}

type seenRequest struct {
	method, rangeHeader string
}

// fileServer serves one file with http.ServeContent and can misbehave on request: drop
// the connection of the first GET after some bytes, hang it, or ignore Range.
type fileServer struct {
	content []byte

	dropAfter       int64 // the first GET breaks off after this many body bytes
	hangAfter       int64 // the first GET stops sending after this many body bytes
	ignoreRange     bool  // always answer 200 with the whole file
	advertiseRanges bool  // with ignoreRange: still claim Accept-Ranges: bytes
	failFirst       int   // answer the first failFirst requests with failStatus
	failStatus      int

	hung    chan struct{} // closed once the hanging GET has sent its bytes
	release chan struct{} // closed when the test ends

	mu     sync.Mutex
	seen   []seenRequest
	served int64
	gets   int
}

func newFileServer(t *testing.T, fs *fileServer) *httptest.Server {
	fs.hung = make(chan struct{})
	fs.release = make(chan struct{})
	srv := httptest.NewServer(fs)
	t.Cleanup(func() {
		close(fs.release)
		srv.Close()
	})
	return srv
}

func (fs *fileServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if rest, ok := strings.CutPrefix(r.URL.Path, "/r/"); ok {
		http.Redirect(w, r, "/"+rest, http.StatusFound)
		return
	}
	fs.mu.Lock()
	fs.seen = append(fs.seen, seenRequest{r.Method, r.Header.Get("Range")})
	fail := len(fs.seen) <= fs.failFirst
	var limit, hang int64
	if r.Method == http.MethodGet {
		fs.gets++
		if fs.gets == 1 {
			limit, hang = fs.dropAfter, fs.hangAfter
		}
	}
	fs.mu.Unlock()
	if fail {
		http.Error(w, "try later", fs.failStatus)
		return
	}
	cw := &cutWriter{ResponseWriter: w, fs: fs, limit: limit, hang: hang, req: r}
	if fs.ignoreRange {
		if fs.advertiseRanges {
			w.Header().Set("Accept-Ranges", "bytes")
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(fs.content)))
		if r.Method == http.MethodGet {
			cw.Write(fs.content)
		}
		return
	}
	http.ServeContent(cw, r, "", time.Time{}, bytes.NewReader(fs.content))
}

func (fs *fileServer) requests() []seenRequest {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return append([]seenRequest(nil), fs.seen...)
}

func (fs *fileServer) bytesServed() int64 {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.served
}

// rangeStarts lists the start offsets of the Range requests the server saw.
func (fs *fileServer) rangeStarts(t *testing.T) []int64 {
	t.Helper()
	var out []int64
	for _, r := range fs.requests() {
		if r.method != http.MethodGet || r.rangeHeader == "" {
			continue
		}
		n, err := rangeStart(r.rangeHeader)
		if err != nil {
			t.Fatalf("server saw %v", err)
		}
		out = append(out, n)
	}
	return out
}

// cutWriter counts body bytes and breaks off or hangs the response at its limit.
type cutWriter struct {
	http.ResponseWriter
	fs          *fileServer
	limit, hang int64
	n           int64
	req         *http.Request
}

func (c *cutWriter) Write(p []byte) (int, error) {
	stop := c.limit
	if c.hang > 0 {
		stop = c.hang
	}
	if stop > 0 && c.n+int64(len(p)) > stop {
		p = p[:stop-c.n]
		c.ResponseWriter.Write(p)
		c.count(len(p))
		c.ResponseWriter.(http.Flusher).Flush()
		if c.hang > 0 {
			close(c.fs.hung)
			select {
			case <-c.req.Context().Done():
			case <-c.fs.release:
			}
		}
		panic(http.ErrAbortHandler)
	}
	n, err := c.ResponseWriter.Write(p)
	c.count(n)
	return n, err
}

func (c *cutWriter) count(n int) {
	c.n += int64(n)
	c.fs.mu.Lock()
	c.fs.served += int64(n)
	c.fs.mu.Unlock()
}

// testFetcher returns a Fetcher whose test downloads keep their files in a
// directory of its own (partialDir), as the store's partial directory holds
// them in the builder.
func testFetcher(t testing.TB) *Fetcher {
	f := &Fetcher{
		Logger:       slog.New(slog.DiscardHandler),
		Backoff:      time.Millisecond,
		StallTimeout: 5 * time.Second,
	}
	dir := filepath.Join(t.TempDir(), ".partial")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	partialDirs.Store(f, dir)
	t.Cleanup(func() { partialDirs.Delete(f) })
	return f
}

// partialDirs is the directory of each test Fetcher's downloads.
var partialDirs sync.Map

// partialDir is the directory in which f's test downloads keep their files.
func partialDir(f *Fetcher) string {
	dir, _ := partialDirs.Load(f)
	return dir.(string)
}

// files names the files of a download under key in f's partial directory that
// ends at dest, as the store names them: <key>.download and so on beside the
// verified file, here kept apart from them at dest.
func files(f *Fetcher, key, dest string) partial.Files {
	fs := partial.Of(filepath.Join(partialDir(f), key))
	fs.Dest = dest
	return fs
}

// checkFetched asserts that dest holds want, that the result describes it and that no
// partial file is left behind.
func checkFetched(t *testing.T, f *Fetcher, res Result, dest string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(dest)
	if err != nil {
		t.Fatalf("read dest: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("dest has %d bytes that differ from the %d expected", len(got), len(want))
	}
	wantSHA, wantMD5 := digests(want)
	if res.SHA256 != wantSHA || res.MD5 != wantMD5 || res.Size != int64(len(want)) {
		t.Errorf("result = %+v, want sha256 %s md5 %s size %d", res, wantSHA, wantMD5, len(want))
	}
	checkNoPartials(t, f)
}

func checkNoPartials(t *testing.T, f *Fetcher) {
	t.Helper()
	entries, err := os.ReadDir(partialDir(f))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("partial file left behind: %s", e.Name())
	}
}

func TestFetch(t *testing.T) {
	image := testImage(3 << 20)
	sha, md := digests(image)
	tests := []struct {
		name     string
		comp     string
		redirect bool
		sha, md5 string
	}{
		{name: "plain"},
		{name: "plain with checksums", sha: sha, md5: md},
		{name: "zst", comp: "zst", sha: strings.ToUpper(sha)},
		{name: "gz", comp: "gz", md5: md},
		{name: "zst through a redirect", comp: "zst", redirect: true, sha: sha},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			served := compress(t, tt.comp, image)
			fs := &fileServer{content: served}
			srv := newFileServer(t, fs)
			path := "/debian.raw" + suffix(tt.comp)
			if tt.redirect {
				path = "/r" + path
			}
			f := testFetcher(t)
			dest := filepath.Join(t.TempDir(), "debian-0001.raw")
			res, err := f.Fetch(context.Background(), Request{
				URL: srv.URL + path, Files: files(f, "debian-0001.raw", dest), SHA256: tt.sha, MD5: tt.md5,
			})
			if err != nil {
				t.Fatalf("Fetch: %v", err)
			}
			checkFetched(t, f, res, dest, image)
			if res.Downloaded != int64(len(served)) || fs.bytesServed() != int64(len(served)) {
				t.Errorf("downloaded %d, server sent %d, want %d", res.Downloaded, fs.bytesServed(), len(served))
			}
		})
	}
}

func TestFetchChecksumMismatch(t *testing.T) {
	image := testImage(1 << 20)
	sha, md := digests(image)
	wrong := strings.Repeat("0", 64)
	tests := []struct {
		name, comp, sha, md5, want string
	}{
		{name: "sha256 plain", sha: wrong, md5: md, want: "sha256 expected " + wrong + ", got " + sha},
		{name: "sha256 zst", comp: "zst", sha: wrong, want: "sha256 expected " + wrong + ", got " + sha},
		{name: "md5 gz", comp: "gz", sha: sha, md5: wrong[:32], want: "md5 expected " + wrong[:32] + ", got " + md},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := &fileServer{content: compress(t, tt.comp, image)}
			srv := newFileServer(t, fs)
			f := testFetcher(t)
			dest := filepath.Join(t.TempDir(), "img.raw")
			_, err := f.Fetch(context.Background(), Request{
				URL: srv.URL + "/img.raw" + suffix(tt.comp), Files: files(f, "img.raw", dest), SHA256: tt.sha, MD5: tt.md5,
			})
			if !errors.Is(err, ErrChecksum) {
				t.Fatalf("Fetch error = %v, want ErrChecksum", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not say %q", err, tt.want)
			}
			if _, err := os.Stat(dest); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("dest exists after a checksum mismatch (stat: %v)", err)
			}
			checkNoPartials(t, f)
			if n := len(fs.requests()); n != 1 {
				t.Errorf("server saw %d requests; a mismatch must not be retried", n)
			}
		})
	}
}

func TestFetchResumesAfterDrop(t *testing.T) {
	image := testImage(3 << 20)
	for _, comp := range []string{"", "zst", "gz"} {
		t.Run("comp="+comp, func(t *testing.T) {
			served := compress(t, comp, image)
			drop := int64(len(served)/2 + 12345)
			fs := &fileServer{content: served, dropAfter: drop}
			srv := newFileServer(t, fs)
			f := testFetcher(t)
			dest := filepath.Join(t.TempDir(), "img.raw")
			sha, _ := digests(image)
			res, err := f.Fetch(context.Background(), Request{
				URL: srv.URL + "/img.raw" + suffix(comp), Files: files(f, "img.raw", dest), SHA256: sha,
			})
			if err != nil {
				t.Fatalf("Fetch: %v", err)
			}
			checkFetched(t, f, res, dest, image)
			starts := fs.rangeStarts(t)
			if len(starts) != 1 || starts[0] <= 0 || starts[0] > drop {
				t.Errorf("Range starts = %v, want one in (0, %d]", starts, drop)
			}
			total := fs.bytesServed()
			if total >= 2*int64(len(served)) {
				t.Errorf("server sent %d bytes for a %d-byte file: not resumed", total, len(served))
			}
			if res.Downloaded < int64(len(served)) || res.Downloaded > total {
				t.Errorf("Downloaded = %d, want between %d and %d", res.Downloaded, len(served), total)
			}
		})
	}
}

func TestFetchResumesAfterRestart(t *testing.T) {
	image := testImage(3 << 20)
	for _, comp := range []string{"", "zst"} {
		t.Run("comp="+comp, func(t *testing.T) {
			served := compress(t, comp, image)
			hang := int64(len(served) / 3)
			fs := &fileServer{content: served, hangAfter: hang}
			srv := newFileServer(t, fs)
			f := testFetcher(t)
			dest := filepath.Join(t.TempDir(), "img.raw")
			req := Request{URL: srv.URL + "/img.raw" + suffix(comp), Files: files(f, "img.raw", dest)}

			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			go func() {
				_, err := f.Fetch(ctx, req)
				errc <- err
			}()
			select {
			case <-fs.hung:
			case err := <-errc:
				t.Fatalf("Fetch returned %v before the server hung", err)
			case <-time.After(10 * time.Second):
				t.Fatal("the download never reached the hanging point")
			}
			partial := filepath.Join(partialDir(f), "img.raw.download")
			waitForSize(t, partial, hang)
			cancel()
			if err := <-errc; !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled Fetch returned %v, want context.Canceled", err)
			}
			if fi, err := os.Stat(partial); err != nil || fi.Size() != hang {
				t.Fatalf("partial after cancel: %v, %v; want %d bytes", fi, err, hang)
			}
			if _, err := os.Stat(dest); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("dest exists after a cancelled fetch (stat: %v)", err)
			}

			// A new process: a fresh Fetcher over the same directory.
			f2 := testFetcher(t)
			partialDirs.Store(f2, partialDir(f))
			res, err := f2.Fetch(context.Background(), req)
			if err != nil {
				t.Fatalf("resumed Fetch: %v", err)
			}
			checkFetched(t, f2, res, dest, image)
			if starts := fs.rangeStarts(t); len(starts) != 1 || starts[0] != hang {
				t.Errorf("Range starts = %v, want [%d]", starts, hang)
			}
			if want := int64(len(served)) - hang; res.Downloaded != want {
				t.Errorf("resumed Fetch downloaded %d bytes, want %d", res.Downloaded, want)
			}
		})
	}
}

func waitForSize(t *testing.T, path string, size int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		fi, err := os.Stat(path)
		if err == nil && fi.Size() == size {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never reached %d bytes (stat: %v, %v)", path, size, fi, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestFetchServerIgnoresRange(t *testing.T) {
	image := testImage(2 << 20)
	tests := []struct {
		name      string
		comp      string
		advertise bool
	}{
		{name: "claims ranges plain", advertise: true},
		{name: "claims ranges zst", comp: "zst", advertise: true},
		{name: "no ranges plain"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			served := compress(t, tt.comp, image)
			fs := &fileServer{content: served, dropAfter: int64(len(served) / 2),
				ignoreRange: true, advertiseRanges: tt.advertise}
			srv := newFileServer(t, fs)
			f := testFetcher(t)
			dest := filepath.Join(t.TempDir(), "img.raw")
			res, err := f.Fetch(context.Background(), Request{
				URL: srv.URL + "/img.raw" + suffix(tt.comp), Files: files(f, "img.raw", dest),
			})
			if err != nil {
				t.Fatalf("Fetch: %v", err)
			}
			checkFetched(t, f, res, dest, image)
			reqs := fs.requests()
			if last := reqs[len(reqs)-1]; last.method != http.MethodGet || last.rangeHeader != "" {
				t.Errorf("last request = %+v, want a GET of the whole file", last)
			}
			if starts := fs.rangeStarts(t); tt.advertise != (len(starts) > 0) {
				t.Errorf("Range starts = %v; server advertised ranges: %v", starts, tt.advertise)
			}
		})
	}
}

func TestFetchRejectsBadRequests(t *testing.T) {
	tests := []struct {
		name string
		req  Request
		want string
	}{
		{"ftp", Request{URL: "ftp://example.com/img.raw", Files: partial.Of("d")}, `unsupported URL scheme "ftp"`},
		{"file", Request{URL: "file:///etc/passwd", Files: partial.Of("d")}, `unsupported URL scheme "file"`},
		{"no scheme", Request{URL: "/srv/img.raw", Files: partial.Of("d")}, `unsupported URL scheme ""`},
		{"no host", Request{URL: "http:///img.raw", Files: partial.Of("d")}, "no host"},
		{"partial files not named", Request{URL: "http://h/img", Files: partial.Files{Dest: "d"}}, "not all the files of the download"},
		{"no dest", Request{URL: "http://h/img"}, "no destination"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := testFetcher(t)
			_, err := f.Fetch(context.Background(), tt.req)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Fetch error = %v, want one saying %q", err, tt.want)
			}
			checkNoPartials(t, f)
		})
	}
}

func TestFetchStatusRetries(t *testing.T) {
	image := testImage(64 << 10)
	tests := []struct {
		name      string
		status    int
		failFirst int
		attempts  int
		wantErr   string
		wantReqs  int
	}{
		{name: "503 then success", status: 503, failFirst: 2, attempts: 5, wantReqs: 3},
		{name: "503 until giving up", status: 503, failFirst: 100, attempts: 3, wantErr: "gave up after 3 attempts", wantReqs: 3},
		{name: "404 is final", status: 404, failFirst: 100, attempts: 5, wantErr: "404", wantReqs: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := &fileServer{content: image, failFirst: tt.failFirst, failStatus: tt.status}
			srv := newFileServer(t, fs)
			f := testFetcher(t)
			f.Attempts = tt.attempts
			dest := filepath.Join(t.TempDir(), "img.raw")
			res, err := f.Fetch(context.Background(), Request{URL: srv.URL + "/img.raw", Files: files(f, "img.raw", dest)})
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Fetch: %v", err)
				}
				checkFetched(t, f, res, dest, image)
			} else if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Fetch error = %v, want one saying %q", err, tt.wantErr)
			}
			if n := len(fs.requests()); n != tt.wantReqs {
				t.Errorf("server saw %d requests, want %d", n, tt.wantReqs)
			}
		})
	}
}

func TestFetchStallAbortsAttempt(t *testing.T) {
	image := testImage(1 << 20)
	fs := &fileServer{content: image, hangAfter: 300 << 10}
	srv := newFileServer(t, fs)
	f := testFetcher(t)
	f.StallTimeout = 200 * time.Millisecond
	dest := filepath.Join(t.TempDir(), "img.raw")
	start := time.Now()
	res, err := f.Fetch(context.Background(), Request{URL: srv.URL + "/img.raw", Files: files(f, "img.raw", dest)})
	if err != nil {
		t.Fatalf("Fetch: %v", err)
	}
	checkFetched(t, f, res, dest, image)
	if starts := fs.rangeStarts(t); len(starts) != 1 || starts[0] != 300<<10 {
		t.Errorf("Range starts = %v, want [%d]", starts, 300<<10)
	}
	if d := time.Since(start); d > 4*time.Second {
		t.Errorf("a stalled attempt took %s to abort", d)
	}
}

func TestFetchNoSpace(t *testing.T) {
	var gets int
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		gets++
		mu.Unlock()
		// An exabyte fits on no test machine.
		w.Header().Set("Content-Length", strconv.FormatInt(1<<60, 10))
	}))
	defer srv.Close()
	f := testFetcher(t)
	_, err := f.Fetch(context.Background(), Request{URL: srv.URL + "/huge.raw.zst", Files: files(f, "huge", filepath.Join(t.TempDir(), "x"))})
	if !errors.Is(err, diskspace.ErrNoSpace) {
		t.Fatalf("Fetch error = %v, want diskspace.ErrNoSpace", err)
	}
	if !strings.Contains(err.Error(), partialDir(f)) || !strings.Contains(err.Error(), fmt.Sprint(int64(2<<60))) {
		t.Errorf("error %q does not name the directory and the bytes needed", err)
	}
	if gets != 1 {
		t.Errorf("server saw %d requests; a lack of space must not be retried", gets)
	}
}

// TestFetchExistingPartial starts from a partial download as a process that died between
// transfer and rename, or a confused one, may leave it.
func TestFetchExistingPartial(t *testing.T) {
	image := testImage(256 << 10)
	sha, _ := digests(image)
	tests := []struct {
		name           string
		partial        []byte
		wantErr        error
		wantDownloaded int64
	}{
		{name: "complete", partial: image},
		{name: "complete but damaged", partial: append([]byte("X"), image[1:]...), wantErr: ErrChecksum},
		{name: "longer than the file", partial: append(bytes.Clone(image), "junk"...), wantDownloaded: int64(len(image))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := &fileServer{content: image}
			srv := newFileServer(t, fs)
			f := testFetcher(t)
			if err := os.MkdirAll(partialDir(f), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(partialDir(f), "img.raw.download"), tt.partial, 0o644); err != nil {
				t.Fatal(err)
			}
			dest := filepath.Join(t.TempDir(), "img.raw")
			res, err := f.Fetch(context.Background(), Request{URL: srv.URL + "/img.raw", Files: files(f, "img.raw", dest), SHA256: sha})
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Fetch error = %v, want %v", err, tt.wantErr)
				}
				checkNoPartials(t, f)
			} else {
				if err != nil {
					t.Fatalf("Fetch: %v", err)
				}
				checkFetched(t, f, res, dest, image)
			}
			if res.Downloaded != tt.wantDownloaded || fs.bytesServed() != tt.wantDownloaded {
				t.Errorf("downloaded %d, server sent %d body bytes, want %d", res.Downloaded, fs.bytesServed(), tt.wantDownloaded)
			}
		})
	}
}

func TestFetchCorruptStream(t *testing.T) {
	for _, comp := range []string{"zst", "gz"} {
		t.Run(comp, func(t *testing.T) {
			fs := &fileServer{content: testImage(128 << 10)} // not compressed at all
			srv := newFileServer(t, fs)
			f := testFetcher(t)
			dest := filepath.Join(t.TempDir(), "img.raw")
			_, err := f.Fetch(context.Background(), Request{URL: srv.URL + "/img.raw." + comp, Files: files(f, "img.raw", dest)})
			var de *decodeError
			if !errors.As(err, &de) {
				t.Fatalf("Fetch error = %v, want a decompression error", err)
			}
			if n := len(fs.requests()); n != 1 {
				t.Errorf("server saw %d requests; a corrupt stream must not be refetched", n)
			}
			checkNoPartials(t, f)
		})
	}
}

func TestFetchTracksProgress(t *testing.T) {
	// The server sends a chunk, then waits until the tracker shows it before the next:
	// Done grows while the download runs, whatever the machine's speed. The last
	// byte comes only once the tracker has shown every chunk, so the download
	// (and with it its task) cannot end before the test has seen the last count.
	const chunks, chunk = 5, 16 << 10
	const total = chunks*chunk + 1
	shown := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(total))
		for range chunks {
			w.Write(make([]byte, chunk))
			w.(http.Flusher).Flush()
			select {
			case <-shown:
			case <-r.Context().Done():
				return
			}
		}
		w.Write([]byte{0})
	}))
	defer srv.Close()
	tr := progress.NewTracker()
	f := testFetcher(t)
	f.Progress = tr
	f.Connections = 1
	errc := make(chan error, 1)
	go func() {
		_, err := f.Fetch(context.Background(), Request{URL: srv.URL + "/img.raw?token=secret", Files: files(f, "img-0001.raw.part", filepath.Join(t.TempDir(), "img")), Label: "img-0001.raw"})
		errc <- err
	}()
	for i := range chunks {
		deadline := time.Now().Add(10 * time.Second)
		for {
			run := tr.Running()
			if len(run) == 1 && run[0].Done >= int64((i+1)*chunk) {
				s := run[0]
				if s.Kind != progress.Download || s.Subject != "img-0001.raw" || s.Total != total {
					t.Fatalf("task = %+v, want a download of img-0001.raw of %d bytes", s, total)
				}
				break
			}
			select {
			case err := <-errc:
				t.Fatalf("the download ended (%v) before the tracker showed chunk %d", err, i+1)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("after chunk %d the tracker shows %+v, want one task with %d bytes done", i+1, run, (i+1)*chunk)
			}
			time.Sleep(time.Millisecond)
		}
		shown <- struct{}{}
	}
	if err := <-errc; err != nil {
		t.Fatalf("Fetch: %v", err)
	}
	if run := tr.Running(); len(run) != 0 {
		t.Errorf("tasks after the download: %+v, want none", run)
	}
}

// streamHandler serves size generated bytes without holding them, and reports the sha256
// of what it sent on sums.
func streamHandler(size int64, sums chan<- string) http.Handler {
	block := make([]byte, 1<<20)
	rand.NewChaCha8([32]byte{7}).Read(block)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
		h := sha256.New()
		out := io.MultiWriter(w, h)
		for i, left := uint64(0), size; left > 0; i++ {
			// Vary each block so the stream does not repeat.
			block[0], block[1], block[2] = byte(i), byte(i>>8), byte(i>>16)
			n := min(left, int64(len(block)))
			if _, err := out.Write(block[:n]); err != nil {
				return
			}
			left -= n
		}
		if sums != nil {
			sums <- hex.EncodeToString(h.Sum(nil))
		}
	})
}

func TestFetchMemoryStaysFlat(t *testing.T) {
	if testing.Short() && os.Getenv("CI") != "true" {
		t.Skip("streams 256 MiB")
	}
	const size = 256 << 20
	t.Run("one stream", func(t *testing.T) {
		sums := make(chan string, 1)
		srv := httptest.NewServer(streamHandler(size, sums))
		defer srv.Close()
		res := fetchWatchingHeap(t, testFetcher(t), srv.URL+"/big.raw", size)
		if want := <-sums; res.SHA256 != want {
			t.Errorf("sha256 %s, want %s", res.SHA256, want)
		}
	})
	t.Run("8 ranges", func(t *testing.T) {
		srv := cappedServer(t, size, 0)
		f := testFetcher(t)
		f.Connections = 8
		f.FastStream = -1 // a loopback stream is fast: ranges all the same
		fetchWatchingHeap(t, f, srv.URL+"/big.raw", size)
	})
}

// fetchWatchingHeap fetches a file of size bytes while sampling the heap in use, and
// fails the test when it grows by more than 32 MiB.
func fetchWatchingHeap(t *testing.T, f *Fetcher, url string, size int64) Result {
	t.Helper()
	dest := filepath.Join(t.TempDir(), "big.raw")
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapInuse
	peak := base
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		var ms runtime.MemStats
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				runtime.ReadMemStats(&ms)
				peak = max(peak, ms.HeapInuse)
			}
		}
	})
	res, err := f.Fetch(context.Background(), Request{URL: url, Files: files(f, "big.raw", dest)})
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatalf("Fetch: %v", err)
	}
	if fi, err := os.Stat(dest); err != nil || fi.Size() != size || res.Size != size {
		t.Errorf("dest: %v, %v, result %+v; want %d bytes", fi, err, res, size)
	}
	growth := int64(peak) - int64(base)
	t.Logf("heap in use grew by %d KiB for a %d MiB download", growth>>10, size>>20)
	if growth > 32<<20 {
		t.Errorf("heap in use grew by %d MiB streaming %d MiB", growth>>20, size>>20)
	}
	return res
}

func BenchmarkFetch(b *testing.B) {
	const size = 64 << 20
	srv := httptest.NewServer(streamHandler(size, nil))
	defer srv.Close()
	f := testFetcher(b)
	dest := filepath.Join(b.TempDir(), "bench.raw")
	b.SetBytes(size)
	b.ReportAllocs()
	for b.Loop() {
		res, err := f.Fetch(context.Background(), Request{URL: srv.URL + "/bench.raw", Files: files(f, "bench.raw", dest)})
		if err != nil {
			b.Fatal(err)
		}
		if res.Size != size {
			b.Fatalf("fetched %d bytes, want %d", res.Size, size)
		}
	}
}

func TestFetchRedirects(t *testing.T) {
	image := testImage(64 << 10)
	serve := func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(image))
	}
	var mu sync.Mutex
	hits := map[string]int{}
	count := func(name string) {
		mu.Lock()
		hits[name]++
		mu.Unlock()
	}
	// plain and tls redirect /to-<name>/... to the named server; anything else is the file.
	var plainURL, tlsURL string
	route := func(name string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			count(name)
			switch {
			case r.URL.Path == "/loop":
				http.Redirect(w, r, "/loop", http.StatusFound)
			case r.URL.Path == "/to-ftp":
				http.Redirect(w, r, "ftp://files.example.com/img.raw?sig=topsecret", http.StatusFound)
			case strings.HasPrefix(r.URL.Path, "/to-http/"):
				http.Redirect(w, r, plainURL+"/"+strings.TrimPrefix(r.URL.Path, "/to-http/")+"?sig=topsecret", http.StatusFound)
			case strings.HasPrefix(r.URL.Path, "/to-https/"):
				http.Redirect(w, r, tlsURL+"/"+strings.TrimPrefix(r.URL.Path, "/to-https/"), http.StatusFound)
			default:
				serve(w, r)
			}
		}
	}
	plain := httptest.NewServer(route("http"))
	defer plain.Close()
	tlsSrv := httptest.NewTLSServer(route("https"))
	defer tlsSrv.Close()
	plainURL, tlsURL = plain.URL, tlsSrv.URL

	tests := []struct {
		name     string
		url      string
		wantErr  string // empty: the download succeeds
		wantHits map[string]int
	}{
		{name: "http to https", url: plainURL + "/to-https/img.raw", wantHits: map[string]int{"http": 1, "https": 1}},
		{name: "https to https", url: tlsURL + "/to-https/img.raw", wantHits: map[string]int{"https": 2}},
		{name: "https to http", url: tlsURL + "/to-http/img.raw",
			wantErr: "refused redirect from https to " + plainURL + "/img.raw?REDACTED", wantHits: map[string]int{"https": 1}},
		{name: "http to https to http", url: plainURL + "/to-https/to-http/img.raw",
			wantErr: "refused redirect from https to " + plainURL + "/img.raw?REDACTED", wantHits: map[string]int{"http": 1, "https": 1}},
		{name: "to ftp", url: plainURL + "/to-ftp",
			wantErr: "refused redirect to ftp://files.example.com/img.raw?REDACTED: only http and https", wantHits: map[string]int{"http": 1}},
		{name: "loop", url: plainURL + "/loop", wantErr: "stopped after 10 redirects", wantHits: map[string]int{"http": 11}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mu.Lock()
			clear(hits)
			mu.Unlock()
			client := tlsSrv.Client() // trusts the test certificate; serves http too
			f := testFetcher(t)
			f.HTTPClient = client
			dest := filepath.Join(t.TempDir(), "img.raw")
			// Both servers are the operator's: the redirects between them are allowed.
			hosts := &Hosts{}
			hosts.Name(mustPattern(t, "127.0.0.1"))
			res, err := f.Fetch(context.Background(), Request{URL: tt.url, Files: files(f, "img.raw", dest), Hosts: hosts})
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Fetch: %v", err)
				}
				checkFetched(t, f, res, dest, image)
			} else {
				if !errors.Is(err, untrusted.ErrUnsafe) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Fetch error = %v, want untrusted.ErrUnsafe saying %q", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), "topsecret") {
					t.Errorf("error %q shows the redirect's query", err)
				}
				checkNoPartials(t, f)
			}
			mu.Lock()
			got := maps.Clone(hits)
			mu.Unlock()
			if !maps.Equal(got, tt.wantHits) {
				t.Errorf("servers saw %v requests, want %v (a refused redirect is not retried)", got, tt.wantHits)
			}
			if client.CheckRedirect != nil {
				t.Errorf("Fetch changed the caller's HTTP client")
			}
		})
	}
}

// zstdFrames compresses data into one zstd frame that announces its content size, or into
// a stream that does not.
func zstdFrames(t testing.TB, data []byte, announceSize bool) []byte {
	t.Helper()
	var out []byte
	if announceSize {
		enc, err := zstd.NewWriter(nil)
		if err != nil {
			t.Fatal(err)
		}
		out = enc.EncodeAll(data, nil)
	} else {
		out = compress(t, "zst", data)
	}
	var h zstd.Header
	if err := h.Decode(out); err != nil || h.HasFCS != announceSize {
		t.Fatalf("zstd header: %+v, %v; want content size announced: %v", h, err, announceSize)
	}
	return out
}

func TestFetchSizeBound(t *testing.T) {
	const mib = 1 << 20
	image := testImage(2 * mib)
	small := testImage(mib / 2)
	chunked := func(body []byte) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			for p := body; len(p) > 0; p = p[min(len(p), 64<<10):] {
				w.Write(p[:min(len(p), 64<<10)]) // no Content-Length: chunked
				w.(http.Flusher).Flush()
			}
		}
	}
	served := func(body []byte) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(body))
		}
	}
	tests := []struct {
		name     string
		path     string
		handler  http.HandlerFunc
		size     int64 // Request.Size
		maxSize  int64 // Fetcher.MaxSize
		wantErr  error // nil: the download succeeds
		wantText string
		wantGets int
	}{
		{name: "exactly the declared size", path: "/img.raw", handler: served(image), size: 2 * mib},
		{name: "zst of exactly the declared size", path: "/img.raw.zst", handler: served(zstdFrames(t, image, true)), size: 2 * mib},
		{name: "Content-Length above the declared size", path: "/img.raw", handler: served(image), size: mib,
			wantErr: untrusted.ErrTooLarge, wantText: "the server announces 2097152 bytes, above the declared size of 1048576 bytes", wantGets: 1},
		{name: "Content-Length above MaxSize", path: "/img.raw", handler: served(image), maxSize: mib,
			wantErr: untrusted.ErrTooLarge, wantText: "above the maximum of 1048576 bytes", wantGets: 1},
		{name: "no Content-Length, more than MaxSize", path: "/img.raw", handler: chunked(image), maxSize: mib,
			wantErr: untrusted.ErrTooLarge, wantText: "the server sent more than the maximum of 1048576 bytes", wantGets: 1},
		{name: "zst announcing more than MaxSize", path: "/img.raw.zst", handler: served(zstdFrames(t, image, true)), maxSize: mib,
			wantErr: untrusted.ErrTooLarge, wantText: "the zstd frame announces 2097152 bytes, above the maximum", wantGets: 1},
		{name: "zst announcing nothing, more than the declared size", path: "/img.raw.zst", handler: chunked(zstdFrames(t, image, false)), size: mib,
			wantErr: untrusted.ErrTooLarge, wantText: "decompressed to more than the declared size of 1048576 bytes", wantGets: 1},
		{name: "zst whose first frame announces little", path: "/img.raw.zst",
			handler: served(append(zstdFrames(t, small, true), zstdFrames(t, image, true)...)), maxSize: mib,
			wantErr: untrusted.ErrTooLarge, wantText: "decompressed to more than the maximum", wantGets: 1},
		{name: "gz beyond MaxSize", path: "/img.raw.gz", handler: served(compress(t, "gz", image)), maxSize: mib,
			wantErr: untrusted.ErrTooLarge, wantText: "decompressed to more than the maximum", wantGets: 1},
		{name: "declared size above MaxSize", path: "/img.raw", handler: served(image), size: 2 * mib, maxSize: mib,
			wantErr: untrusted.ErrTooLarge, wantText: "declared size 2097152 bytes is above the maximum of 1048576"},
		{name: "shorter than declared", path: "/img.raw", handler: served(image), size: 3 * mib,
			wantErr: ErrChecksum, wantText: "size expected 3145728, got 2097152", wantGets: 1},
		{name: "zst shorter than declared", path: "/img.raw.zst", handler: served(zstdFrames(t, image, false)), size: 3 * mib,
			wantErr: ErrChecksum, wantText: "size expected 3145728, got 2097152", wantGets: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, gets := countGETs(t, tt.handler)
			f := testFetcher(t)
			f.MaxSize = tt.maxSize
			dest := filepath.Join(t.TempDir(), "img.raw")
			res, err := f.Fetch(context.Background(), Request{URL: srv.URL + tt.path, Files: files(f, "img.raw", dest), Size: tt.size})
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("Fetch: %v", err)
				}
				checkFetched(t, f, res, dest, image)
				return
			}
			if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.wantText) {
				t.Fatalf("Fetch error = %v, want %v saying %q", err, tt.wantErr, tt.wantText)
			}
			checkNoPartials(t, f)
			if _, err := os.Stat(dest); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("dest exists after a refused download (stat: %v)", err)
			}
			if n := gets(); n != tt.wantGets {
				t.Errorf("server saw %d GETs, want %d (a refusal is final)", n, tt.wantGets)
			}
		})
	}
}

func TestFetchWritesSparse(t *testing.T) {
	const size = 64 << 20
	image := make([]byte, size)
	copy(image, testImage(1<<20))
	copy(image[40<<20+123:], testImage(100<<10))
	image[50<<20] = 1
	// The last 13 MiB are zeros: only the final truncate gives the file its length.
	for _, announce := range []bool{true, false} {
		t.Run(fmt.Sprintf("content size announced %v", announce), func(t *testing.T) {
			fs := &fileServer{content: zstdFrames(t, image, announce)}
			srv := newFileServer(t, fs)
			f := testFetcher(t)
			dest := filepath.Join(filepath.Dir(partialDir(f)), "img.raw")
			if err := os.MkdirAll(partialDir(f), 0o755); err != nil {
				t.Fatal(err)
			}
			requireHoles(t, partialDir(f))
			sha, _ := digests(image)
			res, err := f.Fetch(context.Background(), Request{URL: srv.URL + "/img.raw.zst", Files: files(f, "img.raw", dest), SHA256: sha, Size: size})
			if err != nil {
				t.Fatalf("Fetch: %v", err)
			}
			checkFetched(t, f, res, dest, image)
			a := allocated(t, dest)
			t.Logf("%d KiB allocated for a %d MiB image", a>>10, size>>20)
			if a > 4<<20 {
				t.Errorf("%d bytes allocated for a %d-byte image with about 1.2 MiB of data: not sparse", a, size)
			}
		})
	}
}

// fullDisk is a pretend filesystem for Fetcher.freeSpace.
type fullDisk struct {
	mu    sync.Mutex
	free  []int64 // answers in turn; the last one repeats
	calls int
}

func (d *fullDisk) freeSpace(string) (int64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls++
	return d.free[min(d.calls, len(d.free))-1], nil
}

func TestFetchFreeSpace(t *testing.T) {
	const mib = 1 << 20
	zeros := make([]byte, 20*mib)
	// A zstd frame announcing 400 MiB: the header alone says how much room it needs.
	bigHeader, err := (&zstd.Header{HasFCS: true, FrameContentSize: 400 * mib, WindowSize: mib}).AppendTo(nil)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		path     string
		handler  http.Handler
		size     int64
		free     []int64
		wantText string
		maxSent  int64 // the download must stop before the server sent more
	}{
		{name: "declared size above free space", path: "/img.raw", size: 20 * mib, free: []int64{10 * mib},
			handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(zeros))
			}),
			wantText: "need 20971520 bytes, 10485760 free"},
		{name: "zstd content size above free space", path: "/img.raw.zst", free: []int64{300 * mib},
			handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Write(append(bigHeader, make([]byte, 1000)...))
			}),
			wantText: "314572800 free"},
		{name: "unknown size below the floor", path: "/img.raw", free: []int64{200 * mib},
			handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Write([]byte("chunked")) // flushed without a Content-Length
				w.(http.Flusher).Flush()
			}),
			wantText: "need 268435456 bytes"},
		{name: "disk fills while writing", path: "/img.raw", free: []int64{1 << 30, mib},
			handler: streamHandler(200*mib, nil), wantText: "1048576 free", maxSent: 100 * mib},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, gets := countGETs(t, tt.handler.ServeHTTP)
			f := testFetcher(t)
			disk := &fullDisk{free: tt.free}
			f.FreeSpace = disk.freeSpace
			dest := filepath.Join(t.TempDir(), "img.raw")
			res, err := f.Fetch(context.Background(), Request{URL: srv.URL + tt.path, Files: files(f, "img.raw", dest), Size: tt.size})
			if !errors.Is(err, diskspace.ErrNoSpace) || !strings.Contains(err.Error(), tt.wantText) {
				t.Fatalf("Fetch error = %v, want diskspace.ErrNoSpace saying %q", err, tt.wantText)
			}
			if !strings.Contains(err.Error(), partialDir(f)) {
				t.Errorf("error %q does not name the directory", err)
			}
			if tt.maxSent > 0 && res.Downloaded > tt.maxSent {
				t.Errorf("downloaded %d bytes after the disk filled", res.Downloaded)
			}
			if _, err := os.Stat(dest); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("dest exists (stat: %v)", err)
			}
			if n := gets(); n != 1 {
				t.Errorf("server saw %d GETs; a lack of space must not be retried", n)
			}
		})
	}
}

// TestFetchDiskFull writes the download into /dev/full, whose every write fails with
// ENOSPC, as a full filesystem would.
func TestFetchDiskFull(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		testenv.Unavailable(t, "no /dev/full: %v", err)
	}
	image := testImage(256 << 10)
	for _, comp := range []string{"", "zst"} {
		t.Run("comp="+comp, func(t *testing.T) {
			fs := &fileServer{content: compress(t, comp, image)}
			srv := newFileServer(t, fs)
			f := testFetcher(t)
			if err := os.MkdirAll(partialDir(f), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("/dev/full", filepath.Join(partialDir(f), "img.raw.download")); err != nil {
				t.Fatal(err)
			}
			_, err := f.Fetch(context.Background(), Request{URL: srv.URL + "/img.raw" + suffix(comp), Files: files(f, "img.raw", filepath.Join(t.TempDir(), "img.raw"))})
			if !errors.Is(err, diskspace.ErrNoSpace) || !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("Fetch error = %v, want diskspace.ErrNoSpace wrapping ENOSPC", err)
			}
			gets := 0
			for _, r := range fs.requests() {
				if r.method == http.MethodGet {
					gets++
				}
			}
			if gets != 1 {
				t.Errorf("server saw %d GETs; a full disk must not be retried", gets)
			}
		})
	}
}

// TestFetchRedactsSecrets fails and succeeds downloads of signed URLs and checks that
// neither the errors nor the log show the signature.
func TestFetchRedactsSecrets(t *testing.T) {
	const secret = "topsecret"
	image := testImage(512 << 10)
	sha, _ := digests(image)
	zimage := compress(t, "zst", image)
	closed := httptest.NewServer(http.NotFoundHandler())
	closedURL := closed.URL
	closed.Close()
	tests := []struct {
		name    string
		fs      func() *fileServer // nil: connection refused; a new server for each URL form
		path    string
		sha     string
		wantErr bool
		logsURL bool // the log mentions the URL
	}{
		{name: "404", fs: func() *fileServer { return &fileServer{content: image, failFirst: 100, failStatus: 404} }, path: "/img.raw", wantErr: true},
		{name: "503 until giving up", fs: func() *fileServer { return &fileServer{content: image, failFirst: 100, failStatus: 503} }, path: "/img.raw", wantErr: true, logsURL: true},
		{name: "connection refused", path: "/img.raw", wantErr: true, logsURL: true},
		{name: "checksum mismatch", fs: func() *fileServer { return &fileServer{content: image} }, path: "/img.raw", sha: strings.Repeat("0", 64), wantErr: true},
		{name: "success after a drop", fs: func() *fileServer { return &fileServer{content: zimage, dropAfter: 100 << 10} }, path: "/img.raw.zst", sha: sha, logsURL: true},
		{name: "success through a redirect", fs: func() *fileServer { return &fileServer{content: image} }, path: "/r/img.raw", sha: sha},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, withUser := range []bool{false, true} {
				// Each form of the URL meets the server's faults afresh (the drop).
				base := closedURL
				if tt.fs != nil {
					base = newFileServer(t, tt.fs()).URL
				}
				u := base + tt.path + "?X-Amz-Signature=" + secret + "&X-Amz-Expires=300"
				if withUser {
					u = strings.Replace(u, "http://", "http://user:"+secret+"@", 1)
				}
				var logs testenv.Buffer
				f := testFetcher(t)
				f.Attempts = 2
				f.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
				_, err := f.Fetch(context.Background(), Request{URL: u, Files: files(f, "img.raw", filepath.Join(t.TempDir(), "img.raw")), SHA256: tt.sha})
				if (err != nil) != tt.wantErr {
					t.Fatalf("Fetch error = %v, want an error: %v", err, tt.wantErr)
				}
				if err != nil && strings.Contains(err.Error(), secret) {
					t.Errorf("error shows the secret: %v", err)
				}
				if err != nil && !strings.Contains(err.Error(), "?REDACTED") {
					t.Errorf("error does not name the URL, redacted: %v", err)
				}
				if strings.Contains(logs.String(), secret) {
					t.Errorf("log shows the secret:\n%s", logs.String())
				}
				if tt.logsURL && !strings.Contains(logs.String(), "?REDACTED") {
					t.Errorf("log names no URL, redacted:\n%s", logs.String())
				}
			}
		})
	}
}

// TestFetchZstdWindowBounded serves a few bytes of zstd whose single-segment frame
// announces 500 MiB: an unbounded decoder would allocate that as its window at once.
func TestFetchZstdWindowBounded(t *testing.T) {
	h := zstd.Header{SingleSegment: true, HasFCS: true, FrameContentSize: 500 << 20}
	stream, err := h.AppendTo(nil)
	if err != nil {
		t.Fatal(err)
	}
	const n = 10 // one raw, last block of n bytes
	stream = append(stream, n<<3|1, 0, 0)
	stream = append(stream, make([]byte, n)...)
	fs := &fileServer{content: stream}
	srv := newFileServer(t, fs)
	f := testFetcher(t)
	f.FreeSpace = func(string) (int64, error) { return 1 << 40, nil }

	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	before := ms.TotalAlloc
	_, err = f.Fetch(context.Background(), Request{URL: srv.URL + "/img.raw.zst", Files: files(f, "img.raw", filepath.Join(t.TempDir(), "img.raw"))})
	runtime.ReadMemStats(&ms)
	if !errors.As(err, new(*decodeError)) {
		t.Fatalf("Fetch error = %v, want a decompression error", err)
	}
	if alloc := ms.TotalAlloc - before; alloc > 64<<20 {
		t.Errorf("Fetch allocated %d MiB for a %d-byte stream", alloc>>20, len(stream))
	}
	checkNoPartials(t, f)
}

// countGETs serves h and counts the GET requests it answered.
func countGETs(t *testing.T, h http.HandlerFunc) (*httptest.Server, func() int) {
	t.Helper()
	var mu sync.Mutex
	gets := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			mu.Lock()
			gets++
			mu.Unlock()
		}
		h(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, func() int {
		mu.Lock()
		defer mu.Unlock()
		return gets
	}
}
