package artifacts

// Parallel range downloads.
//
// grab, which made our downloads before, fetches a file as one stream written front to
// back: it has no way to fetch several ranges of one file at once, nor to write them at
// their offsets (WriteAt) into one file, nor to hand its first answer over when that
// answer shows the file is better fetched in ranges. The transfer is therefore ours, the
// single stream (fetch.go) as well as the ranges here.
//
// The GET of a fresh download is the probe: it asks for the whole file, and when its
// answer shows ranges are worth it, that answer becomes the first range, read up to that
// range's end and then closed. This costs no round trip and works where HEAD is refused
// (URLs signed for GET only); what the server had sent beyond the first range by then is
// lost, at most about a connection's worth of socket buffers.
//
// A download in ranges keeps two files in the partial directory: <key>.download, sized to
// the whole file up front and filled by the ranges at their offsets, and <key>.ranges, the
// state of every range with the validator of the file, saved atomically as they progress
// so that a later Fetch resumes each range where it stood. The state is written before
// the data file is created and removed only once the data file is complete and synced:
// a full-length data file of holes never stands alone.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/perm"
	"github.com/nodepool-builder/nodepool-builder/internal/redact"
	"github.com/nodepool-builder/nodepool-builder/internal/untrusted"
)

const (
	// DefaultConnections is the number of ranges fetched at once when
	// Fetcher.Connections is 0. Servers and object stores cap each connection, often at
	// a few tens of MB/s. Against a cap of 20 MiB/s per connection, on two cores that
	// also ran the server, a 256 MiB file took 13.0s in one stream, 6.6s with 2
	// connections, 3.5s with 4, 2.5s with 6, 1.9s with 8, 1.4s with 12 and 1.3s with 16.
	// Eight is well past the aim of four times one stream, and past it each connection
	// gains less while every download weighs more on a shared artifact server.
	DefaultConnections = 8
	// rangedMinSize is the smallest file fetched in ranges: below it the extra requests
	// cost about what they save.
	rangedMinSize = 8 << 20
	// piecesPerConnection is how many ranges a file is cut into per connection: the
	// connections take them in order, so the in-order front advances steadily and the
	// last connections to finish leave the others idle for one short range only.
	piecesPerConnection = 4
	// minPiece and maxPiece bound the length of a range.
	minPiece = 1 << 20
	maxPiece = 64 << 20
	// followPiece is the length of a range of a download that uploads follow
	// (Request.Follow).
	followPiece = minPiece
	// stateInterval is how often the state of the ranges is saved while they progress;
	// a restart fetches at most this long's worth of data again.
	stateInterval = time.Second
)

// rangeState is the saved state of a download in ranges. It holds no URL: those may carry
// secrets.
type rangeState struct {
	// Size is the length of the file as served.
	Size int64 `json:"size"`
	// ETag and LastModified are the validators of the file, as the first answer gave
	// them; every range request must find the same file.
	ETag         string `json:"etag,omitempty"`
	LastModified string `json:"last_modified,omitempty"`
	// Ranges cover [0, Size) in order.
	Ranges []span `json:"ranges"`
}

// span is one range of the file: [Start, End), of which the first Done bytes are on disk.
type span struct {
	Start int64 `json:"start"`
	End   int64 `json:"end"`
	Done  int64 `json:"done"`
}

// ifRange is the value of the If-Range header that keeps a range to this version of the
// file.
func (st *rangeState) ifRange() string {
	if st.ETag != "" {
		return st.ETag
	}
	return st.LastModified
}

// valid reports whether the state describes a whole file in ranges.
func (st *rangeState) valid() bool {
	if st.Size <= 0 || len(st.Ranges) == 0 || (st.ETag == "" && st.LastModified == "") {
		return false
	}
	var at int64
	for _, s := range st.Ranges {
		if s.Start != at || s.End <= s.Start || s.Done < 0 || s.Done > s.End-s.Start {
			return false
		}
		at = s.End
	}
	return at == st.Size
}

