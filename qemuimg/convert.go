package qemuimg

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/diskspace"
	"github.com/nodepool-builder/nodepool-builder/internal/fsync"
	"github.com/nodepool-builder/nodepool-builder/internal/perm"
	"github.com/nodepool-builder/nodepool-builder/internal/untrusted"
	"github.com/nodepool-builder/nodepool-builder/progress"
)

// Convert turns src, an image Inspect found safe, into dst in dstFmt with `qemu-img
// convert` (qemuImg is the program; empty means "qemu-img" on PATH). The output is
// written to the new file createTemp makes beside dst (store.CreateConversionTemp, whose
// names the store's tidy-up knows) and renamed to dst once complete and synced; on
// failure it is removed.
//
// A conversion writes up to the disk's virtual size, which may be far more than the
// source's length: before it starts, Convert checks that dst's filesystem has that much
// free, and otherwise returns an error wrapping diskspace.ErrNoSpace rather than fill the
// disk. Once ctx is done, qemu-img is killed and Convert returns ctx's error.
func Convert(ctx context.Context, qemuImg string, src Image, dst, dstFmt string, createTemp func(dst string) (*os.File, error)) error {
	return convert(ctx, qemuImg, src, dst, dstFmt, createTemp, diskspace.Free)
}

// convert is Convert with free reporting the free space of a directory's filesystem.
func convert(ctx context.Context, qemuImg string, src Image, dst, dstFmt string,
	createTemp func(string) (*os.File, error), free func(string) (int64, error)) error {
	qemuImg = program(qemuImg)
	in, out := qemuFormat(src.Format), qemuFormat(dstFmt)
	if in == "" || out == "" {
		return fmt.Errorf("convert %s to %s: source and destination formats are required", src.Path, dst)
	}
	// Absolute, the name can be neither an option nor a "protocol:" qemu would resolve.
	srcPath, err := filepath.Abs(src.Path)
	if err != nil {
		return fmt.Errorf("convert %s: %w", src.Path, err)
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
	tmp, err := createTemp(dst)
	if err != nil {
		return fmt.Errorf("convert %s to %s: create temporary file: %w", src.Path, dst, err)
	}
	tmpName := tmp.Name()
	tmp.Close()
	committed := false
	defer func() {
		if !committed {
			os.Remove(tmpName)
		}
	}()

	args := []string{"convert", "-f", in, "-O", out}
	if out == "vpc" {
		// Without force_size qemu rounds the virtual size to VHD's CHS geometry, so the
		// disk would not keep the size it was built with.
		args = append(args, "-o", "force_size=on")
	}
	args = append(args, srcPath, tmpName)
	output := &cappedBuffer{limit: 64 << 10}
	cmd := exec.CommandContext(ctx, qemuImg, args...)
	cmd.Stdout = output
	cmd.Stderr = output
	// Killed on cancel; a child that kept the pipes open must not hold us.
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = errors.Join(err, ctx.Err())
		}
		return fmt.Errorf("convert %s (%s) to %s (%s): %s: %w: %s",
			src.Path, src.Format, dst, dstFmt, qemuImg, err, strings.TrimSpace(output.String()))
	}
	if err := fsync.File(tmpName); err != nil {
		return fmt.Errorf("convert %s to %s: %w", src.Path, dst, err)
	}
	// A temporary file is made 0600, as os.CreateTemp makes it, which leaves the group
	// out: images are perm.File.
	if err := os.Chmod(tmpName, perm.File); err != nil {
		return fmt.Errorf("convert %s to %s: %w", src.Path, dst, err)
	}
	if err := os.Rename(tmpName, dst); err != nil {
		return fmt.Errorf("convert %s to %s: move into place: %w", src.Path, dst, err)
	}
	committed = true
	if err := fsync.Dir(filepath.Dir(dst)); err != nil {
		return fmt.Errorf("convert %s to %s: %w", src.Path, dst, err)
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
