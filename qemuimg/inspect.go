// Package qemuimg owns qemu-img: Inspect checks that an image is what it claims and
// reaches no other file, Convert turns one that passed into another format, and
// ConvertSource and Installed say which formats convert and whether qemu-img is there.
package qemuimg

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nodepool-builder/nodepool-builder/internal/untrusted"
	"github.com/nodepool-builder/nodepool-builder/progress"
)

// A raw image is a disk: whole 512-byte sectors, and no disk worth booting is smaller than
// a MiB. Anything qemu-img cannot place reads as raw, so without these bounds a page of
// text from some server would pass for an image.
const (
	minRawSize = 1 << 20
	sectorSize = 512
)

// maxInspectBytes bounds qemu-img info's output; a sane answer is a few KiB.
const maxInspectBytes = 4 << 20

// Info is an image file Inspect found safe to hand to qemu-img and to a cloud.
type Info struct {
	Path   string
	Format string // the format claimed, which qemu-img confirmed, in our names
	// VirtualSize is the size in bytes of the disk the image holds, as qemu-img reads it:
	// what a conversion to raw writes and what an instance booted from it gets, however
	// small the file. A file qemu does not know as an image (raw, tar, iso) is its length.
	VirtualSize int64
}

// Inspect checks that the file at path is the format it claims and references no other
// file: no backing file, no external data file, no vmdk extent beyond the file itself. Its
// header is read first: one that is not the claimed format's, a vmdk other than a
// monolithicSparse or streamOptimized one, or a qcow2 with an external data file is refused
// before qemu-img opens the file. Then `qemu-img info -f <format>` (qemuImg is the
// program; empty means "qemu-img" on PATH) reads it as the format claimed, never guessing.
// A claimed format that qemu does not know, such as tar or squashfs, must read as raw. The error
// for a file that fails the check wraps untrusted.ErrUnsafe and names what was found; a file claimed
// raw must also be at least 1 MiB and a whole number of 512-byte sectors. A failure to
// run qemu-img is an ordinary error. What it returns tells the disk's virtual size, for
// CheckSize.
func Inspect(ctx context.Context, qemuImg, path, format string) (Info, error) {
	qemuImg = program(qemuImg)
	claimed := untrusted.CanonicalFormat(format)
	if claimed == "" {
		return Info{}, fmt.Errorf("inspect %s: no format claimed", path)
	}
	// Absolute, the name can be neither an option nor a "protocol:" qemu would resolve.
	abs, err := filepath.Abs(path)
	if err != nil {
		return Info{}, fmt.Errorf("inspect %s: %w", path, err)
	}
	problems, err := headerProblems(abs, claimed)
	if err != nil {
		return Info{}, fmt.Errorf("inspect %s (%s): %w", path, claimed, err)
	}
	if len(problems) > 0 {
		return Info{}, fmt.Errorf("inspect %s: %w: %s", path, untrusted.ErrUnsafe, strings.Join(problems, "; "))
	}
	info, err := runQemuInfo(ctx, qemuImg, abs, probedAs(claimed))
	if err != nil {
		return Info{}, fmt.Errorf("inspect %s (%s): %w", path, claimed, err)
	}
	problems = info.problems(abs)
	if claimed == "raw" {
		fi, err := os.Stat(abs)
		if err != nil {
			return Info{}, fmt.Errorf("inspect %s: %w", path, err)
		}
		if p := rawSizeProblem(fi.Size()); p != "" {
			problems = append(problems, p)
		}
	}
	if len(problems) > 0 {
		return Info{}, fmt.Errorf("inspect %s: %w: %s", path, untrusted.ErrUnsafe, strings.Join(problems, "; "))
	}
	return Info{Path: path, Format: claimed, VirtualSize: info.VirtualSize}, nil
}

// CheckSize returns an error wrapping untrusted.ErrTooLarge, naming both sizes, when the disk the
// image holds is larger than limit bytes (0 or less: untrusted.DefaultMaxSize). A file of a few
// hundred KiB may hold a disk of terabytes, which a conversion to raw would write out and
// a cloud would give every instance: the limit applies to the disk, whatever the format.
func (im Info) CheckSize(limit int64) error {
	if limit <= 0 {
		limit = untrusted.DefaultMaxSize
	}
	if im.VirtualSize <= limit {
		return nil
	}
	return fmt.Errorf("%s image %s: %w: its disk has a virtual size of %s (%d bytes), above the maximum of %s",
		im.Format, im.Path, untrusted.ErrTooLarge, progress.Bytes(im.VirtualSize), im.VirtualSize, progress.Bytes(limit))
}