// validators returns the strong ETag and the Last-Modified of an answer; a weak ETag
// cannot make a range conditional.
func validators(h http.Header) (etag, lastModified string) {
	etag = h.Get("ETag")
	if strings.HasPrefix(etag, "W/") {
		etag = ""
	}
	return etag, h.Get("Last-Modified")
}

// sameFile reports whether an answer's validators name the file of st. An answer without
// them does not tell.
func (st *rangeState) sameFile(h http.Header) bool {
	etag, lm := validators(h)
	switch {
	case st.ETag != "" && etag != "":
		return etag == st.ETag
	case st.ETag == "" && st.LastModified != "" && lm != "":
		return lm == st.LastModified
	}
	return true
}

func (d *download) connections() int {
	switch n := d.f.Connections; {
	case n == 0:
		return DefaultConnections
	case n < 1:
		return 1
	default:
		return n
	}
}

// newRangeState cuts a file of size bytes into ranges: piecesPerConnection per connection,
// within [minPiece, maxPiece], in whole sparse blocks so that holes line up.
func (d *download) newRangeState(size int64, etag, lastModified string) *rangeState {
	piece := d.f.RangeSize
	if piece <= 0 {
		piece = min(max(size/int64(d.connections()*piecesPerConnection), minPiece), maxPiece)
		if d.req.Follow != nil {
			// Uploads follow the in-order front, which lags the bytes received
			// by about one range per connection: against a server that caps all
			// of them together (12 MiB/s, 8 connections), ranges of 5 MiB held
			// the front, and so the uploads, 3 s behind.
			piece = followPiece
		}
	}
	piece = (piece + sparseBlock - 1) / sparseBlock * sparseBlock
	st := &rangeState{Size: size, ETag: etag, LastModified: lastModified}
	for at := int64(0); at < size; at += piece {
		st.Ranges = append(st.Ranges, span{Start: at, End: min(at+piece, size)})
	}
	return st
}

// startRanges looks at the answer to a fresh download's GET and, when the file is worth
// fetching in ranges, creates the state and the data file for them. The answer must be a
// 200 of a known length of at least rangedMinSize that carries a validator, from a server
// that announces byte ranges; one that says nothing about them is asked for the first
// byte (bytes=0-0) first. It returns nil when the file is to come in this one stream.
func (d *download) startRanges(a *attempt, resp *http.Response) (*rangeState, error) {
	minSize := d.f.MinRangedSize
	if minSize <= 0 {
		minSize = rangedMinSize
	}
	if d.single || d.connections() < 2 || resp.StatusCode != http.StatusOK || resp.ContentLength < minSize {
		return nil, nil
	}
	etag, lm := validators(resp.Header)
	if etag == "" && lm == "" {
		// Nothing to tell this file from another version of it.
		return nil, nil
	}
	st := d.newRangeState(resp.ContentLength, etag, lm)
	if !acceptsRanges(resp.Header) {
		if resp.Header.Get("Accept-Ranges") != "" || !a.probeRanges(st) {
			return nil, nil
		}
	}
	if a.fastEnough(resp) {
		// Ranges would only add requests, a read-back and the server's work:
		// what one stream brings, the pipeline takes no faster.
		d.log.Debug("one stream is fast enough; not fetching in ranges", "url", d.url)
		return nil, nil
	}
	if err := d.saveState(st, nil); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(d.dlPath, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, perm.File)
	if err != nil {
		return nil, fmt.Errorf("create partial download: %w", err)
	}
	// Sized up front, with holes where the ranges have yet to write.
	err = f.Truncate(st.Size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("size partial download: %w", err)
	}
	return st, nil
}

// Sampling the speed of one stream, to tell whether ranges would gain anything.
const (
	// defaultFastStream is the rate of one stream that ranges gain little on: it fills
	// a gigabit link, and feeds a compressed image to the hash and decompression
	// pipeline about as fast as two cores take it. A stream's first megabytes come
	// slower than the rest (on loopback about 180 MiB/s), so the bar is set low.
	defaultFastStream = 100 << 20
	// sampleBytes and sampleTime bound the sample: the first of them reached ends it.
	sampleBytes = 4 << 20
	sampleTime  = 300 * time.Millisecond
)

