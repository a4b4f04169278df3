package artifacts

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/diskspace"
	"github.com/nodepool-builder/nodepool-builder/internal/follow"
	"github.com/nodepool-builder/nodepool-builder/internal/hostpattern"
	"github.com/nodepool-builder/nodepool-builder/internal/partial"
	"github.com/nodepool-builder/nodepool-builder/internal/perm"
	"github.com/nodepool-builder/nodepool-builder/internal/redact"
	"github.com/nodepool-builder/nodepool-builder/internal/untrusted"
	"github.com/nodepool-builder/nodepool-builder/progress"
)

const (
	defaultAttempts     = 5
	defaultStallTimeout = 60 * time.Second
	defaultBackoff      = time.Second
	maxBackoff          = 5 * time.Minute
	// copyBufferSize is the chunk size of the transfer; memory use per download is a small
	// multiple of it (plus the zstd window), whatever the image size.
	copyBufferSize = 256 << 10
	userAgent      = "nodepool-builder"
	maxRedirects   = 10
)

// ErrChecksum is wrapped by the error Fetch returns when the downloaded image does not
// match the expected sha256 or md5, or is shorter than its declared size.
var ErrChecksum error = &classed{"checksum mismatch", "checksum"}

var (
	errRangeIgnored    = errors.New("server ignored the Range request")
	errBadContentRange = errors.New("server answered a different range")
	errInconsistent    = errors.New("partial download does not match the bytes processed")
	errBadLength       = errors.New("partial download is longer than the file on the server")
	// errChanged is a file that is not the one the earlier requests of the download got:
	// another validator, another length, or a 200 carrying another validator.
	errChanged = errors.New("the file changed on the server")
)

// statusError is an HTTP answer other than the data.
type statusError int

func (e statusError) Error() string {
	return fmt.Sprintf("server returned %d %s", int(e), http.StatusText(int(e)))
}

// finalError ends a download at once: the failure was retried already, e.g. by the range
// that met it.
type finalError struct{ err error }

func (e *finalError) Error() string { return e.err.Error() }
func (e *finalError) Unwrap() error { return e.err }

// Fetcher downloads image artifacts. The zero value works.
type Fetcher struct {
	// HTTPClient makes the requests; nil means a plain http.Client. A client Timeout would
	// cut long downloads short; StallTimeout is the guard against hung transfers. Fetch
	// uses a copy that follows redirects only on http and https, never from https to http,
	// and at most 10 of them; the client's own CheckRedirect, if any, is asked after that.
	// Its Transport must be an *http.Transport without DialTLSContext: Fetch dials the
	// connections itself, to check the addresses they go to (see Request.Hosts).
	HTTPClient *http.Client
	// Logger receives retry messages; nil means slog.Default().
	Logger *slog.Logger
	// Progress, when set, holds a task for each download while it runs: the bytes
	// of the file as served (compressed ones too) against its length.
	Progress *progress.Tracker
	// Attempts is how many times a download is tried; 0 means 5.
	Attempts int
	// StallTimeout aborts an attempt that receives no data for this long; 0 means 60s.
	StallTimeout time.Duration
	// Backoff is the wait before the second attempt, doubled for each further one;
	// 0 means 1s.
	Backoff time.Duration
	// MaxSize bounds the uncompressed size of every image; 0 means
	// untrusted.DefaultMaxSize.
	MaxSize int64
	// NAT64Prefixes are the prefixes of the network's NAT64 translators besides the
	// well-known 64:ff9b::/96, each one nat64.CheckPrefix accepts: an address in one
	// is judged by the IPv4 address it carries, as the address a connection reaches.
	NAT64Prefixes []netip.Prefix
	// Connections is how many ranges of one file are fetched at the same time, when the
	// server answers Range requests and the file is large enough to gain from it;
	// 0 means DefaultConnections, 1 a single stream.
	Connections int

	// MinRangedSize is the smallest file fetched in ranges: below it the extra
	// requests cost about what they save. 0 means 8 MiB.
	MinRangedSize int64
	// FastStream is the rate, in bytes a second, at which one stream is fast
	// enough to keep rather than splitting the file into ranges; 0 means
	// 100 MiB/s, below 0 never.
	FastStream float64
	// RangeSize, when set, is the length of every range instead of one chosen
	// from the file's size (at most 64 MiB).
	RangeSize int64
	// StateInterval is how often the state of the ranges is saved while they
	// progress: a restart fetches at most this long's worth of data again. 0
	// means one second.
	StateInterval time.Duration
	// FreeSpace reports the bytes still free in a directory's filesystem; nil
	// means the filesystem's own count (diskspace.Free).
	FreeSpace func(dir string) (int64, error)
}

