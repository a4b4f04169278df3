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
	"math"
	"os"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/nodepool-builder/nodepool-builder/internal/fanout"
	"github.com/nodepool-builder/nodepool-builder/internal/perm"
	"github.com/nodepool-builder/nodepool-builder/internal/untrusted"
)

// sums is what one pass of the pipeline learnt about the data.
type sums struct {
	sha256, md5 string
	size        int64 // uncompressed bytes
	fed         int64 // bytes as served (compressed or not) that went in
}

// pipeline is a pipe run in its own goroutine; done is closed when sums and err are set.
type pipeline struct {
	done chan struct{}
	sums sums
	err  error
}

// decodeError is a corrupt compressed stream, as opposed to a failure to read it.
type decodeError struct {
	err     error
	resumed bool // part of the stream came from a partial file on disk
}

func (e *decodeError) Error() string { return "decompress: " + e.err.Error() }
func (e *decodeError) Unwrap() error { return e.err }

// sparseBlock is the unit of the holes in a decompressed image: an aligned block of this
// many zero bytes is skipped rather than written. A multiple of every common filesystem
// block size, so each skipped block is a real hole.
const sparseBlock = 64 << 10

// zstdMaxWindow bounds the history the zstd decoder keeps, and so its memory: the window
// zstd's own command line decompresses by default, which covers every stream made
// without --long=28 or more. A crafted frame could otherwise ask for gigabytes.
const zstdMaxWindow = 128 << 20

// pipeBuffers is the number of copyBufferSize buffers a pipe reuses to hand the data from
// one stage to the next: enough for the decoder to stay ahead of the slowest stage, few
// enough that memory stays flat.
const pipeBuffers = 8

// syncEvery is how many bytes of output (holes included) the writer lets pile up before
// it asks the kernel to start writing them back: the disk then works while the stream
// goes on, and the final fsync finds little left to do. On a 1 GiB image this cut the
// final fsync from about 300 ms to about 100 ms; the hint costs one system call per step.
const syncEvery = 8 << 20

// pipeCopier hands the data of a pipe from stage to stage.
var pipeCopier = fanout.Copier{BufferSize: copyBufferSize, Buffers: pipeBuffers}

// pipe hashes and, for compressed downloads, decompresses the stream made of the first
// prefix bytes of the partial download on disk followed by net (nil for none). Each run
// writes the decompressed output from the start, so a resumed download re-reads only its
// local prefix, never the network. It stops with untrusted.ErrTooLarge once the image
// grows beyond d.limit and with diskspace.ErrNoSpace when rm finds the filesystem too
// full.
//
// The stages run in parallel, each on its own goroutine: the reading (and decompressing)
// on the caller's, then sha256, md5 and, for compressed downloads, the output file. md5
// is the slowest, and everything else hides behind it.
func (d *download) pipe(ctx context.Context, prefix int64, net *io.PipeReader, touch func(), rm *room) (s sums, err error) {
	if net != nil {
		// Whatever happens here, a writer blocked on the pipe must be released.
		defer func() {
			if err != nil {
				net.CloseWithError(err)
			} else {
				net.CloseWithError(io.ErrClosedPipe)
			}
		}()
	}
	var parts []io.Reader
	if prefix > 0 {
		f, err := os.Open(d.dlPath)
		if err != nil {
			return s, fmt.Errorf("open partial download: %w", err)
		}
		defer f.Close()
		parts = append(parts, &prefixReader{ctx: ctx, r: f, n: prefix})
	}
	if net != nil {
		parts = append(parts, net)
	}
	src := &countReader{r: io.MultiReader(parts...), touch: touch, room: rm}

	h256, h5 := sha256.New(), md5.New()
	if d.comp == "" {
		// The file as served is the image: one byte beyond the limit is enough to refuse.
		s.size, err = pipeCopier.Copy(ctx, io.LimitReader(src, overLimit(d.limit)), h256, h5)
		if err != nil {
			return s, err
		}
		if s.size > d.limit {
			return s, fmt.Errorf("%w: the server sent more than %s", untrusted.ErrTooLarge, d.bound)
		}
	} else {
		s.size, err = d.decompress(ctx, src, prefix > 0, rm, h256, h5)
		if err != nil {
			return s, err
		}
	}
	s.sha256 = hex.EncodeToString(h256.Sum(nil))
	s.md5 = hex.EncodeToString(h5.Sum(nil))
	s.fed = src.n
	return s, nil
}

// overLimit returns limit+1, the bytes to read to tell whether there are more than limit.
func overLimit(limit int64) int64 {
	if limit == math.MaxInt64 {
		return limit
	}
	return limit + 1
}

