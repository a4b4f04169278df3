package qemuimg

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nodepool-builder/nodepool-builder/internal/diskspace"
	"github.com/nodepool-builder/nodepool-builder/internal/perm"
	"github.com/nodepool-builder/nodepool-builder/internal/untrusted"
	"github.com/nodepool-builder/nodepool-builder/progress"
)

// Convert turns src, an image Inspect found safe, into dst in dstFmt with `qemu-img
// convert` (qemuImg is the program; empty means "qemu-img" on PATH). dst is a file of
// the caller's that nobody reads before it is complete (a build writer's Temp, which
// its Add makes durable and moves into place); on failure it is removed.
//
// A conversion writes up to the disk's virtual size, which may be far more than the
// source's length: before it starts, Convert checks that dst's filesystem has that much
// free, and otherwise returns an error wrapping diskspace.ErrNoSpace rather than fill the
// disk.
//
// The image comes from outside, so qemu-img runs within bounds that grow with the
// disk's virtual size: a time limit of ten minutes and a minute a GiB, and, under
// util-linux's prlimit when it is installed, five minutes and 30 seconds a GiB of CPU
// time and 2 GiB of memory. One that runs out of them is killed, and the error says
// which. Once ctx is done, qemu-img is killed and Convert returns ctx's error.
func Convert(ctx context.Context, qemuImg string, src Info, dst, dstFmt string) error {
	return convert(ctx, qemuImg, src, dst, dstFmt, diskspace.Free, convertBounds(src.VirtualSize))
}

// convert is Convert with free reporting the free space of a directory's filesystem,
// and qemu-img run within bounds.
func convert(ctx context.Context, qemuImg string, src Info, dst, dstFmt string, free func(string) (int64, error), bounds bounds) error {
	qemuImg = program(qemuImg)
	in, out := qemuFormat(src.Format), qemuFormat(dstFmt)
	if in == "" || out == "" {
		return fmt.Errorf("convert %s to %s: source and destination formats are required", src.Path, dst)
	}
	// Absolute, the names can be neither an option nor a "protocol:" qemu would resolve.
	srcPath, err := filepath.Abs(src.Path)
	if err != nil {
		return fmt.Errorf("convert %s: %w", src.Path, err)
	}
	dstPath, err := filepath.Abs(dst)
	if err != nil {
		return fmt.Errorf("convert %s to %s: %w", src.Path, dst, err)
	}
	// The file is read again by qemu-img: it must still name no other file.
	problems, err := headerProblems(srcPath, untrusted.CanonicalFormat(src.Format))
	if err != nil {
		return fmt.Errorf("convert %s (%s): %w", src.Path, src.Format, err)
	}
	if len(problems) > 0 {
		return fmt.Errorf("convert %s (%s): %w: %s", src.Path, src.Format, untrusted.ErrUnsafe, strings.Join(problems, "; "))
	}
	if err := diskspace.Check(filepath.Dir(dst), src.VirtualSize, free); err != nil {
		return fmt.Errorf("convert %s (%s, a disk of %s) to %s: %w", src.Path, src.Format, progress.Bytes(src.VirtualSize), dst, err)
	}

	// Made first with the mode of the builder's files, which qemu-img keeps;
	// it would leave it to the umask.
	f, err := perm.Create(dstPath)
	if err != nil {
		return fmt.Errorf("convert %s to %s: %w", src.Path, dst, err)
	}
	f.Close()
	args := []string{"convert", "-f", in, "-O", out}
	if out == "vpc" {
		// Without force_size qemu rounds the virtual size to VHD's CHS geometry, so the
		// disk would not keep the size it was built with.
		args = append(args, "-o", "force_size=on")
	}
	args = append(args, srcPath, dstPath)
	output := &cappedBuffer{limit: 64 << 10}
	cmd, runCtx, cancel := bounds.command(ctx, qemuImg, args...)
	defer cancel()
	cmd.Stdout = output
	cmd.Stderr = output
	if err := cmd.Run(); err != nil {
		why := qemuImg
		if over := bounds.exceeded(ctx, runCtx, err); over != "" {
			why = fmt.Sprintf("%s %s, its bound for a disk of %s: the image may be made to stall qemu-img; "+
				"if it is sound, publish %s from the image job", qemuImg, over, progress.Bytes(src.VirtualSize), dstFmt)
		}
		if runCtx.Err() != nil {
			err = errors.Join(err, runCtx.Err())
		}
		if rerr := os.Remove(dstPath); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			err = errors.Join(err, rerr)
		}
		return fmt.Errorf("convert %s (%s) to %s (%s): %s: %w: %s",
			src.Path, src.Format, dst, dstFmt, why, err, strings.TrimSpace(output.String()))
	}
	return nil
}

// qemuFormat maps our format names onto qemu-img's.
func qemuFormat(f string) string {
	switch f = untrusted.CanonicalFormat(f); f {
	case "vhd":
		return "vpc"
	default:
		return f
	}
}