// Request names one artifact download.
type Request struct {
	// URL is the http or https address of the artifact, compressed when it ends in .zst
	// or .gz.
	URL string
	// Files name where the uncompressed file goes once verified, and the files the
	// download keeps beside it while it runs, all in one directory, which must exist:
	// the same names given to a later Fetch resume the download. The store names
	// them (BuildWriter.Download).
	Files partial.Files
	// SHA256 and MD5 are the expected lower-case hex digests of the uncompressed file;
	// either may be empty.
	SHA256, MD5 string
	// Size is the length of the uncompressed file as the artifact declares it, or 0 when
	// unknown. When set, the image must be exactly this long.
	Size int64
	// Label names the download in progress reports and messages, e.g.
	// "<image>-<build_id>.<format>"; empty means the name of Files.Dest. Never the URL:
	// it may carry a token or a signature.
	Label string
	// Follow, when set, is told where the uncompressed file is being written and how
	// far, so that readers can follow it while it is (see package follow): the
	// download itself for a plain artifact, the decompressed output for a compressed
	// one. Fetch neither releases nor fails it: whoever checks the file does.
	Follow *follow.File
	// Hosts is what the download may reach: URL and every redirect must match it, and
	// only hosts it names may be on internal addresses (see the rule in hosts.go). nil
	// allows the host and port of URL alone, as named: right for a URL the caller chose
	// itself, wrong for one taken from a job.
	Hosts *Hosts
}

// Result describes a finished download.
type Result struct {
	// SHA256 and MD5 are the hex digests of the uncompressed file.
	SHA256, MD5 string
	// Size is the length of the uncompressed file.
	Size int64
	// Downloaded counts the bytes fetched over the network by this call.
	Downloaded int64
}

// Fetch downloads req.URL, decompresses it when needed, verifies it and leaves it at
// req.Files.Dest, for the caller to make durable and move into place. Hashes and decompression happen while the data streams in, and the
// decompressed file is written sparse. An interrupted download is resumed with HTTP
// Range, also by a later Fetch with the same Files. A large file from a server that answers
// Range requests is fetched over several connections at once (see Connections), each
// range resumed on its own, while its in-order front streams through the same pipeline.
// A failed or cancelled Fetch keeps the partial download for that, except after a
// checksum mismatch (ErrChecksum, whose Result still carries the digests found), a
// corrupt compressed stream, an image too large (untrusted.ErrTooLarge) or a refused
// host, address or redirect (untrusted.ErrUnsafe). Running short of space
// (diskspace.ErrNoSpace) ends the Fetch at once; the caller decides when to try again.
// URLs in the error and in log messages are redacted (no userinfo, no query string).
// Userinfo in a URL is never sent: it is removed from URL and from every redirect, as is
// the Referer of a redirect.
func (f *Fetcher) Fetch(ctx context.Context, req Request) (Result, error) {
	res, err := f.fetch(ctx, req)
	// The messages below use redacted URLs already; this catches those that net/http
	// puts in its own errors, such as a redirect target's.
	return res, redact.Error(err)
}