// rawSizeProblem says why a raw image of size bytes is no disk, or "".
func rawSizeProblem(size int64) string {
	if size < minRawSize || size%sectorSize != 0 {
		return fmt.Sprintf("a raw image of %d bytes is no disk image: a raw image must be at least %d bytes (1 MiB) and a whole number of %d-byte sectors",
			size, minRawSize, sectorSize)
	}
	return ""
}

// imageInfo is the part of `qemu-img info --output=json` that tells whether an image
// reaches outside its own file, and how large a disk it holds.
type imageInfo struct {
	Format              string  `json:"format"`
	VirtualSize         int64   `json:"virtual-size"`
	BackingFilename     *string `json:"backing-filename"`
	FullBackingFilename *string `json:"full-backing-filename"`
	FormatSpecific      struct {
		Data struct {
			DataFile *string `json:"data-file"`
			Extents  []struct {
				Filename string `json:"filename"`
			} `json:"extents"`
		} `json:"data"`
	} `json:"format-specific"`
}

// problems lists why the image at path is unsafe, as qemu-img read it: a second line
// behind headerProblems.
func (info *imageInfo) problems(path string) []string {
	var out []string
	switch {
	case info.BackingFilename != nil:
		out = append(out, fmt.Sprintf("backing file %q", *info.BackingFilename))
	case info.FullBackingFilename != nil:
		out = append(out, fmt.Sprintf("backing file %q", *info.FullBackingFilename))
	}
	if f := info.FormatSpecific.Data.DataFile; f != nil {
		out = append(out, fmt.Sprintf("external data file %q", *f))
	}
	if extents := info.FormatSpecific.Data.Extents; len(extents) > 1 {
		out = append(out, fmt.Sprintf("%d extents (first %q)", len(extents), extents[0].Filename))
	} else if len(extents) == 1 && filepath.Clean(extents[0].Filename) != path {
		out = append(out, fmt.Sprintf("extent in another file %q", extents[0].Filename))
	}
	return out
}

// probedAs returns the format, in qemu's names, of a genuine file of format (one of our
// canonical names). Formats qemu does not know must look like raw data to it: anything
// else is an image format qemu would interpret, possibly reading other files.
func probedAs(format string) string {
	switch format {
	case "qcow2", "raw", "vhdx", "vmdk", "vdi", "qed", "vpc":
		return format
	case "vhd":
		return "vpc"
	}
	return "raw" // iso, tar, squashfs, docker, tgz, ...
}

// runQemuInfo runs `qemu-img info -f format` on path within infoBounds: a time limit
// and, when util-linux's prlimit is installed, memory and CPU limits, which keep a
// crafted image from making qemu-img eat the host. info does not open backing files,
// so a hostile one is reported rather than read; it does open a vmdk's extents, which
// headerProblems refused before.
func runQemuInfo(ctx context.Context, qemuImg, path, format string) (*imageInfo, error) {
	stdout := &cappedBuffer{limit: maxInspectBytes}
	stderr := &cappedBuffer{limit: 4 << 10}
	cmd, ctx, cancel := infoBounds.command(ctx, qemuImg, "info", "-f", format, "--output=json", path)
	defer cancel()
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = errors.Join(err, ctx.Err())
		}
		return nil, fmt.Errorf("qemu-img info: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	if stdout.overflow {
		return nil, fmt.Errorf("qemu-img info: more than %d bytes of output", maxInspectBytes)
	}
	var info imageInfo
	if err := json.Unmarshal(stdout.Bytes(), &info); err != nil {
		return nil, fmt.Errorf("qemu-img info: parse output: %w", err)
	}
	if info.Format == "" {
		return nil, errors.New("qemu-img info: output names no format")
	}
	if info.VirtualSize < 0 {
		return nil, fmt.Errorf("qemu-img info: virtual size %d", info.VirtualSize)
	}
	return &info, nil
}

// cappedBuffer keeps the first limit bytes written to it and drops the rest, so that a
// program's output cannot take our memory, while the program still runs to its end.
type cappedBuffer struct {
	bytes.Buffer
	limit    int
	overflow bool
}

func (c *cappedBuffer) Write(p []byte) (int, error) {
	if room := c.limit - c.Len(); len(p) > room {
		c.overflow = true
		c.Buffer.Write(p[:max(room, 0)])
		return len(p), nil
	}
	return c.Buffer.Write(p)
}