// fastEnough reads the first bytes of a fresh download's answer, timing them from the
// first byte, and tells whether this one stream comes at least at the fast-stream rate.
// The bytes read are put back in front of the body, with the error that ended the
// sample, if any, after them: whoever goes on reads the answer whole.
func (a *attempt) fastEnough(resp *http.Response) bool {
	want := a.d.f.FastStream
	if want == 0 {
		want = defaultFastStream
	}
	if want < 0 {
		return false
	}
	sample := make([]byte, 0, min(sampleBytes, max(resp.ContentLength, 0)))
	var first time.Time
	var rerr error
	for len(sample) < cap(sample) && (first.IsZero() || time.Since(first) < sampleTime) {
		n, err := resp.Body.Read(sample[len(sample):cap(sample)])
		if n > 0 {
			if first.IsZero() {
				first = time.Now()
			}
			sample = sample[:len(sample)+n]
			a.touch()
		}
		if err != nil {
			rerr = err
			break
		}
	}
	resp.Body = &replayBody{sample: sample, err: rerr, body: resp.Body}
	if rerr != nil || first.IsZero() {
		return false
	}
	took := time.Since(first).Seconds()
	return took <= 0 || float64(len(sample))/took >= want
}

// replayBody is a response body with its first bytes, already read, put back: it
// reads sample, then err if the read of the sample ended with one, then the rest.
type replayBody struct {
	sample []byte
	err    error
	body   io.ReadCloser
}

func (r *replayBody) Read(p []byte) (int, error) {
	if len(r.sample) > 0 {
		n := copy(p, r.sample)
		r.sample = r.sample[n:]
		return n, nil
	}
	if r.err != nil {
		return 0, r.err
	}
	return r.body.Read(p)
}

func (r *replayBody) Close() error { return r.body.Close() }

// probeRanges asks for the first byte of the file, on the terms of a range request, and
// reports whether the server answered it as one.
func (a *attempt) probeRanges(st *rangeState) bool {
	d := a.d
	req, err := d.request(a.ctx, http.MethodGet)
	if err != nil {
		return false
	}
	req.Header.Set("Range", "bytes=0-0")
	req.Header.Set("If-Range", st.ifRange())
	resp, err := d.do(req)
	if err != nil {
		d.log.Debug("range probe failed; fetching in one stream", "url", d.url, "error", redact.Error(err))
		return false
	}
	defer resp.Body.Close()
	n, _ := io.Copy(io.Discard, io.LimitReader(resp.Body, 2))
	a.netBytes.Add(n)
	a.touch()
	start, end, total, err := parseContentRange(resp.Header.Get("Content-Range"))
	return resp.StatusCode == http.StatusPartialContent && err == nil && start == 0 && end == 0 &&
		total == st.Size && st.sameFile(resp.Header)
}

// loadState reads the saved state of a download in ranges; nil when there is none. A
// state that does not match the data file beside it is discarded with the data.
func (d *download) loadState() (*rangeState, error) {
	b, err := os.ReadFile(d.stPath)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read range state: %w", err)
	}
	st := &rangeState{}
	fi, serr := os.Stat(d.dlPath)
	if err := json.Unmarshal(b, st); err != nil || !st.valid() || serr != nil || fi.Size() != st.Size {
		d.log.Warn("discarding partial download whose range state does not match it", "path", d.stPath)
		d.removePartial()
		return nil, nil
	}
	if d.comp == "" && st.Size > d.limit {
		return nil, fmt.Errorf("%w: the server announced %d bytes, above %s", untrusted.ErrTooLarge, st.Size, d.bound)
	}
	return st, nil
}