func (f *Fetcher) fetch(ctx context.Context, req Request) (Result, error) {
	safeURL := redact.URL(req.URL)
	u, err := checkRequest(req)
	if err != nil {
		return Result{}, fmt.Errorf("download %s: %w", safeURL, err)
	}
	hosts := req.Hosts
	if hosts == nil {
		hosts = &Hosts{}
		hosts.Name(hostpattern.Exact(u))
	}
	name := cmp.Or(req.Label, filepath.Base(req.Files.Dest))
	if err := hosts.check(u, "URL"); err != nil {
		return Result{}, fmt.Errorf("download %s: %w", name, err)
	}
	// The job's userinfo is no credential of ours: never sent as Basic auth.
	u.User = nil
	client, err := f.client(hosts)
	if err != nil {
		return Result{}, fmt.Errorf("download %s: %w", safeURL, err)
	}
	defer client.CloseIdleConnections()
	maxSize := f.MaxSize
	if maxSize <= 0 {
		maxSize = untrusted.DefaultMaxSize
	}
	if req.Size > maxSize {
		return Result{}, fmt.Errorf("download %s from %s: %w: declared size %d bytes is above the maximum of %d",
			name, safeURL, untrusted.ErrTooLarge, req.Size, maxSize)
	}
	logger := f.Logger
	if logger == nil {
		logger = slog.Default()
	}
	d := &download{
		f:       f,
		req:     req,
		name:    name,
		url:     safeURL,
		target:  u.String(),
		client:  client,
		log:     logger.With("download", name),
		dlPath:  req.Files.Download,
		stPath:  req.Files.Ranges,
		stTemp:  req.Files.RangesTemp,
		outPath: req.Files.Dest,
		comp:    Compression(req.URL),
		limit:   maxSize,
		bound:   fmt.Sprintf("the maximum of %d bytes", maxSize),
	}
	if req.Size > 0 {
		d.limit, d.bound = req.Size, fmt.Sprintf("the declared size of %d bytes", req.Size)
	}
	d.task = f.Progress.Start(progress.Download, name, 0)
	defer d.task.End()
	return d.run(ctx)
}

// client returns a copy of the Fetcher's HTTP client for one download, leaving the
// caller's untouched: its connections obey hosts (guardedTransport), and its redirects
// checkRedirect and hosts, without userinfo or Referer.
func (f *Fetcher) client(hosts *Hosts) (*http.Client, error) {
	c := &http.Client{}
	if f.HTTPClient != nil {
		*c = *f.HTTPClient
	}
	t, err := guardedTransport(c.Transport, hosts, newAddressRule(f.NAT64Prefixes))
	if err != nil {
		return nil, err
	}
	c.Transport = t
	next := c.CheckRedirect
	c.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if err := checkRedirect(req, via); err != nil {
			return err
		}
		if err := hosts.check(req.URL, "redirect to"); err != nil {
			return err
		}
		// net/http would send the target's userinfo as Basic auth, and the URL redirected
		// from, query and all, as Referer.
		req.URL.User = nil
		req.Header.Del("Referer")
		if next != nil {
			return next(req, via)
		}
		return nil
	}
	return c, nil
}

// checkRedirect refuses a redirect that leaves http and https, that goes back to http
// once on https (where a man in the middle could then serve the image), or that comes
// after maxRedirects others.
func checkRedirect(req *http.Request, via []*http.Request) error {
	target := redact.URL(req.URL.String())
	switch {
	case req.URL.Scheme != "http" && req.URL.Scheme != "https":
		return fmt.Errorf("%w: refused redirect to %s: only http and https are followed", untrusted.ErrUnsafe, target)
	case req.URL.Scheme == "http" && slices.ContainsFunc(via, func(r *http.Request) bool { return r.URL.Scheme == "https" }):
		return fmt.Errorf("%w: refused redirect from https to %s", untrusted.ErrUnsafe, target)
	case len(via) > maxRedirects:
		return fmt.Errorf("%w: refused redirect to %s: stopped after %d redirects", untrusted.ErrUnsafe, target, maxRedirects)
	}
	return nil
}

// checkRequest checks the request and returns its parsed URL.
// ErrUnfetchableURL is wrapped by the refusal of an artifact URL the builder cannot fetch
// whatever the config says: not a URL, not http or https (s3://, swift://), or without a
// host. The job published it: it is the build's to fix.
var ErrUnfetchableURL = errors.New("artifact URL cannot be fetched")

// parseURL parses an artifact URL, refusing one that cannot be fetched.
func parseURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		// url.Error repeats the URL whole, secrets and all.
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return nil, fmt.Errorf("%w: parse URL: %w", ErrUnfetchableURL, err)
	}
	switch {
	case u.Scheme == "s3":
		return nil, fmt.Errorf("%w: unsupported URL scheme %q: only http and https are fetched; the image job should "+
			"publish the object's https URL (its bucket's endpoint, or a presigned URL), as zuul-jobs' upload-image-s3 does",
			ErrUnfetchableURL, u.Scheme)
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("%w: unsupported URL scheme %q: only http and https are fetched; the image job should "+
			"publish an http or https URL", ErrUnfetchableURL, u.Scheme)
	case u.Hostname() == "":
		return nil, fmt.Errorf("%w: URL has no host", ErrUnfetchableURL)
	}
	return u, nil
}

