package artifacts

import (
	"path/filepath"

	"github.com/nodepool-builder/nodepool-builder/internal/diskspace"
)

const (
	// spaceCheckEvery is how many bytes a download writes between two checks of the
	// free space: often enough to stop well before the disk is full, rarely enough to cost
	// nothing.
	spaceCheckEvery = 64 << 20
	// spaceFloor is the free space a download keeps while it does not know how much it
	// has yet to write.
	spaceFloor = 256 << 20
)

// room checks, before a transfer and then every spaceCheckEvery bytes, that the partial
// directory's filesystem can take what the download has yet to write: the rest of the
// file as served and, for a compressed one, the rest of the decompressed image.
type room struct {
	dir        string
	free       func(string) (int64, error)
	compressed bool
	prefix     int64 // bytes of the file as served already on disk when the attempt began
	served     int64 // length of the whole file as served; -1 when unknown
	image      int64 // length of the decompressed image; -1 when unknown

	fed   int64 // bytes of the file as served that went through the pipeline
	wrote int64 // bytes of decompressed image written
	next  int64 // fed+wrote at which to check again
}

// room returns the space check of an attempt that starts at offset and receives
// contentLength more bytes (-1 when unknown).
func (d *download) room(offset, contentLength int64) *room {
	r := &room{
		dir:        filepath.Dir(d.dlPath),
		free:       d.f.FreeSpace,
		compressed: d.comp != "",
		prefix:     offset,
		served:     -1,
		image:      -1,
	}
	if r.free == nil {
		r.free = diskspace.Free
	}
	if contentLength >= 0 {
		r.served = offset + contentLength
	}
	if d.req.Size > 0 {
		if r.compressed {
			r.image = d.req.Size
		} else {
			r.served = d.req.Size
		}
	}
	return r
}

// learnImageSize records the decompressed size a compressed stream announces, unless the
// artifact declared one, and checks the space again against it.
func (r *room) learnImageSize(n int64) error {
	if r.image >= 0 {
		return nil
	}
	r.image = n
	return r.check()
}

// need returns the bytes the download has yet to write, or the floor when that is not
// known.
func (r *room) need() int64 {
	var n int64
	known := true
	if r.served >= 0 {
		n += max(r.served-max(r.fed, r.prefix), 0)
	} else {
		known = false
	}
	if r.compressed {
		switch {
		case r.image >= 0:
			n += max(r.image-r.wrote, 0)
		case r.served >= 0:
			// Unknown, but hardly less than the compressed size.
			n += max(r.served-r.wrote, 0)
			known = false
		default:
			known = false
		}
	}
	if !known {
		n = max(n, spaceFloor)
	}
	return n
}

// check returns an error wrapping diskspace.ErrNoSpace when the filesystem lacks what
// the download needs.
func (r *room) check() error {
	if err := diskspace.Check(r.dir, r.need(), r.free); err != nil {
		return err
	}
	r.next = r.fed + r.wrote + spaceCheckEvery
	return nil
}

// progress counts fed bytes of the file as served and wrote bytes of decompressed image,
// and checks the space again when another spaceCheckEvery bytes went by.
func (r *room) progress(fed, wrote int64) error {
	r.fed += fed
	r.wrote += wrote
	if r.fed+r.wrote < r.next {
		return nil
	}
	return r.check()
}

// Write counts decompressed bytes as they are written to the image (it writes nothing
// itself), so that it can stand in an io.MultiWriter beside the file.
func (r *room) Write(p []byte) (int, error) {
	if err := r.progress(0, int64(len(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}