// saveState writes st atomically; when data is given, it is synced first so that the
// state never claims bytes the disk may not have.
func (d *download) saveState(st *rangeState, data *os.File) error {
	if data != nil {
		if err := data.Sync(); err != nil {
			return fmt.Errorf("fsync partial download: %w", err)
		}
	}
	b, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("encode range state: %w", err)
	}
	tmp := d.stTemp
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, perm.File)
	if err != nil {
		return fmt.Errorf("save range state: %w", err)
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, d.stPath)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("save range state: %w", err)
	}
	return nil
}

// rangeRun is one attempt at a download in ranges.
type rangeRun struct {
	d     *download
	st    *rangeState
	f     *os.File // the data file, written at the ranges' offsets
	spans []*liveSpan

	net  atomic.Int64  // body bytes read from the network
	kick chan struct{} // a range made progress

	mu   sync.Mutex
	next int // the first span no connection has taken
}

// liveSpan is a span being fetched; done is read by the front and the saver while its
// connection writes.
type liveSpan struct {
	start, end int64
	done       atomic.Int64
}

func (s *liveSpan) complete() bool { return s.start+s.done.Load() == s.end }

// ranged fetches the unfinished ranges of st over several connections, the first of them
// over lead when it is set (the answer to a fresh GET, still unread), while a feeder
// streams the contiguous, completed front of the file from disk into the pipeline.
func (d *download) ranged(ctx context.Context, st *rangeState, lead *http.Response) (sums, int64, error) {
	if lead != nil {
		defer lead.Body.Close()
	}
	f, err := os.OpenFile(d.dlPath, os.O_RDWR, 0)
	if err != nil {
		return sums{}, 0, fmt.Errorf("open partial download: %w", err)
	}
	defer f.Close()
	spans, pending, resumed := liveSpans(st.Ranges)
	r := &rangeRun{d: d, st: st, f: f, spans: spans, kick: make(chan struct{}, 1)}
	d.task.SetTotal(st.Size)
	d.task.Set(resumed)
	front := r.front()
	rm := d.room(front, st.Size-front)
	if err := rm.check(); err != nil {
		return sums{}, 0, err
	}

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	pr, pw := io.Pipe()
	p := &pipeline{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.sums, p.err = d.pipe(ctx, front, pr, func() {}, rm)
		if p.err != nil {
			cancel(p.err)
		}
	}()
	if d.comp == "" {
		// A plain artifact is the image: readers follow its front.
		d.startFollow(d.dlPath, front)
	}
	var feeder sync.WaitGroup
	feeder.Go(func() { r.feed(ctx, pw, front) })

	conns := min(d.connections(), len(pending))
	if len(pending) > 0 {
		d.log.Info("downloading in ranges", "url", d.url, "connections", conns, "ranges", len(st.Ranges),
			"pending", len(pending), "bytes", st.Size, "resumed_bytes", resumed)
	}
	r.runConnections(ctx, cancel, conns, lead)
	feeder.Wait()
	<-p.done

	// The cause is the first failure, not the cancellations it caused.
	if err := context.Cause(ctx); err != nil || p.err != nil {
		if err == nil {
			err = p.err
		}
		r.save()
		return sums{}, r.net.Load(), err
	}
	if err := r.complete(p.sums); err != nil {
		return sums{}, r.net.Load(), err
	}
	return p.sums, r.net.Load(), nil
}

// liveSpans are the spans of ranges as a run tracks them, the indexes of those
// not complete, and the bytes already on disk, which a resume counts as done.
func liveSpans(ranges []span) (spans []*liveSpan, pending []int, resumed int64) {
	for i, s := range ranges {
		ls := &liveSpan{start: s.Start, end: s.End}
		ls.done.Store(s.Done)
		spans = append(spans, ls)
		resumed += s.Done
		if !ls.complete() {
			pending = append(pending, i)
		}
	}
	return spans, pending, resumed
}