func checkRequest(req Request) (*url.URL, error) {
	u, err := parseURL(req.URL)
	if err != nil {
		return nil, err
	}
	fs := req.Files
	if fs.Dest == "" || fs.Download == "" || fs.Ranges == "" || fs.RangesTemp == "" {
		return nil, errors.New("no destination path, or not all the files of the download named")
	}
	if req.Size < 0 {
		return nil, fmt.Errorf("negative declared size %d", req.Size)
	}
	return u, nil
}

// download is the state of one Fetch call.
type download struct {
	f       *Fetcher
	req     Request
	name    string // the download's, for messages
	url     string // req.URL redacted, for messages
	target  string // req.URL without userinfo, to request
	client  *http.Client
	log     *slog.Logger
	dlPath  string // the bytes as served, possibly compressed; resumed across attempts
	stPath  string // the state of the ranges of dlPath, when it is fetched in ranges
	stTemp  string // stPath while it is written
	outPath string // the decompressed data, rebuilt on every attempt: req.Files.Dest
	comp    string
	limit   int64  // the most bytes the uncompressed image may have
	bound   string // what limit is, for messages
	task    *progress.Task
	// single is set once ranges failed on this server: the rest of the Fetch uses one
	// stream.
	single bool
}

// action is what to do after a failed attempt.
type action int

const (
	retry      action = iota // back off and try again
	reset                    // discard the partial files, back off and try again
	restartNow               // discard the partial files and try again at once
	giveUp                   // return the error
)

func (d *download) run(ctx context.Context) (Result, error) {
	attempts := d.f.Attempts
	if attempts <= 0 {
		attempts = defaultAttempts
	}
	var downloaded int64
	restarted, changed := false, false
	for attempt := 1; ; attempt++ {
		s, n, err := d.attempt(ctx)
		downloaded += n
		if err == nil {
			res, err := d.finish(s)
			res.Downloaded = downloaded
			return res, err
		}
		d.removeOutput()
		if ctx.Err() != nil {
			return Result{Downloaded: downloaded}, fmt.Errorf("download %s from %s: %w", d.name, d.url, ctx.Err())
		}
		if errors.Is(err, syscall.ENOSPC) && !errors.Is(err, diskspace.ErrNoSpace) {
			err = fmt.Errorf("%w in %s: %w", diskspace.ErrNoSpace, filepath.Dir(d.dlPath), err)
		}
		if errors.Is(err, errRangeIgnored) {
			d.single = true
		}
		if errors.Is(err, errChanged) {
			d.removePartial()
			if !changed {
				// Only once: the new version's ranges are fetched afresh.
				changed = true
				d.log.Info("file changed on the server during the download; starting over", "url", d.url)
				attempt--
				continue
			}
			// Again: a single stream at least reads one version whole.
			d.single = true
		}
		act := classify(err)
		if act == restartNow && !restarted {
			// Only once: without a partial file no Range is sent, so this cannot recur.
			restarted = true
			d.log.Info("server does not resume downloads; starting over", "url", d.url)
			d.removePartial()
			attempt--
			continue
		}
		if act == giveUp {
			if errors.As(err, new(*decodeError)) || errors.Is(err, untrusted.ErrTooLarge) || errors.Is(err, untrusted.ErrUnsafe) {
				d.removePartial() // corrupt, too large or unsafe as served: nothing worth resuming
			}
			return Result{Downloaded: downloaded}, fmt.Errorf("download %s from %s: %w", d.name, d.url, err)
		}
		if act != retry {
			d.removePartial()
		}
		if attempt >= attempts {
			return Result{Downloaded: downloaded}, fmt.Errorf("download %s from %s: gave up after %d attempts: %w",
				d.name, d.url, attempts, err)
		}
		wait := d.backoff(attempt)
		d.log.Warn("download attempt failed; retrying", "url", d.url, "attempt", attempt,
			"attempts", attempts, "retry_in", wait, "error", redact.Error(err))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return Result{Downloaded: downloaded}, fmt.Errorf("download %s from %s: %w", d.name, d.url, ctx.Err())
		case <-t.C:
		}
	}
}

func (d *download) backoff(attempt int) time.Duration {
	wait := d.f.Backoff
	if wait <= 0 {
		wait = defaultBackoff
	}
	for i := 1; i < attempt && wait < maxBackoff; i++ {
		wait *= 2
	}
	return min(wait, maxBackoff)
}

