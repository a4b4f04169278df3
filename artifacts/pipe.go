package artifacts

import (
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
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

// pipe hashes and, for compressed downloads, decompresses the stream made of the first
// prefix bytes of the partial download on disk followed by net (nil for none). Each run
// writes the decompressed output from the start, so a resumed download re-reads only its
// local prefix, never the network.
func (d *download) pipe(ctx context.Context, prefix int64, net *io.PipeReader, touch func()) (s sums, err error) {
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
	src := &countReader{r: io.MultiReader(parts...), touch: touch}

	h256, h5 := sha256.New(), md5.New()
	hashes := io.MultiWriter(h256, h5)
	buf := make([]byte, copyBufferSize)
	if d.comp == "" {
		s.size, err = io.CopyBuffer(hashes, src, buf)
		if err != nil {
			return s, err
		}
	} else {
		s.size, err = d.decompress(hashes, src, buf, prefix > 0)
		if err != nil {
			return s, err
		}
	}
	s.sha256 = hex.EncodeToString(h256.Sum(nil))
	s.md5 = hex.EncodeToString(h5.Sum(nil))
	s.fed = src.n
	return s, nil
}

// decompress writes the decompressed src to the output file and to hashes, and syncs the
// file. Errors of the stream itself come back as *decodeError.
func (d *download) decompress(hashes io.Writer, src *countReader, buf []byte, resumed bool) (int64, error) {
	out, err := os.OpenFile(d.outPath, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return 0, fmt.Errorf("create decompressed output: %w", err)
	}
	defer out.Close()
	ow := &errWriter{w: out}
	// failed tells a corrupt stream from a broken input or a failed write.
	failed := func(err error) error {
		switch {
		case src.err != nil:
			return src.err
		case ow.err != nil:
			return fmt.Errorf("write decompressed output: %w", ow.err)
		}
		return &decodeError{err: err, resumed: resumed}
	}

	var r io.Reader
	switch d.comp {
	case "zst":
		// One decoder goroutine: memory stays at about the stream's window size.
		zr, err := zstd.NewReader(src, zstd.WithDecoderConcurrency(1))
		if err != nil {
			return 0, failed(err)
		}
		defer zr.Close()
		r = zr
	case "gz":
		zr, err := gzip.NewReader(src)
		if err != nil {
			return 0, failed(err)
		}
		defer zr.Close()
		r = zr
	default:
		return 0, fmt.Errorf("unknown compression %q", d.comp)
	}
	n, err := io.CopyBuffer(io.MultiWriter(ow, hashes), r, buf)
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
	if err := out.Sync(); err != nil {
		return n, fmt.Errorf("fsync decompressed output: %w", err)
	}
	if err := out.Close(); err != nil {
		return n, fmt.Errorf("close decompressed output: %w", err)
	}
	return n, nil
}

// errWriter remembers the first write error.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	n, err := e.w.Write(p)
	if err != nil && e.err == nil {
		e.err = err
	}
	return n, err
}

// countReader counts the bytes read, remembers the first read error other than EOF and
// reports activity to the stall watch.
type countReader struct {
	r     io.Reader
	n     int64
	err   error
	touch func()
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if n > 0 {
		c.touch()
	}
	if err != nil && err != io.EOF && c.err == nil {
		c.err = err
	}
	return n, err
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