// decompress writes the decompressed src, sparse, to the output file and to hashes, each
// on its own goroutine, and syncs the file. Errors of the stream itself come back as
// *decodeError.
func (d *download) decompress(ctx context.Context, src *countReader, resumed bool, rm *room, hashes ...io.Writer) (int64, error) {
	f, err := os.OpenFile(d.outPath, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, perm.File)
	if err != nil {
		return 0, fmt.Errorf("create decompressed output: %w", err)
	}
	defer f.Close()
	d.startFollow(d.outPath, 0)
	out := newImageWriter(f)
	if d.req.Follow != nil {
		out.sparse.written = d.req.Follow.Written
	}
	img := &imageReader{limit: d.limit, bound: d.bound, room: rm}
	// failed tells a corrupt stream from a broken input, a failed write, an image too
	// large or too big for the disk, and a cancelled pipe.
	failed := func(err error) error {
		switch {
		case src.err != nil:
			return src.err
		case out.err != nil:
			return out.err
		case img.err != nil:
			return img.err
		case ctx.Err() != nil:
			return ctx.Err()
		}
		return &decodeError{err: err, resumed: resumed}
	}

	switch d.comp {
	case "zst":
		// The frame header may announce the decompressed size: refuse an image too large
		// before writing any of it, and check the space against the real size. A short
		// read is for the decoder to judge; a failed one is in src.err.
		head := make([]byte, zstd.HeaderMaxSize)
		m, _ := io.ReadFull(src, head)
		if src.err != nil {
			return 0, src.err
		}
		head = head[:m]
		var h zstd.Header
		if err := h.Decode(head); err == nil && h.HasFCS {
			if h.FrameContentSize > uint64(d.limit) {
				return 0, fmt.Errorf("%w: the zstd frame announces %d bytes, above %s", untrusted.ErrTooLarge, h.FrameContentSize, d.bound)
			}
			if err := rm.learnImageSize(int64(h.FrameContentSize)); err != nil {
				return 0, err
			}
		} // else the decoder reports what is wrong with the stream, if anything
		// One decoder, decoding on the reading goroutine: memory stays at about the
		// stream's window size, which is bounded (for a single-segment frame, the window
		// is the announced content size).
		zr, err := zstd.NewReader(io.MultiReader(bytes.NewReader(head), src),
			zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(zstdMaxWindow))
		if err != nil {
			return 0, failed(err)
		}
		defer zr.Close()
		img.r = zr
	case "gz":
		zr, err := gzip.NewReader(src)
		if err != nil {
			return 0, failed(err)
		}
		defer zr.Close()
		img.r = zr
	default:
		return 0, fmt.Errorf("unknown compression %q", d.comp)
	}
	n, err := pipeCopier.Copy(ctx, img, append(hashes, out)...)
	if err != nil {
		return n, failed(err)
	}
	// The decoders stop at the end of the stream; anything after it is not ours to drop.
	var one [1]byte
	if m, _ := io.ReadFull(src, one[:]); m > 0 {
		return n, failed(errors.New("data after the end of the compressed stream"))
	}
	if src.err != nil {
		return n, src.err
	}
	if err := f.Close(); err != nil {
		return n, fmt.Errorf("close decompressed output: %w", err)
	}
	return n, nil
}

// imageReader reads the decompressed image for the stages of decompress. It fails once
// the image grows beyond limit, and counts the bytes toward the free-space check as they
// leave for the output file: on the reading goroutine, where the room also learns of the
// compressed bytes. err is its own first error, as opposed to the decoder's.
type imageReader struct {
	r     io.Reader
	n     int64
	limit int64
	bound string // what limit is, for messages
	room  *room
	err   error
}

func (r *imageReader) Read(p []byte) (int, error) {
	// One byte beyond the limit is enough to refuse.
	if left := overLimit(r.limit) - r.n; int64(len(p)) > left {
		p = p[:left]
	}
	n, err := r.r.Read(p)
	r.n += int64(n)
	switch {
	case r.n > r.limit:
		r.err = fmt.Errorf("%w: decompressed to more than %s", untrusted.ErrTooLarge, r.bound)
	case n > 0:
		if serr := r.room.progress(0, int64(n)); serr != nil {
			r.err = fmt.Errorf("write decompressed output: %w", serr)
		}
	}
	if r.err != nil {
		return n, r.err
	}
	return n, err
}

// imageWriter is the stage of decompress that writes the output file, sparse. It has the
// kernel write the data back as it goes, and syncs the file as soon as it has the whole
// image, while the hashes may still be at work. err is its first error, wrapped.
type imageWriter struct {
	f      *os.File
	sparse *sparseWriter
	synced int64 // bytes of the file whose writeback has been started
	err    error
}

func newImageWriter(f *os.File) *imageWriter {
	return &imageWriter{f: f, sparse: newSparseWriter(f)}
}

func (w *imageWriter) Write(p []byte) (int, error) {
	n, err := w.sparse.Write(p)
	if err != nil {
		return n, w.fail(fmt.Errorf("write decompressed output: %w", err))
	}
	if w.sparse.size-w.synced >= syncEvery {
		startWriteback(w.f, w.synced, w.sparse.size-w.synced)
		w.synced = w.sparse.size
	}
	return n, nil
}

