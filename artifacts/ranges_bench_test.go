package artifacts

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/benchkit"
)

// benchConnRate is the cap of the benchmark server on each connection, as object stores
// and artifact servers cap theirs.
const benchConnRate = 20 << 20

// generatedFile is a file of size bytes made up on the fly, so that a server can offer
// gigabytes without holding them: a fixed pseudo-random block with each 4 KiB stamped
// with its offset.
type generatedFile struct {
	size, off int64
}

var generatedBlock = func() []byte {
	b := make([]byte, 1<<20)
	for i := range b {
		b[i] = byte(i*131 + i>>7 + 1)
	}
	return b
}()

func (g *generatedFile) Read(p []byte) (int, error) {
	if g.off >= g.size {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), g.size-g.off)]
	for i := 0; i < len(p); {
		at := g.off + int64(i)
		n := copy(p[i:], generatedBlock[at%int64(len(generatedBlock)):])
		// Stamp the offset at every 4 KiB boundary within this copy.
		for s := (at + 4095) / 4096 * 4096; s+8 <= at+int64(n); s += 4096 {
			binary.LittleEndian.PutUint64(p[i+int(s-at):], uint64(s))
		}
		i += n
	}
	g.off += int64(len(p))
	return len(p), nil
}

func (g *generatedFile) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		offset += g.off
	case io.SeekEnd:
		offset += g.size
	}
	if offset < 0 {
		return 0, errors.New("negative offset")
	}
	g.off = offset
	return offset, nil
}

// bucket is a token bucket: it lets rate bytes a second through, in bursts of burst.
type bucket struct {
	mu     sync.Mutex
	rate   float64
	burst  float64
	tokens float64
	last   time.Time
}

func (b *bucket) wait(n int) {
	b.mu.Lock()
	now := time.Now()
	b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
	b.tokens -= float64(n)
	var d time.Duration
	if b.tokens < 0 {
		d = time.Duration(-b.tokens / b.rate * float64(time.Second))
	}
	b.mu.Unlock()
	time.Sleep(d)
}

type bucketKey struct{}

// throttled writes through the bucket of its connection.
type throttled struct {
	http.ResponseWriter
	b *bucket
}

func (t *throttled) Write(p []byte) (int, error) {
	var n int
	for len(p) > 0 {
		c := min(len(p), 32<<10)
		t.b.wait(c)
		m, err := t.ResponseWriter.Write(p[:c])
		n += m
		if err != nil {
			return n, err
		}
		p = p[c:]
	}
	return n, nil
}

// cappedServer serves a generated file of size bytes with an ETag, each connection
// capped at rate bytes a second (0: no cap).
func cappedServer(b testing.TB, size int64, rate float64) *httptest.Server {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("ETag", `"bench-`+strconv.FormatInt(size, 10)+`"`)
		if bk, ok := r.Context().Value(bucketKey{}).(*bucket); ok {
			w = &throttled{ResponseWriter: w, b: bk}
		}
		http.ServeContent(w, r, "", time.Time{}, &generatedFile{size: size})
	}))
	if rate > 0 {
		srv.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
			return context.WithValue(ctx, bucketKey{}, &bucket{rate: rate, burst: 64 << 10, tokens: 64 << 10, last: time.Now()})
		}
	}
	srv.Start()
	b.Cleanup(srv.Close)
	return srv
}

// fetchOnce fetches the server's file with conns connections and returns how long it
// took.
func fetchOnce(b *testing.B, srv *httptest.Server, conns int, size int64) time.Duration {
	b.Helper()
	f := testFetcher(b)
	f.Connections = conns
	dest := filepath.Join(b.TempDir(), "bench.raw")
	start := time.Now()
	res, err := f.Fetch(context.Background(), Request{URL: srv.URL + "/bench.raw", Files: files(f, "bench.raw", dest)})
	took := time.Since(start)
	if err != nil {
		b.Fatal(err)
	}
	if res.Size != size {
		b.Fatalf("fetched %d bytes, want %d", res.Size, size)
	}
	os.Remove(dest)
	return took
}

// BenchmarkFetchRanges fetches 256 MiB from a server that caps each connection at
// 20 MiB/s, in one stream and with the default connections, side by side.
func BenchmarkFetchRanges(b *testing.B) {
	const size = 256 << 20
	srv := cappedServer(b, size, benchConnRate)
	var one, ranged time.Duration
	for b.Loop() {
		one += fetchOnce(b, srv, 1, size)
		ranged += fetchOnce(b, srv, 0, size)
	}
	b.ReportMetric(one.Seconds()/float64(b.N), "s_one_stream")
	b.ReportMetric(ranged.Seconds()/float64(b.N), "s_ranges")
	b.ReportMetric(one.Seconds()/ranged.Seconds(), "x_one_stream")
}

// BenchmarkFetchRangesConnections times the same fetch for several connection counts, to
// choose DefaultConnections.
func BenchmarkFetchRangesConnections(b *testing.B) {
	const size = 256 << 20
	srv := cappedServer(b, size, benchConnRate)
	for _, conns := range []int{2, 4, 6, 8, 12, 16} {
		b.Run(fmt.Sprintf("connections=%d", conns), func(b *testing.B) {
			b.SetBytes(size)
			for b.Loop() {
				fetchOnce(b, srv, conns, size)
			}
		})
	}
}

// BenchmarkFetchRangesMemory fetches 1 GiB over 8 connections and reports how much the
// peak resident memory of the process grew: the ranges go to disk, not to memory.
func BenchmarkFetchRangesMemory(b *testing.B) {
	const size = 1 << 30
	srv := cappedServer(b, size, benchConnRate)
	var worst int64
	for b.Loop() {
		mem := benchkit.ResetPeak()
		fetchOnce(b, srv, 8, size)
		grew, ok := mem.Growth(b)
		if !ok {
			b.Skip("cannot reset the peak resident memory")
		}
		worst = max(worst, grew)
	}
	b.ReportMetric(float64(worst)/(1<<20), "MiB_peak_rss_growth")
	if worst > 64<<20 {
		b.Errorf("peak resident memory grew by %d MiB fetching 1 GiB", worst>>20)
	}
}
