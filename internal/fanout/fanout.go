// Package fanout reads a stream once and hands every chunk of it to several writers at
// the same time, each on its own goroutine, through a fixed pool of reused buffers.
//
// It exists so that the costly consumers of one stream (two hashes and a file write, say)
// run on separate cores: the stream then goes as fast as its slowest consumer rather than
// as fast as all of them in turn, and memory stays at the pool whatever the stream's size.
package fanout

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
)

const (
	// DefaultBufferSize is the size of a chunk when Copier.BufferSize is 0.
	DefaultBufferSize = 256 << 10
	// DefaultBuffers is the number of chunks in flight when Copier.Buffers is 0: enough
	// for the reader to stay ahead of a writer that pauses now and then.
	DefaultBuffers = 8
)

// Finisher is a writer with work to do once it has taken the whole stream, such as
// syncing a file. Copier.Copy calls Finish on the writer's own goroutine after its last
// Write, so that the work overlaps the other writers' tails. It does not call it once a
// read or a writer has failed, but another writer may still fail afterwards: Copy's
// error is what tells whether the stream went through whole.
type Finisher interface {
	Finish() error
}

// Copier copies one reader to several writers in parallel. The zero value uses
// DefaultBufferSize and DefaultBuffers.
type Copier struct {
	// BufferSize is the most bytes of one chunk; the reader fills each chunk whole
	// except the last, so writers that work in blocks see aligned writes.
	BufferSize int
	// Buffers is the number of chunks allocated once per Copy and reused: the reader
	// waits for a free one when every writer is busy, so memory stays at
	// Buffers*BufferSize.
	Buffers int
}

// Copy is Copier{}.Copy.
func Copy(ctx context.Context, src io.Reader, dst ...io.Writer) (int64, error) {
	return Copier{}.Copy(ctx, src, dst...)
}

// chunk is one buffer of the pool with the part of it that holds data.
type chunk struct {
	buf  []byte
	n    int
	refs atomic.Int32 // writers yet to take it; the last one returns it to the pool
}

// Copy reads src to its end on the calling goroutine and writes each chunk, in order, to
// every writer in dst, each writer on a goroutine of its own. It returns the bytes read
// from src and the first error among src's (io.EOF is the end, not an error), the
// writers' and ctx's; after an error every writer stops at its next chunk. Copy returns
// only once every goroutine it started has ended. A read that blocks is not interrupted
// by ctx: src must end its reads when the caller cancels, as a network stream does.
func (c Copier) Copy(ctx context.Context, src io.Reader, dst ...io.Writer) (int64, error) {
	size, count := c.BufferSize, c.Buffers
	if size <= 0 {
		size = DefaultBufferSize
	}
	if count <= 0 {
		count = DefaultBuffers
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	free := make(chan *chunk, count)
	for range count {
		free <- &chunk{buf: make([]byte, size)}
	}
	// Each writer's queue holds as many chunks as the pool: a send never blocks, so the
	// reader waits only for free buffers and a writer that has stopped holds up nobody.
	queues := make([]chan *chunk, len(dst))
	var wg sync.WaitGroup
	for i, w := range dst {
		q := make(chan *chunk, count)
		queues[i] = q
		wg.Go(func() {
			if err := drain(ctx, w, q, free); err != nil {
				cancel(err)
			}
		})
	}
	n, err := fill(ctx, src, free, queues)
	if err != nil {
		// Before the queues close, so that no writer takes a cut stream as whole.
		cancel(err)
	}
	for _, q := range queues {
		close(q)
	}
	wg.Wait()
	return n, context.Cause(ctx)
}

// fill reads src into free chunks and queues each one to every writer, until src ends,
// fails or ctx is done. It returns the bytes read and src's error.
func fill(ctx context.Context, src io.Reader, free chan *chunk, queues []chan *chunk) (int64, error) {
	var total int64
	for {
		if ctx.Err() != nil {
			return total, nil // the cause is in ctx
		}
		var c *chunk
		select {
		case c = <-free:
		case <-ctx.Done():
			return total, nil
		}
		n, err := readFull(src, c.buf)
		total += int64(n)
		if n > 0 {
			c.n = n
			c.refs.Store(int32(len(queues)))
			for _, q := range queues {
				q <- c
			}
			if len(queues) == 0 {
				free <- c
			}
		}
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

// readFull reads into p until it is full or src returns an error, io.EOF included.
// Unlike io.ReadFull it passes on src's own io.ErrUnexpectedEOF, which a decompressor
// returns for a truncated stream, rather than taking it for the end.
func readFull(src io.Reader, p []byte) (int, error) {
	n := 0
	for n < len(p) {
		m, err := src.Read(p[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// drain writes the chunks of q to w and returns each to the pool once every writer has
// taken it. It stops early, without error, when another party failed (ctx holds why).
func drain(ctx context.Context, w io.Writer, q <-chan *chunk, free chan<- *chunk) error {
	for c := range q {
		if ctx.Err() != nil {
			return nil
		}
		m, err := w.Write(c.buf[:c.n])
		if err == nil && m < c.n {
			err = io.ErrShortWrite
		}
		if c.refs.Add(-1) == 0 {
			free <- c
		}
		if err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	if f, ok := w.(Finisher); ok {
		return f.Finish()
	}
	return nil
}
