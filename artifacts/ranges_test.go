package artifacts

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
)

// rangeStart parses the first byte position of a "bytes=N-" or "bytes=N-M" Range header;
// 0 for none.
func rangeStart(h string) (int64, error) {
	if h == "" {
		return 0, nil
	}
	spec, ok := strings.CutPrefix(h, "bytes=")
	start, _, ok2 := strings.Cut(spec, "-")
	n, err := strconv.ParseInt(start, 10, 64)
	if !ok || !ok2 || err != nil || n < 0 {
		return 0, fmt.Errorf("unexpected Range header %q", h)
	}
	return n, nil
}

// rangeServer serves one file with http.ServeContent, validators and all, and records
// what it was asked and what it sent per request. It can misbehave on request.
type rangeServer struct {
	// versions are the file's contents in turn, with their etags: the first GET is
	// answered from the first version, every later request from the last.
	versions [][]byte
	etags    []string
	modTimes []time.Time // optional Last-Modified per version

	refuseHead     bool  // answer HEAD with 405, as a URL signed for GET does
	noAcceptRanges bool  // do not announce byte ranges (but still answer them)
	ignoreRange    bool  // answer every GET with 200 and the whole file
	cutStart       int64 // the first request for a range starting here breaks off ...
	cutAfter       int64 // ... after this many body bytes
	hangAfter      int64 // while hanging, every GET stops after this many body bytes

	mu      sync.Mutex
	seen    []rangeRequest
	gets    int
	cut     bool
	hanging bool
	hung    chan struct{} // receives once per GET that hangs
}

// rangeRequest is one request as the server saw it, and the body bytes it sent.
type rangeRequest struct {
	method, rng, ifRange string
	sent                 int64
}

func newRangeServer(t *testing.T, rs *rangeServer) *httptest.Server {
	rs.hung = make(chan struct{}, 1000)
	srv := httptest.NewServer(rs)
	t.Cleanup(srv.Close)
	return srv
}

func (rs *rangeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rs.mu.Lock()
	v := len(rs.versions) - 1
	if r.Method == http.MethodGet {
		rs.gets++
		if rs.gets == 1 {
			v = 0
		}
	}
	idx := len(rs.seen)
	rs.seen = append(rs.seen, rangeRequest{method: r.Method, rng: r.Header.Get("Range"), ifRange: r.Header.Get("If-Range")})
	var cut, hang int64
	if start, err := rangeStart(r.Header.Get("Range")); err == nil && r.Header.Get("Range") != "" &&
		start == rs.cutStart && rs.cutAfter > 0 && !rs.cut {
		rs.cut, cut = true, rs.cutAfter
	}
	if rs.hanging && r.Method == http.MethodGet {
		hang = rs.hangAfter
	}
	rs.mu.Unlock()

	if r.Method == http.MethodHead && rs.refuseHead {
		http.Error(w, "signed for GET only", http.StatusMethodNotAllowed)
		return
	}
	if rs.etags != nil {
		w.Header().Set("ETag", rs.etags[v])
	}
	var mod time.Time
	if rs.modTimes != nil {
		mod = rs.modTimes[v]
	}
	sw := &rangeWriter{ResponseWriter: w, rs: rs, idx: idx, cut: cut, hang: hang, req: r}
	if rs.ignoreRange {
		w.Header().Set("Accept-Ranges", "bytes")
		w.Header().Set("Content-Length", strconv.Itoa(len(rs.versions[v])))
		if r.Method == http.MethodGet {
			sw.Write(rs.versions[v])
		}
		return
	}
	http.ServeContent(sw, r, "", mod, bytes.NewReader(rs.versions[v]))
}

func (rs *rangeServer) requests() []rangeRequest {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return slices.Clone(rs.seen)
}

func (rs *rangeServer) served() int64 {
	var n int64
	for _, r := range rs.requests() {
		n += r.sent
	}
	return n
}