func classify(err error) action {
	var status statusError
	var decode *decodeError
	switch {
	case errors.Is(err, diskspace.ErrNoSpace), errors.Is(err, untrusted.ErrTooLarge), errors.Is(err, untrusted.ErrUnsafe),
		errors.As(err, new(*finalError)):
		return giveUp
	case errors.Is(err, errRangeIgnored):
		return restartNow
	case errors.Is(err, errBadLength), errors.Is(err, errBadContentRange), errors.Is(err, errInconsistent),
		errors.Is(err, errChanged):
		return reset
	case errors.As(err, &status):
		switch {
		case status == http.StatusRequestedRangeNotSatisfiable:
			return reset
		case status == http.StatusRequestTimeout, status == http.StatusTooEarly,
			status == http.StatusTooManyRequests, status >= 500:
			return retry
		}
		return giveUp
	case errors.As(err, &decode):
		// A corrupt stream read partly from disk may be a damaged partial file: fetch it
		// afresh. A corrupt stream fresh from the server is not going to improve.
		if decode.resumed {
			return reset
		}
		return giveUp
	}
	return retry
}

// attempt runs one transfer and returns the digests of the data, the bytes it read from
// the network and the error that ended it. A download with saved range state resumes its
// ranges; any other starts or resumes one stream, whose first answer may show that the
// file is better fetched in ranges.
func (d *download) attempt(ctx context.Context) (sums, int64, error) {
	// The decompressed output is rebuilt from the start on every attempt; removing it
	// first also frees its space before the free-space check.
	if err := d.removeOutput(); err != nil {
		return sums{}, 0, err
	}
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := d.loadState()
	if err != nil {
		return sums{}, 0, err
	}
	if st != nil {
		return d.ranged(actx, st, nil)
	}

	a := &attempt{d: d, ctx: actx}
	a.total.Store(-1)
	a.touch()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { a.monitor(stop, cancel) })
	s, lead, st, err := a.stream()
	close(stop)
	wg.Wait()
	net := a.netBytes.Load()
	switch {
	case a.stalled.Load() && ctx.Err() == nil:
		if lead != nil {
			lead.Body.Close()
		}
		return sums{}, net, fmt.Errorf("no data received for %s", d.stallTimeout())
	case err != nil:
		return sums{}, net, err
	case st != nil:
		s, n, err := d.ranged(actx, st, lead)
		return s, net + n, err
	}
	return s, net, nil
}

// finish verifies the digests and commits the data file to Dest.
func (d *download) finish(s sums) (Result, error) {
	res := Result{SHA256: s.sha256, MD5: s.md5, Size: s.size}
	if d.req.Size > 0 && s.size != d.req.Size {
		d.removePartial()
		d.removeOutput()
		return res, fmt.Errorf("download %s from %s: %w: size expected %d, got %d",
			d.name, d.url, ErrChecksum, d.req.Size, s.size)
	}
	for _, c := range []struct{ name, want, got string }{
		{"sha256", d.req.SHA256, s.sha256},
		{"md5", d.req.MD5, s.md5},
	} {
		if want := strings.ToLower(strings.TrimSpace(c.want)); want != "" && want != c.got {
			d.removePartial()
			d.removeOutput()
			return res, fmt.Errorf("download %s from %s: %w: %s expected %s, got %s",
				d.name, d.url, ErrChecksum, c.name, want, c.got)
		}
	}
	// Compressed data was decompressed into Dest; uncompressed data is the download
	// itself, which the pipeline only hashed. The caller makes Dest durable.
	if d.comp == "" {
		if err := os.Rename(d.dlPath, d.outPath); err != nil {
			return res, fmt.Errorf("download %s: %w", d.name, err)
		}
	} else if err := os.Remove(d.dlPath); err != nil {
		// The image is there; a stray partial only costs space until the next sweep.
		d.log.Warn("remove compressed download", "path", d.dlPath, "error", err)
	}
	d.log.Info("download complete", "dest", d.outPath, "bytes", s.size, "sha256", s.sha256)
	return res, nil
}

func (d *download) removeOutput() error {
	if d.comp == "" {
		return nil
	}
	if err := os.Remove(d.outPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale decompressed output: %w", err)
	}
	return nil
}