// runConnections runs conns connections over the pending spans, the first of
// them over lead when it is set and its span is not complete, while the saver
// writes the state of the ranges as they go; it returns once all have stopped.
func (r *rangeRun) runConnections(ctx context.Context, cancel context.CancelCauseFunc, conns int, lead *http.Response) {
	stop := make(chan struct{})
	var saver sync.WaitGroup
	saver.Go(func() { r.watch(stop) })
	var workers sync.WaitGroup
	for c := range conns {
		var first *http.Response
		if c == 0 && lead != nil && !r.spans[0].complete() {
			first, lead = lead, nil
			r.next = 1 // span 0 is the lead's
			workers.Go(func() { r.work(ctx, cancel, 0, first) })
			continue
		}
		workers.Go(func() { r.work(ctx, cancel, -1, nil) })
	}
	workers.Wait()
	close(stop)
	saver.Wait()
}

// complete ends a run that fetched every range: the file must hold what the
// pipeline processed, and its data is synced before the state that vouches
// for it goes away.
func (r *rangeRun) complete(s sums) error {
	if err := r.d.checkFed(s); err != nil {
		return err
	}
	if err := r.f.Sync(); err != nil {
		return fmt.Errorf("fsync partial download: %w", err)
	}
	if err := os.Remove(r.d.stPath); err != nil {
		return fmt.Errorf("remove range state: %w", err)
	}
	return nil
}

// save writes the state of the ranges as they stand, logging a failure: the download goes
// on, and resumes from an older state at worst.
func (r *rangeRun) save() {
	for i, s := range r.spans {
		r.st.Ranges[i].Done = s.done.Load()
	}
	if err := r.d.saveState(r.st, r.f); err != nil {
		r.d.log.Warn("save range state", "path", r.d.stPath, "error", err)
	}
}

// watch saves the state of the ranges now and then, until stop closes.
func (r *rangeRun) watch(stop <-chan struct{}) {
	every := r.d.f.StateInterval
	if every <= 0 {
		every = stateInterval
	}
	save := time.NewTicker(every)
	defer save.Stop()
	last := r.done()
	for {
		select {
		case <-stop:
			return
		case <-save.C:
			if done := r.done(); done != last {
				r.save()
				last = done
			}
		}
	}
}

// done is the bytes of the file on disk.
func (r *rangeRun) done() int64 {
	var n int64
	for _, s := range r.spans {
		n += s.done.Load()
	}
	return n
}

// front is the length of the contiguous, completed start of the file.
func (r *rangeRun) front() int64 {
	for _, s := range r.spans {
		if !s.complete() {
			return s.start + s.done.Load()
		}
	}
	return r.st.Size
}

// take hands out the next range no connection has, in file order.
func (r *rangeRun) take() (int, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for r.next < len(r.spans) {
		i := r.next
		r.next++
		if !r.spans[i].complete() {
			return i, true
		}
	}
	return 0, false
}

// feed streams the file from offset from to its end into pw as the front reaches it:
// what it reads back is the page cache, never the network.
func (r *rangeRun) feed(ctx context.Context, pw *io.PipeWriter, from int64) {
	rd, err := os.Open(r.d.dlPath)
	if err != nil {
		pw.CloseWithError(fmt.Errorf("open partial download: %w", err))
		return
	}
	defer rd.Close()
	buf := make([]byte, copyBufferSize)
	for pos := from; pos < r.st.Size; {
		front := r.front()
		if front <= pos {
			select {
			case <-r.kick:
			case <-ctx.Done():
				pw.CloseWithError(context.Cause(ctx))
				return
			}
			continue
		}
		n, err := rd.ReadAt(buf[:min(front-pos, int64(len(buf)))], pos)
		if err != nil && !(err == io.EOF && n > 0) {
			pw.CloseWithError(fmt.Errorf("read back partial download: %w", err))
			return
		}
		if _, err := pw.Write(buf[:n]); err != nil {
			return // the pipeline failed and says why
		}
		pos += int64(n)
		if r.d.comp == "" && r.d.req.Follow != nil {
			r.d.req.Follow.Written(pos)
		}
	}
	pw.Close()
}