// rangeGETs lists the GETs that asked for a range.
func (rs *rangeServer) rangeGETs() []rangeRequest {
	var out []rangeRequest
	for _, r := range rs.requests() {
		if r.method == http.MethodGet && r.rng != "" {
			out = append(out, r)
		}
	}
	return out
}

// rangeWriter counts the body bytes of one answer, and breaks it off or hangs it.
type rangeWriter struct {
	http.ResponseWriter
	rs        *rangeServer
	idx       int
	cut, hang int64
	n         int64
	req       *http.Request
}

func (w *rangeWriter) WriteHeader(code int) {
	if w.rs.noAcceptRanges {
		w.Header().Del("Accept-Ranges")
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *rangeWriter) Write(p []byte) (int, error) {
	stop := max(w.cut, w.hang)
	if stop > 0 && w.n+int64(len(p)) > stop {
		p = p[:stop-w.n]
		w.ResponseWriter.Write(p)
		w.count(len(p))
		w.ResponseWriter.(http.Flusher).Flush()
		if w.hang > 0 {
			w.rs.hung <- struct{}{}
			<-w.req.Context().Done()
		}
		panic(http.ErrAbortHandler)
	}
	n, err := w.ResponseWriter.Write(p)
	w.count(n)
	return n, err
}

func (w *rangeWriter) count(n int) {
	w.n += int64(n)
	w.rs.mu.Lock()
	w.rs.seen[w.idx].sent += int64(n)
	w.rs.mu.Unlock()
}

// rangedFetcher is a test Fetcher that fetches files of 1 MiB and more in ranges of
// 256 KiB over 4 connections, however fast one stream would be.
func rangedFetcher(t testing.TB) *Fetcher {
	f := testFetcher(t)
	f.Connections = 4
	f.MinRangedSize = 1 << 20
	f.FastStream = -1 // a loopback server is fast: fetch in ranges all the same
	f.RangeSize = 256 << 10
	f.StateInterval = 5 * time.Millisecond
	return f
}

func TestFetchRanges(t *testing.T) {
	image := testImage(3 << 20)
	ref := filepath.Join(t.TempDir(), "reference.raw")
	if err := os.WriteFile(ref, image, 0o644); err != nil {
		t.Fatal(err)
	}
	wantSHA, wantMD5 := testenv.ToolSum(t, "sha256sum", ref), testenv.ToolSum(t, "md5sum", ref)
	for _, comp := range []string{"", "zst", "gz"} {
		for _, conns := range []int{1, 4} {
			t.Run(fmt.Sprintf("comp=%s connections=%d", comp, conns), func(t *testing.T) {
				served := compress(t, comp, image)
				if conns > 1 && len(served) < 1<<20 {
					t.Fatalf("served %d bytes: too few for ranges", len(served))
				}
				rs := &rangeServer{versions: [][]byte{served}, etags: []string{`"v1"`}}
				srv := newRangeServer(t, rs)
				f := rangedFetcher(t)
				f.Connections = conns
				var logs testenv.Buffer
				f.Logger = slog.New(slog.NewTextHandler(&logs, nil))
				dest := filepath.Join(t.TempDir(), "img.raw")
				res, err := f.Fetch(context.Background(), Request{
					URL: srv.URL + "/img.raw" + suffix(comp), Files: files(f, "img.raw", dest), SHA256: wantSHA, MD5: wantMD5,
				})
				if err != nil {
					t.Fatalf("Fetch: %v", err)
				}
				checkFetched(t, f, res, dest, image)
				if got := testenv.ToolSum(t, "sha256sum", dest); got != wantSHA || res.SHA256 != wantSHA {
					t.Errorf("sha256sum of dest = %s, result %s, want %s", got, res.SHA256, wantSHA)
				}
				if got := testenv.ToolSum(t, "md5sum", dest); got != wantMD5 || res.MD5 != wantMD5 {
					t.Errorf("md5sum of dest = %s, result %s, want %s", got, res.MD5, wantMD5)
				}
				ranges := rs.rangeGETs()
				wantRanges := 0
				if conns > 1 {
					wantRanges = (len(served)+256<<10-1)/(256<<10) - 1 // all but the lead's
				}
				if len(ranges) != wantRanges {
					t.Errorf("server saw %d range requests, want %d: %+v", len(ranges), wantRanges, ranges)
				}
				for _, r := range ranges {
					if r.ifRange != `"v1"` {
						t.Errorf("range request %q has If-Range %q, want the ETag", r.rng, r.ifRange)
					}
				}
				if conns > 1 && !strings.Contains(logs.String(), "connections=4") {
					t.Errorf("no log line says the download used 4 connections:\n%s", logs.String())
				}
				// The server may send more: the first GET asks for the whole file, and what
				// it pushed beyond the first range before the connection closed is lost.
				if res.Downloaded != int64(len(served)) || rs.served() < int64(len(served)) {
					t.Errorf("downloaded %d, server sent %d, want %d", res.Downloaded, rs.served(), len(served))
				}
			})
		}
	}
}

func TestFetchRangeRetriedAlone(t *testing.T) {
	image := testImage(4 << 20)
	const piece, cutStart, cutAfter = 256 << 10, 5 * 256 << 10, 100 << 10
	rs := &rangeServer{versions: [][]byte{image}, etags: []string{`"v1"`}, cutStart: cutStart, cutAfter: cutAfter}
	srv := newRangeServer(t, rs)
	f := rangedFetcher(t)
	var logs testenv.Buffer
	f.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	dest := filepath.Join(t.TempDir(), "img.raw")
	res, err := f.Fetch(context.Background(), Request{URL: srv.URL + "/img.raw", Files: files(f, "img.raw", dest)})
	if err != nil {
		t.Fatalf("Fetch: %v", err)
	}
	checkFetched(t, f, res, dest, image)
	// The cut range is asked for twice, the second time from where it stopped; every
	// other range once.
	var cutReqs []rangeRequest
	starts := map[int64]int{}
	for _, r := range rs.rangeGETs() {
		start, _ := rangeStart(r.rng)
		if start >= cutStart && start < cutStart+piece {
			cutReqs = append(cutReqs, r)
		} else {
			starts[start]++
		}
	}
	if len(cutReqs) != 2 {
		t.Fatalf("the cut range was asked for %d times, want 2: %+v", len(cutReqs), cutReqs)
	}
	if cutReqs[0].sent != cutAfter {
		t.Errorf("the cut request sent %d bytes, want %d", cutReqs[0].sent, cutAfter)
	}
	resume, _ := rangeStart(cutReqs[1].rng)
	if want := fmt.Sprintf("bytes=%d-%d", cutStart+cutAfter, cutStart+piece-1); cutReqs[1].rng != want {
		t.Errorf("retry asked for %q, want %q", cutReqs[1].rng, want)
	}
	if total := cutReqs[0].sent + cutReqs[1].sent; total != piece+(cutStart+cutAfter-resume) {
		t.Errorf("the cut range took %d bytes, want %d", total, piece)
	}
	for start, n := range starts {
		if n != 1 {
			t.Errorf("range at %d asked for %d times", start, n)
		}
	}
	if !strings.Contains(logs.String(), "range failed; retrying it") {
		t.Errorf("no log line for the retry:\n%s", logs.String())
	}
	if res.Downloaded != int64(len(image)) {
		t.Errorf("downloaded %d bytes, want %d", res.Downloaded, len(image))
	}
}

// TestFetchRangesResumeAfterKill stops a download whose ranges are all partly done,
// keeping only what was saved while it ran, as kill -9 would, and resumes every range
// with a new Fetcher.
func TestFetchRangesResumeAfterKill(t *testing.T) {
	for _, comp := range []string{"", "zst"} {
		t.Run("comp="+comp, func(t *testing.T) {
			image := testImage(4 << 20)
			served := compress(t, comp, image)
			const conns, hangAfter = 4, 128 << 10
			rs := &rangeServer{versions: [][]byte{served}, etags: []string{`"v1"`}, hangAfter: hangAfter, hanging: true}
			srv := newRangeServer(t, rs)
			f := rangedFetcher(t)
			// The hung ranges wait for the kill alone. A slow host may take longer than
			// the stall timeout to get there, and a stall retry would fetch more of each
			// range, and the next ones, before the kill.
			f.StallTimeout = time.Hour
			req := Request{URL: srv.URL + "/img.raw" + suffix(comp), Files: files(f, "img.raw", filepath.Join(t.TempDir(), "img.raw"))}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel() // on a failure before the kill, lets the hung requests and the server end
			errc := make(chan error, 1)
			go func() {
				_, err := f.Fetch(ctx, req)
				errc <- err
			}()
			for range conns {
				select {
				case <-rs.hung:
				case <-time.After(10 * time.Second):
					t.Fatal("the ranges never reached the hanging point")
				}
			}
			// Wait for a saved state that has every hung range's bytes, then take a copy
			// of the partial directory as it stands: state first, then data.
			stPath := filepath.Join(partialDir(f), "img.raw.ranges")
			var st rangeState
			deadline := time.Now().Add(10 * time.Second)
			for {
				b, err := os.ReadFile(stPath)
				if err == nil && json.Unmarshal(b, &st) == nil {
					partly := 0
					for _, s := range st.Ranges {
						if s.Done == hangAfter {
							partly++
						}
					}
					if partly == conns {
						break
					}
				}
				if time.Now().After(deadline) {
					t.Fatalf("the saved state never showed %d ranges at %d bytes: %+v", conns, hangAfter, st)
				}
				time.Sleep(5 * time.Millisecond)
			}
			killed := filepath.Join(t.TempDir(), ".partial")
			if err := os.MkdirAll(killed, 0o755); err != nil {
				t.Fatal(err)
			}
			for _, name := range []string{"img.raw.ranges", "img.raw.download"} {
				b, err := os.ReadFile(filepath.Join(partialDir(f), name))
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(killed, name), b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			cancel()
			if err := <-errc; !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled Fetch returned %v, want context.Canceled", err)
			}
			before := rs.served()
			rs.mu.Lock()
			rs.hanging = false
			rs.mu.Unlock()

			f2 := rangedFetcher(t)
			partialDirs.Store(f2, killed)
			req.Files = files(f2, "img.raw", req.Files.Dest)
			res, err := f2.Fetch(context.Background(), req)
			if err != nil {
				t.Fatalf("resumed Fetch: %v", err)
			}
			checkFetched(t, f2, res, req.Files.Dest, image)
			if before != conns*hangAfter {
				t.Errorf("server sent %d bytes before the kill, want %d", before, conns*hangAfter)
			}
			if total := rs.served(); total != int64(len(served)) {
				t.Errorf("server sent %d bytes in all for a %d-byte file, want each byte once", total, len(served))
			}
			if want := int64(len(served) - conns*hangAfter); res.Downloaded != want {
				t.Errorf("resumed Fetch downloaded %d bytes, want %d", res.Downloaded, want)
			}
			resumed := 0
			for _, r := range rs.rangeGETs() {
				start, _ := rangeStart(r.rng)
				if start%(256<<10) == hangAfter {
					resumed++
				}
			}
			if resumed != conns {
				t.Errorf("%d ranges resumed from where they stood, want %d: %+v", resumed, conns, rs.rangeGETs())
			}
		})
	}
}

func TestFetchRangesServerQuirks(t *testing.T) {
	image := testImage(4 << 20)
	other := testImage(3 << 20)
	slices.Reverse(other)
	t0 := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name       string
		rs         *rangeServer
		want       []byte
		wantRanges bool // the file came in ranges
		wantLeads  int  // GETs without Range
		wantProbe  bool // a bytes=0-0 GET
	}{
		{name: "ignores Range", rs: &rangeServer{versions: [][]byte{image}, etags: []string{`"v1"`}, ignoreRange: true},
			want: image, wantLeads: 2},
		{name: "refuses HEAD, announces no ranges", rs: &rangeServer{versions: [][]byte{image}, etags: []string{`"v1"`},
			refuseHead: true, noAcceptRanges: true},
			want: image, wantRanges: true, wantLeads: 1, wantProbe: true},
		{name: "ETag changes", rs: &rangeServer{versions: [][]byte{other, image}, etags: []string{`"v1"`, `"v2"`}},
			want: image, wantRanges: true, wantLeads: 2},
		{name: "Last-Modified changes", rs: &rangeServer{versions: [][]byte{other, image}, modTimes: []time.Time{t0, t0.Add(time.Hour)}},
			want: image, wantRanges: true, wantLeads: 2},
		{name: "weak ETag only", rs: &rangeServer{versions: [][]byte{image}, etags: []string{`W/"v1"`}},
			want: image, wantLeads: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newRangeServer(t, tt.rs)
			f := rangedFetcher(t)
			dest := filepath.Join(t.TempDir(), "img.raw")
			sha, _ := digests(tt.want)
			res, err := f.Fetch(context.Background(), Request{URL: srv.URL + "/img.raw", Files: files(f, "img.raw", dest), SHA256: sha})
			if err != nil {
				t.Fatalf("Fetch: %v", err)
			}
			checkFetched(t, f, res, dest, tt.want)
			leads, probed, ranges := 0, false, 0
			for _, r := range tt.rs.requests() {
				switch {
				case r.method != http.MethodGet:
				case r.rng == "":
					leads++
				case r.rng == "bytes=0-0":
					probed = true
				default:
					ranges++
				}
			}
			if leads != tt.wantLeads || probed != tt.wantProbe {
				t.Errorf("server saw %d GETs of the whole file and a probe: %v; want %d and %v", leads, probed, tt.wantLeads, tt.wantProbe)
			}
			if tt.wantRanges && ranges < 4 {
				t.Errorf("server saw %d range requests; the file did not come in ranges", ranges)
			}
			if !tt.wantRanges && !tt.rs.ignoreRange && ranges > 0 {
				t.Errorf("server saw %d range requests, want none", ranges)
			}
			// A server that ignores Range gets the file in one stream at last: its
			// last GET of the whole file sends it all. (Which request the server
			// saw last is no sign: a range request the client cancelled before it
			// fell back may reach the handler after the fallback's GET.)
			if tt.rs.ignoreRange {
				var last *rangeRequest
				for _, r := range tt.rs.requests() {
					if r.method == http.MethodGet && r.rng == "" {
						last = &r
					}
				}
				if last == nil || last.sent != int64(len(tt.want)) {
					t.Errorf("last GET of the whole file = %+v, want one that sent all %d bytes", last, len(tt.want))
				}
			}
		})
	}
}