// removePartial discards the download so far, with the state of its ranges.
func (d *download) removePartial() {
	// The state goes first: a full-length file of holes must never be left without it.
	for _, p := range []string{d.stPath, d.stTemp, d.dlPath} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			d.log.Warn("remove partial download", "path", p, "error", err)
		}
	}
}

func (d *download) stallTimeout() time.Duration {
	if d.f.StallTimeout > 0 {
		return d.f.StallTimeout
	}
	return defaultStallTimeout
}

// attempt is one single-stream transfer: it tees the response body into the hashing and
// decompressing pipeline and the partial file, and watches for stalls.
type attempt struct {
	d   *download
	ctx context.Context

	lastActive atomic.Int64 // unix nanoseconds of the last byte seen
	netBytes   atomic.Int64 // body bytes read from the network
	offset     atomic.Int64 // where the GET started in the file
	total      atomic.Int64 // size of the whole file as served; -1 when unknown
	stalled    atomic.Bool
}

func (a *attempt) touch() { a.lastActive.Store(time.Now().UnixNano()) }

// stream fetches the file, or its rest, in one GET. A fresh download's GET doubles as the
// probe for ranges: when its answer shows the file is worth fetching in ranges, stream
// returns that answer, still unread, with the new range state for the caller to go on
// with.
func (a *attempt) stream() (sums, *http.Response, *rangeState, error) {
	d := a.d
	var offset int64
	if fi, err := os.Stat(d.dlPath); err == nil {
		offset = fi.Size()
	} else if !errors.Is(err, os.ErrNotExist) {
		return sums{}, nil, nil, fmt.Errorf("stat partial download: %w", err)
	}
	if offset > 0 {
		size, ranges, err := a.head()
		switch {
		case err != nil:
			return sums{}, nil, nil, err
		case size == offset:
			s, err := a.verifyPartial(size)
			return s, nil, nil, err
		case size >= 0 && size < offset:
			return sums{}, nil, nil, fmt.Errorf("%w: %d bytes on disk, %d on the server", errBadLength, offset, size)
		case !ranges:
			offset = 0 // the server cannot resume it
		}
	}

	resp, err := a.get(offset)
	if err != nil {
		return sums{}, nil, nil, err
	}
	if d.comp == "" && resp.ContentLength >= 0 && offset+resp.ContentLength > d.limit {
		resp.Body.Close()
		return sums{}, nil, nil, fmt.Errorf("%w: the server announces %d bytes, above %s", untrusted.ErrTooLarge, offset+resp.ContentLength, d.bound)
	}
	if offset == 0 {
		st, err := d.startRanges(a, resp)
		if err != nil || st != nil {
			if err != nil {
				resp.Body.Close()
				resp = nil
			}
			return sums{}, resp, st, err
		}
	}
	defer resp.Body.Close()
	s, err := a.copy(resp, offset)
	return s, nil, nil, err
}

// head asks the length of the file and whether the server resumes it: size is -1 when
// unknown, and ranges is also true when the server refused HEAD, as servers of URLs signed
// for GET only do; the GET then tells.
func (a *attempt) head() (size int64, ranges bool, err error) {
	req, err := a.d.request(a.ctx, http.MethodHead)
	if err != nil {
		return 0, false, err
	}
	resp, err := a.d.do(req)
	if err != nil {
		return 0, false, err
	}
	resp.Body.Close()
	a.touch()
	if resp.StatusCode != http.StatusOK {
		return -1, true, nil
	}
	return resp.ContentLength, acceptsRanges(resp.Header), nil
}

// get sends the GET for the file from offset and checks that the answer is the data asked
// for.
func (a *attempt) get(offset int64) (*http.Response, error) {
	d := a.d
	req, err := d.request(a.ctx, http.MethodGet)
	if err != nil {
		return nil, err
	}
	if offset > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", offset))
	}
	resp, err := d.do(req)
	if err != nil {
		return nil, err
	}
	a.touch()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		resp.Body.Close()
		return nil, statusError(resp.StatusCode)
	}
	if offset > 0 {
		if resp.StatusCode != http.StatusPartialContent {
			resp.Body.Close()
			return nil, errRangeIgnored
		}
		cr := resp.Header.Get("Content-Range")
		if start, err := contentRangeStart(cr); err != nil || start != offset {
			resp.Body.Close()
			return nil, fmt.Errorf("%w: asked for bytes from %d, got Content-Range %q", errBadContentRange, offset, cr)
		}
		d.log.Info("resuming download", "url", d.url, "offset", offset)
	}
	return resp, nil
}

