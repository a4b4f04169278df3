// Package follow lets readers follow a file while it is written front to
// back, behind the writer, from disk: an upload then starts with the download
// that writes the image, and as many uploads as there are clouds read it at
// their own pace without slowing the writer or each other, and without holding
// any of it in memory.
//
// The writer says where the file is (Start) and how much of it, from its
// start, is written (Written). Readers never see the last HoldBack bytes of
// the file, nor its end, until it is released (Release): whoever checks the
// file releases it once it is verified, or fails it (Fail), and every reader's
// next Read then returns that error. An upload fed by a reader therefore
// cannot complete before the file is verified.
package follow

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
)

// HoldBack is how many bytes at the end of the file no reader gets before
// Release: at least one, so that a receiver told the length cannot complete.
const HoldBack = 64 << 10

// File is a file written front to back that readers follow. The zero value
// is not usable: use New.
type File struct {
	mu      sync.Mutex
	changed chan struct{} // closed and replaced at a change a reader waits for
	waiting int           // readers waiting on changed
	f       *os.File      // opened for reading at Start; nil before
	old     []*os.File    // opened by earlier Starts: a reader may still be in one
	written int64         // bytes from the start that are in the file
	size    int64         // the whole length, once released; -1 before
	err     error         // why the file failed
	closed  bool
}

// New returns a File that nothing writes yet.
func New() *File {
	return &File{changed: make(chan struct{}), size: -1}
}

// notify wakes the readers that wait; the caller holds mu. A writer tells of
// every block it writes: without a reader waiting, that costs nothing.
func (f *File) notify() {
	if f.waiting == 0 {
		return
	}
	close(f.changed)
	f.changed = make(chan struct{})
	f.waiting = 0
}

// settled tells whether the file was released or failed: nothing changes it
// any more. The caller holds mu.
func (f *File) settled() bool { return f.size >= 0 || f.err != nil }

// Start says that the file at path is being written from its start, and that
// its first written bytes are there already (a resumed download's). A later
// Start, for a write that starts over, replaces the one before: readers go on
// in the new file from where they are, as soon as it is written that far.
// The file is opened for reading at once, so that a later rename of path
// does not matter.
func (f *File) Start(path string, written int64) error {
	r, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("follow %s: %w", path, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.settled() || f.closed {
		r.Close() // settled: no reader reads on
		return nil
	}
	if f.f != nil {
		f.old = append(f.old, f.f)
	}
	f.f, f.written = r, written
	f.notify()
	return nil
}

// Written says that the first n bytes of the file are written: readers may
// read them (all but the last HoldBack until Release). Regions the writer
// skipped over, holes, are read as zeros, also beyond the file's current end.
func (f *File) Written(n int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.settled() || n <= f.written {
		return
	}
	f.written = n
	f.notify()
}

// Release says the file is whole and verified, size bytes long: readers read
// it to its end.
func (f *File) Release(size int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.err != nil:
		return f.err
	case f.f == nil:
		return errors.New("follow: released before it was written")
	case size < f.written:
		return fmt.Errorf("follow: released at %d bytes, but %d were written", size, f.written)
	}
	f.size, f.written = size, size
	f.notify()
	return nil
}

// Fail ends the file with err: every reader's next Read returns it. A file
// released already stays released.
func (f *File) Fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.settled() {
		return
	}
	f.err = err
	f.notify()
}

// Close lets go of the file; readers still reading get an error. The owner
// closes it once no reader needs it any more.
func (f *File) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	if f.err == nil && f.size < 0 {
		f.err = errors.New("follow: closed before it was released")
	}
	f.notify()
	var err error
	for _, r := range append(f.old, f.f) {
		if r != nil {
			err = errors.Join(err, r.Close())
		}
	}
	f.f, f.old = nil, nil
	return err
}

// Err is why the file failed; nil while it has not.
func (f *File) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// Reader reads the file from its start, following the writer. It is an
// io.ReadSeeker; only one goroutine may use it.
type Reader struct {
	f   *File
	ctx context.Context
	pos atomic.Int64 // read by Pos from other goroutines
}

// NewReader returns a reader of the file from its start; its Reads wait for
// the writer and end with ctx.
func (f *File) NewReader(ctx context.Context) *Reader {
	return &Reader{f: f, ctx: ctx}
}

// Read reads what is readable from the reader's position, waiting until
// there is some, the file is released and read to its end (io.EOF), or it
// failed.
func (r *Reader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	src, avail, err := r.wait()
	if err != nil {
		return 0, err
	}
	p = p[:min(int64(len(p)), avail)]
	pos := r.pos.Load()
	n, err := src.ReadAt(p, pos)
	if err != nil && err != io.EOF {
		return n, fmt.Errorf("read followed file: %w", err)
	}
	// What the writer skipped beyond the file's end so far is a hole: zeros.
	clear(p[n:])
	r.pos.Store(pos + int64(len(p)))
	return len(p), nil
}

// wait waits for bytes to read at the reader's position, and returns the
// file to read them from and how many there are.
func (r *Reader) wait() (*os.File, int64, error) {
	f := r.f
	pos := r.pos.Load()
	f.mu.Lock()
	defer f.mu.Unlock()
	for {
		switch {
		case f.err != nil:
			return nil, 0, f.err
		case f.size >= 0 && pos >= f.size:
			return nil, 0, io.EOF
		}
		limit := f.written
		if f.size < 0 {
			limit -= HoldBack
		}
		if f.f != nil && limit > pos {
			return f.f, limit - pos, nil
		}
		wait := f.changed
		f.waiting++
		f.mu.Unlock()
		select {
		case <-wait:
		case <-r.ctx.Done():
			f.mu.Lock()
			return nil, 0, context.Cause(r.ctx)
		}
		f.mu.Lock()
	}
}

// Seek moves the reader, as a sender that must send the data again does.
func (r *Reader) Seek(offset int64, whence int) (int64, error) {
	pos := r.pos.Load()
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		offset += pos
	default:
		return pos, errors.New("follow: seek from the end of a file still written")
	}
	if offset < 0 {
		return pos, errors.New("follow: seek before the start")
	}
	r.pos.Store(offset)
	return offset, nil
}