// TestFetchResumeHeadRefused resumes a single stream from a server that refuses HEAD.
func TestFetchResumeHeadRefused(t *testing.T) {
	image := testImage(2 << 20)
	fs := &fileServer{content: image, dropAfter: 700 << 10}
	srv := newFileServer(t, fs)
	headRefused := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodHead {
			http.Error(w, "signed for GET only", http.StatusForbidden)
			return
		}
		srv.Config.Handler.ServeHTTP(w, r)
	}))
	t.Cleanup(headRefused.Close)
	f := testFetcher(t)
	dest := filepath.Join(t.TempDir(), "img.raw")
	res, err := f.Fetch(context.Background(), Request{URL: headRefused.URL + "/img.raw", Files: files(f, "img.raw", dest)})
	if err != nil {
		t.Fatalf("Fetch: %v", err)
	}
	checkFetched(t, f, res, dest, image)
	if starts := fs.rangeStarts(t); len(starts) != 1 || starts[0] != 700<<10 {
		t.Errorf("Range starts = %v, want [%d]", starts, 700<<10)
	}
	if total := fs.bytesServed(); total != int64(len(image)) {
		t.Errorf("server sent %d bytes for a %d-byte file", total, len(image))
	}
}

func TestFetchRangesSparse(t *testing.T) {
	const size = 32 << 20
	image := make([]byte, size)
	copy(image, testImage(1<<20))
	copy(image[20<<20+123:], testImage(100<<10))
	image[size-1] = 1
	rs := &rangeServer{versions: [][]byte{image}, etags: []string{`"v1"`}}
	srv := newRangeServer(t, rs)
	f := rangedFetcher(t)
	f.RangeSize = 0 // ranges of the size a real download would use
	dest := filepath.Join(filepath.Dir(partialDir(f)), "img.raw")
	if err := os.MkdirAll(partialDir(f), 0o755); err != nil {
		t.Fatal(err)
	}
	requireHoles(t, partialDir(f))
	res, err := f.Fetch(context.Background(), Request{URL: srv.URL + "/img.raw", Files: files(f, "img.raw", dest)})
	if err != nil {
		t.Fatalf("Fetch: %v", err)
	}
	checkFetched(t, f, res, dest, image)
	if len(rs.rangeGETs()) == 0 {
		t.Fatal("the file did not come in ranges")
	}
	a := allocated(t, dest)
	t.Logf("%d KiB allocated for a %d MiB image", a>>10, size>>20)
	if a > 4<<20 {
		t.Errorf("%d bytes allocated for a %d-byte image with about 1.2 MiB of data: not sparse", a, size)
	}
}