// verifyPartial runs a partial download found complete through the pipeline.
func (a *attempt) verifyPartial(size int64) (sums, error) {
	a.d.log.Info("partial download is complete; verifying", "bytes", size)
	a.d.task.SetTotal(size)
	a.d.task.Set(size)
	rm := a.d.room(size, 0)
	if err := rm.check(); err != nil {
		return sums{}, err
	}
	if a.d.comp == "" {
		a.d.startFollow(a.d.dlPath, size)
	}
	s, err := a.d.pipe(a.ctx, size, nil, a.touch, rm)
	if err != nil {
		return sums{}, err
	}
	return s, a.d.checkFed(s)
}

// copy reads the body to the end, handing every chunk to the pipeline before it writes it
// to the partial file, so that the file never holds bytes the pipeline did not see.
func (a *attempt) copy(resp *http.Response, offset int64) (sums, error) {
	d := a.d
	rm := d.room(offset, resp.ContentLength)
	if err := rm.check(); err != nil {
		return sums{}, err
	}
	a.startProgress(offset, resp.ContentLength)
	f, err := d.openPartial(offset)
	if err != nil {
		return sums{}, err
	}
	defer f.Close()
	w, sparse := d.partialWriter(f, offset)
	if sparse != nil {
		// A plain artifact is the image: readers follow it as the sparse writer goes.
		if d.req.Follow != nil {
			d.startFollow(d.dlPath, offset)
			sparse.written = d.req.Follow.Written
		}
	}

	pr, pw := io.Pipe()
	p := &pipeline{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.sums, p.err = d.pipe(a.ctx, offset, pr, a.touch, rm)
	}()
	cerr := a.tee(resp.Body, pw, w)
	if sparse != nil {
		cerr = d.endSparse(sparse, cerr)
	}
	if cerr != nil {
		pw.CloseWithError(cerr)
	} else {
		pw.Close()
	}
	<-p.done
	if cerr == nil {
		cerr = p.err
	}
	if err := f.Close(); err != nil && cerr == nil {
		cerr = fmt.Errorf("close partial download: %w", err)
	}
	if cerr != nil {
		return sums{}, cerr
	}
	return p.sums, d.checkFed(p.sums)
}

// startProgress counts the bytes a resume starts from as done, and the whole
// artifact as the total when the body's length is known, for the progress
// shown and for the attempt's own accounting.
func (a *attempt) startProgress(offset, contentLength int64) {
	a.offset.Store(offset)
	a.d.task.Set(offset)
	if contentLength >= 0 {
		a.total.Store(offset + contentLength)
		a.d.task.SetTotal(offset + contentLength)
	}
}

// openPartial opens the partial download for writing at offset: a fresh one
// from the start, a resumed one after the bytes it holds.
func (d *download) openPartial(offset int64) (*os.File, error) {
	flag := os.O_WRONLY
	if offset == 0 {
		flag |= os.O_CREATE | os.O_TRUNC
	}
	f, err := os.OpenFile(d.dlPath, flag, perm.File)
	if err != nil {
		return nil, fmt.Errorf("open partial download: %w", err)
	}
	if offset > 0 {
		if _, err := f.Seek(offset, io.SeekStart); err != nil {
			f.Close()
			return nil, fmt.Errorf("seek partial download: %w", err)
		}
	}
	return f, nil
}

// partialWriter is how the body is written to f. A plain artifact is the
// image: its blocks of zeros become holes (sparse, which endSparse ends). A
// stream cut short leaves the file at its last data, and a resume fetches the
// rest from there. A compressed one is written as it comes (sparse is nil).
func (d *download) partialWriter(f *os.File, offset int64) (w io.Writer, sparse *sparseWriter) {
	if d.comp != "" {
		return f, nil
	}
	sparse = newSparseWriter(f)
	sparse.size = offset
	return sparse, sparse
}