// work is one connection: it fetches range first (-1 for none) over lead, then takes
// ranges in order until none is left. A failure it cannot retry cancels the download.
func (r *rangeRun) work(ctx context.Context, cancel context.CancelCauseFunc, first int, lead *http.Response) {
	buf := make([]byte, copyBufferSize)
	for {
		i := first
		if i < 0 {
			var ok bool
			if i, ok = r.take(); !ok {
				return
			}
		}
		first = -1
		if err := r.fetch(ctx, r.spans[i], lead, buf); err != nil {
			cancel(err)
			return
		}
		lead = nil
	}
}

// fetch fetches the rest of span s, retrying it alone from where it stopped after a
// transient failure.
func (r *rangeRun) fetch(ctx context.Context, s *liveSpan, lead *http.Response, buf []byte) error {
	d := r.d
	attempts := d.f.Attempts
	if attempts <= 0 {
		attempts = defaultAttempts
	}
	for try := 1; ; try++ {
		err := r.get(ctx, s, lead, buf)
		lead = nil
		if err == nil || ctx.Err() != nil {
			return context.Cause(ctx) // nil unless cancelled
		}
		if errors.Is(err, syscall.ENOSPC) || classify(err) != retry {
			return err
		}
		if try >= attempts {
			return &finalError{fmt.Errorf("bytes %d-%d: gave up after %d attempts: %w", s.start, s.end-1, attempts, err)}
		}
		wait := d.backoff(try)
		d.log.Warn("range failed; retrying it", "url", d.url, "range", fmt.Sprintf("%d-%d", s.start, s.end-1),
			"offset", s.start+s.done.Load(), "attempt", try, "attempts", attempts, "retry_in", wait,
			"error", redact.Error(err))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return context.Cause(ctx)
		case <-t.C:
		}
	}
}

// get makes one request for the rest of span s (or reads it from lead) and writes what
// arrives at its offset, leaving aligned blocks of zeros as holes.
func (r *rangeRun) get(ctx context.Context, s *liveSpan, lead *http.Response, buf []byte) error {
	d := r.d
	rctx, rcancel := context.WithCancel(ctx)
	defer rcancel()
	stall := d.stallTimeout()
	var stalled atomic.Bool
	timer := time.AfterFunc(stall, func() {
		stalled.Store(true)
		rcancel()
	})
	defer timer.Stop()
	from := s.start + s.done.Load()
	resp := lead
	if resp != nil {
		// The lead's request is not under rctx: a stall closes its body instead.
		stop := context.AfterFunc(rctx, func() { resp.Body.Close() })
		defer stop()
	} else {
		req, err := d.request(rctx, http.MethodGet)
		if err != nil {
			return err
		}
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", from, s.end-1))
		req.Header.Set("If-Range", r.st.ifRange())
		resp, err = d.do(req)
		if err != nil {
			if stalled.Load() {
				return fmt.Errorf("bytes %d-%d: no answer for %s", from, s.end-1, stall)
			}
			return err
		}
		if err := r.check(resp, from, s.end); err != nil {
			resp.Body.Close()
			return err
		}
	}
	defer resp.Body.Close()
	body := &activityReader{r: resp.Body, touch: func(n int) {
		timer.Reset(stall)
		r.net.Add(int64(n))
		d.task.Add(int64(n))
	}}
	// buf holds the n bytes from pos that arrived but are not written yet: never more than
	// the part of a sparse block, so that whole blocks of zeros are seen whole, yet what
	// arrives reaches the file (and the front) at once.
	pos, n := from, 0
	for pos < s.end {
		m, err := body.Read(buf[n:min(int64(len(buf)), s.end-pos)])
		n += m
		flush := n
		if err == nil && pos+int64(n) < s.end {
			flush = int(max((pos+int64(n))/sparseBlock*sparseBlock-pos, 0))
		}
		if flush > 0 {
			if werr := writeSparse(r.f, buf[:flush], pos); werr != nil {
				return fmt.Errorf("write partial download: %w", werr)
			}
			pos += int64(flush)
			s.done.Add(int64(flush))
			n = copy(buf, buf[flush:n])
			select {
			case r.kick <- struct{}{}:
			default:
			}
		}
		if err != nil && pos < s.end {
			if stalled.Load() {
				return fmt.Errorf("bytes %d-%d: no data received for %s", pos, s.end-1, stall)
			}
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("bytes %d-%d: %w", pos, s.end-1, err)
		}
	}
	return nil
}