func TestWriteSparse(t *testing.T) {
	const block = sparseBlock
	data := make([]byte, 5*block)
	data[10] = 1              // block 0 has data
	data[3*block+block-1] = 2 // block 3 has data
	dir := t.TempDir()
	requireHoles(t, dir)
	path := filepath.Join(dir, "f")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(6 * block); err != nil {
		t.Fatal(err)
	}
	// Written from an unaligned offset in two pieces, as a resumed range may be.
	off := int64(block / 2)
	if err := writeSparse(f, data[:block/2], off); err != nil {
		t.Fatal(err)
	}
	if err := writeSparse(f, data[block/2:], off+block/2); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[off:off+int64(len(data))], data) {
		t.Fatal("the file does not read back as written")
	}
	if a := allocated(t, path); a > 4*block {
		t.Errorf("%d bytes allocated for 3 blocks with data", a)
	}
}

func TestParseContentRange(t *testing.T) {
	tests := []struct {
		in                string
		start, end, total int64
		wantErr           bool
	}{
		{in: "bytes 0-0/10", start: 0, end: 0, total: 10},
		{in: "bytes 5-9/*", start: 5, end: 9, total: -1},
		{in: "bytes */10", wantErr: true},
		{in: "bytes 9-5/10", wantErr: true},
		{in: "items 0-1/2", wantErr: true},
		{in: "", wantErr: true},
	}
	for _, tt := range tests {
		start, end, total, err := parseContentRange(tt.in)
		if (err != nil) != tt.wantErr || err == nil && (start != tt.start || end != tt.end || total != tt.total) {
			t.Errorf("parseContentRange(%q) = %d, %d, %d, %v", tt.in, start, end, total, err)
		}
	}
}