// tee reads body to the end, writing every chunk to the pipeline before it
// writes it to w, and counting it as progress. It returns why it stopped
// early: the pipeline's own error, a failed write, or a failed read.
func (a *attempt) tee(body io.Reader, pipe io.Writer, w io.Writer) error {
	buf := make([]byte, copyBufferSize)
	for {
		n, err := body.Read(buf)
		if n > 0 {
			a.netBytes.Add(int64(n))
			a.d.task.Add(int64(n))
			a.touch()
			if _, werr := pipe.Write(buf[:n]); werr != nil {
				return werr // the pipeline's own error
			}
			if _, werr := w.Write(buf[:n]); werr != nil {
				return fmt.Errorf("write partial download: %w", werr)
			}
		}
		if err != nil {
			if err != io.EOF {
				return err
			}
			return nil
		}
	}
}

// endSparse ends the sparse writing of a body that ended with cerr: a
// complete one gets its last block and its length, an interrupted one what it
// holds of its last block, so that a resume starts after every byte written.
func (d *download) endSparse(sparse *sparseWriter, cerr error) error {
	if cerr == nil {
		if err := sparse.finish(); err != nil {
			return fmt.Errorf("write partial download: %w", err)
		}
		return nil
	}
	if err := sparse.flush(); err != nil {
		// What was received and not written is fetched again on resume.
		d.log.Debug("could not write the tail of an interrupted download", "error", err)
	}
	return cerr
}

// checkFed checks that the partial file holds exactly the bytes the pipeline processed.
func (d *download) checkFed(s sums) error {
	fi, err := os.Stat(d.dlPath)
	if err != nil {
		return fmt.Errorf("stat partial download: %w", err)
	}
	if fi.Size() != s.fed {
		return fmt.Errorf("%w: file has %d bytes, processed %d", errInconsistent, fi.Size(), s.fed)
	}
	return nil
}

// startFollow tells Request.Follow, if any, that the image is being written
// at path, its first written bytes there already. Readers that cannot follow
// it fail; the download goes on.
func (d *download) startFollow(path string, written int64) {
	if d.req.Follow == nil {
		return
	}
	if err := d.req.Follow.Start(path, written); err != nil {
		d.log.Warn("the uploads that follow the download cannot read it; they fail, and are made once it is done", "error", err)
		d.req.Follow.Fail(err)
	}
}

// request builds a request for the artifact.
func (d *download) request(ctx context.Context, method string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, d.target, nil)
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("User-Agent", userAgent)
	// Transparent gzip by the transport would break byte offsets for Range.
	req.Header.Set("Accept-Encoding", "identity")
	return req, nil
}

// do sends req with the download's client.
func (d *download) do(req *http.Request) (*http.Response, error) {
	resp, err := d.client.Do(req)
	var uerr *url.Error
	if errors.Is(err, untrusted.ErrUnsafe) && errors.As(err, &uerr) {
		// Our refusal names the redirect target, redacted; url.Error would repeat it whole.
		// A refused address is named by the dial, which knows no host: the URL does.
		if u, perr := url.Parse(uerr.URL); perr == nil && errors.Is(err, ErrInternalAddress) {
			return nil, fmt.Errorf("%w (host %s, of %s; add %s to the zuul-image's artifact-hosts if it is yours)",
				uerr.Err, u.Host, redact.URL(uerr.URL), HostEntry(u))
		}
		return nil, uerr.Err
	}
	return resp, err
}

// acceptsRanges reports whether the headers announce byte ranges.
func acceptsRanges(h http.Header) bool {
	for _, v := range h.Values("Accept-Ranges") {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), "bytes") {
				return true
			}
		}
	}
	return false
}

// monitor cancels the attempt when no data arrives for the stall timeout. Progress is
// the tracker's to report.
func (a *attempt) monitor(stop <-chan struct{}, cancel context.CancelFunc) {
	stall := a.d.stallTimeout()
	tick := max(min(time.Second, stall/4), 10*time.Millisecond)
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			if now.Sub(time.Unix(0, a.lastActive.Load())) > stall {
				a.stalled.Store(true)
				cancel()
				return
			}
		}
	}
}

// contentRangeStart parses the first byte position of "bytes N-M/T".
func contentRangeStart(h string) (int64, error) {
	spec, ok := strings.CutPrefix(h, "bytes ")
	start, _, ok2 := strings.Cut(spec, "-")
	n, err := strconv.ParseInt(strings.TrimSpace(start), 10, 64)
	if !ok || !ok2 || err != nil {
		return 0, fmt.Errorf("unexpected Content-Range %q", h)
	}
	return n, nil
}