// Finish writes the last block, sets the file's length and syncs it.
func (w *imageWriter) Finish() error {
	if err := w.sparse.finish(); err != nil {
		return w.fail(fmt.Errorf("write decompressed output: %w", err))
	}
	if err := w.f.Sync(); err != nil {
		return w.fail(fmt.Errorf("fsync decompressed output: %w", err))
	}
	return nil
}

func (w *imageWriter) fail(err error) error {
	if w.err == nil {
		w.err = err
	}
	return err
}

// startWriteback asks the kernel to start writing n bytes of f from off back to disk,
// without waiting for it. It is only a hint: an error here would come again from the
// final fsync, which reports it.
func startWriteback(f *os.File, off, n int64) {
	_ = unix.SyncFileRange(int(f.Fd()), off, n, unix.SYNC_FILE_RANGE_WRITE)
}

// countReader counts the bytes read, remembers the first read error other than EOF and
// reports activity to the stall watch and progress to the space check.
type countReader struct {
	r     io.Reader
	n     int64
	err   error
	touch func()
	room  *room
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if n > 0 {
		c.touch()
		if serr := c.room.progress(int64(n), 0); serr != nil && (err == nil || err == io.EOF) {
			err = serr
		}
	}
	if err != nil && err != io.EOF && c.err == nil {
		c.err = err
	}
	return n, err
}

// sparseWriter writes a file front to back but leaves a hole for every aligned block of
// zeros: most of a disk image is unused space, which then takes no room on disk.
type sparseWriter struct {
	f     *os.File
	block []byte // the block being filled, up to sparseBlock bytes
	zeros []byte
	size  int64 // bytes taken so far, written or skipped
	// written, when set, is told size each time it grows: the file holds that many
	// bytes from its start (the skipped ones as holes, perhaps beyond its end).
	written func(int64)
}

func newSparseWriter(f *os.File) *sparseWriter {
	return &sparseWriter{f: f, block: make([]byte, 0, sparseBlock), zeros: make([]byte, sparseBlock)}
}

func (w *sparseWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		if len(w.block) == 0 && len(p) >= sparseBlock {
			// Whole blocks go straight from p, without a copy.
			if err := w.put(p[:sparseBlock]); err != nil {
				return n, err
			}
			p, n = p[sparseBlock:], n+sparseBlock
			continue
		}
		m := copy(w.block[len(w.block):sparseBlock], p)
		w.block = w.block[:len(w.block)+m]
		p, n = p[m:], n+m
		if len(w.block) == sparseBlock {
			if err := w.put(w.block); err != nil {
				return n, err
			}
			w.block = w.block[:0]
		}
	}
	return n, nil
}

// put writes b at the end of the file, or skips over it when it is all zeros.
func (w *sparseWriter) put(b []byte) error {
	if bytes.Equal(b, w.zeros[:len(b)]) {
		if _, err := w.f.Seek(int64(len(b)), io.SeekCurrent); err != nil {
			return err
		}
	} else if _, err := w.f.Write(b); err != nil {
		return err
	}
	w.size += int64(len(b))
	w.tell()
	return nil
}

// tell tells written, if set, how much of the file is written.
func (w *sparseWriter) tell() {
	if w.written != nil {
		w.written(w.size)
	}
}

// flush writes the partial block as it is, so that the file holds every byte taken
// up to the last one written (a hole at the end still leaves it short).
func (w *sparseWriter) flush() error {
	if len(w.block) == 0 {
		return nil
	}
	if _, err := w.f.Write(w.block); err != nil {
		return err
	}
	w.size += int64(len(w.block))
	w.block = w.block[:0]
	w.tell()
	return nil
}

// finish writes the last, partial block and sets the file's length, which a hole at the
// end leaves short.
func (w *sparseWriter) finish() error {
	if len(w.block) > 0 {
		if err := w.put(w.block); err != nil {
			return err
		}
		w.block = w.block[:0]
	}
	return w.f.Truncate(w.size)
}

// prefixReader reads exactly n bytes of the partial download, checking ctx between reads
// since the prefix of a large image takes a while.
type prefixReader struct {
	ctx context.Context
	r   io.Reader
	n   int64
}

func (p *prefixReader) Read(b []byte) (int, error) {
	if p.n <= 0 {
		return 0, io.EOF
	}
	if err := p.ctx.Err(); err != nil {
		return 0, err
	}
	if int64(len(b)) > p.n {
		b = b[:p.n]
	}
	n, err := p.r.Read(b)
	p.n -= int64(n)
	if err == io.EOF && p.n > 0 {
		err = fmt.Errorf("partial download is %d bytes shorter than expected: %w", p.n, io.ErrUnexpectedEOF)
	}
	return n, err
}