// TestFetchFastStreamStaysOne: a server that takes ranges but sends one stream faster
// than the pipeline takes it is fetched in that one stream, and a plain image is still
// written with holes.
func TestFetchFastStreamStaysOne(t *testing.T) {
	const size = 32 << 20
	image := make([]byte, size)
	copy(image, testImage(1<<20))
	image[size-1] = 1
	rs := &rangeServer{versions: [][]byte{image}, etags: []string{`"v1"`}}
	srv := newRangeServer(t, rs)
	f := testFetcher(t)
	f.FastStream = 1 // any stream is fast enough
	dest := filepath.Join(filepath.Dir(partialDir(f)), "img.raw")
	if err := os.MkdirAll(partialDir(f), 0o755); err != nil {
		t.Fatal(err)
	}
	requireHoles(t, partialDir(f))
	res, err := f.Fetch(context.Background(), Request{URL: srv.URL + "/img.raw", Files: files(f, "img.raw", dest)})
	if err != nil {
		t.Fatalf("Fetch: %v", err)
	}
	checkFetched(t, f, res, dest, image)
	if n := len(rs.rangeGETs()); n != 0 {
		t.Errorf("%d range requests for a fast stream, want none", n)
	}
	if a := allocated(t, dest); a > 4<<20 {
		t.Errorf("%d bytes allocated for a %d-byte image with 1 MiB of data: not sparse", a, size)
	}

	// A slow stream (any rate is below this one) goes to ranges.
	rs2 := &rangeServer{versions: [][]byte{image}, etags: []string{`"v1"`}}
	srv2 := newRangeServer(t, rs2)
	f2 := testFetcher(t)
	f2.FastStream = 1 << 50
	dest2 := filepath.Join(filepath.Dir(partialDir(f2)), "img.raw")
	res, err = f2.Fetch(context.Background(), Request{URL: srv2.URL + "/img.raw", Files: files(f, "img.raw", dest2)})
	if err != nil {
		t.Fatalf("Fetch: %v", err)
	}
	checkFetched(t, f2, res, dest2, image)
	if len(rs2.rangeGETs()) == 0 {
		t.Error("a slow stream was not fetched in ranges")
	}
}