// check checks that resp answers the range request for [from, end) of the file of st.
func (r *rangeRun) check(resp *http.Response, from, end int64) error {
	switch {
	case resp.StatusCode == http.StatusOK:
		if !r.st.sameFile(resp.Header) {
			return fmt.Errorf("%w: a request for bytes %d-%d got another version", errChanged, from, end-1)
		}
		return errRangeIgnored
	case resp.StatusCode == http.StatusRequestedRangeNotSatisfiable:
		return fmt.Errorf("%w: bytes %d-%d are no longer there", errChanged, from, end-1)
	case resp.StatusCode != http.StatusPartialContent:
		return statusError(resp.StatusCode)
	case !r.st.sameFile(resp.Header):
		return fmt.Errorf("%w: bytes %d-%d came from another version", errChanged, from, end-1)
	}
	cr := resp.Header.Get("Content-Range")
	start, _, total, err := parseContentRange(cr)
	switch {
	case err != nil || start != from:
		return fmt.Errorf("%w: asked for bytes %d-%d, got Content-Range %q", errBadContentRange, from, end-1, cr)
	case total >= 0 && total != r.st.Size:
		return fmt.Errorf("%w: the file is now %d bytes, was %d", errChanged, total, r.st.Size)
	}
	return nil
}

// activityReader reports every read that brings data.
type activityReader struct {
	r     io.Reader
	touch func(n int)
}

func (a *activityReader) Read(p []byte) (int, error) {
	n, err := a.r.Read(p)
	if n > 0 {
		a.touch(n)
	}
	return n, err
}

// zeroBlock is an aligned block of zeros, to compare with.
var zeroBlock = make([]byte, sparseBlock)

// writeSparse writes p at off in f, except the whole, aligned sparseBlocks of zeros in it:
// f was sized with holes, so these read back as zeros and take no room on disk.
func writeSparse(f *os.File, p []byte, off int64) error {
	runStart := 0 // the start of the data in p not yet written
	for i := 0; i < len(p); {
		n := min(sparseBlock-int((off+int64(i))%sparseBlock), len(p)-i)
		if n == sparseBlock && bytes.Equal(p[i:i+n], zeroBlock) {
			if runStart < i {
				if _, err := f.WriteAt(p[runStart:i], off+int64(runStart)); err != nil {
					return err
				}
			}
			runStart = i + n
		}
		i += n
	}
	if runStart < len(p) {
		if _, err := f.WriteAt(p[runStart:], off+int64(runStart)); err != nil {
			return err
		}
	}
	return nil
}

// parseContentRange parses "bytes N-M/T"; total is -1 for "*".
func parseContentRange(h string) (start, end, total int64, err error) {
	spec, ok := strings.CutPrefix(h, "bytes ")
	rng, size, ok2 := strings.Cut(spec, "/")
	first, last, ok3 := strings.Cut(rng, "-")
	if !ok || !ok2 || !ok3 {
		return 0, 0, 0, fmt.Errorf("unexpected Content-Range %q", h)
	}
	start, err1 := strconv.ParseInt(strings.TrimSpace(first), 10, 64)
	end, err2 := strconv.ParseInt(strings.TrimSpace(last), 10, 64)
	total, err3 := int64(-1), error(nil)
	if size = strings.TrimSpace(size); size != "*" {
		total, err3 = strconv.ParseInt(size, 10, 64)
	}
	if err1 != nil || err2 != nil || err3 != nil || start < 0 || end < start {
		return 0, 0, 0, fmt.Errorf("unexpected Content-Range %q", h)
	}
	return start, end, total, nil
}