// TestReplayBody: the bytes a sample read are read again, then the error that ended
// the sample, if any.
func TestReplayBody(t *testing.T) {
	cut := errors.New("connection reset")
	r := &replayBody{sample: []byte("abc"), err: cut, body: io.NopCloser(strings.NewReader("never"))}
	got, err := io.ReadAll(r)
	if string(got) != "abc" || !errors.Is(err, cut) {
		t.Errorf("read %q, %v; want abc then the sample's error", got, err)
	}
	r = &replayBody{sample: []byte("abc"), body: io.NopCloser(strings.NewReader("def"))}
	if got, err := io.ReadAll(r); string(got) != "abcdef" || err != nil {
		t.Errorf("read %q, %v; want abcdef", got, err)
	}
}

// TestLiveSpans: a run takes up the spans as the state left them, fetches
// only those not complete, and counts what is on disk as done.
func TestLiveSpans(t *testing.T) {
	for _, tc := range []struct {
		name        string
		ranges      []span
		wantPending []int
		wantResumed int64
	}{
		{"none", nil, nil, 0},
		{"fresh", []span{{0, 10, 0}, {10, 20, 0}}, []int{0, 1}, 0},
		{"resumed", []span{{0, 10, 10}, {10, 20, 4}, {20, 30, 0}}, []int{1, 2}, 14},
		{"complete", []span{{0, 10, 10}, {10, 20, 10}}, nil, 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spans, pending, resumed := liveSpans(tc.ranges)
			if !slices.Equal(pending, tc.wantPending) || resumed != tc.wantResumed {
				t.Errorf("liveSpans = pending %v, resumed %d; want %v, %d", pending, resumed, tc.wantPending, tc.wantResumed)
			}
			if len(spans) != len(tc.ranges) {
				t.Fatalf("liveSpans made %d spans of %d ranges", len(spans), len(tc.ranges))
			}
			for i, s := range spans {
				r := tc.ranges[i]
				if s.start != r.Start || s.end != r.End || s.done.Load() != r.Done {
					t.Errorf("span %d = [%d, %d) done %d, want %+v", i, s.start, s.end, s.done.Load(), r)
				}
			}
		})
	}
}
