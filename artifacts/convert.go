package artifacts

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/nodepool-builder/nodepool-builder/internal/perm"
)

// Convert turns src, an image in srcFmt, into dst in dstFmt with `qemu-img convert`
// (qemuImg is the program; empty means "qemu-img" on PATH). The output is written under a
// temporary name beside dst and renamed into place once complete and synced.
func Convert(ctx context.Context, qemuImg, src, srcFmt, dst, dstFmt string) error {
	if qemuImg == "" {
		qemuImg = "qemu-img"
	}
	in, out := qemuFormat(srcFmt), qemuFormat(dstFmt)
	if in == "" || out == "" {
		return fmt.Errorf("convert %s to %s: source and destination formats are required", src, dst)
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".converting-*")
	if err != nil {
		return fmt.Errorf("convert %s to %s: create temporary file: %w", src, dst, err)
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
	args = append(args, src, tmpName)
	var output bytes.Buffer
	cmd := exec.CommandContext(ctx, qemuImg, args...)
	cmd.Stdout = &output
	cmd.Stderr = &output
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = errors.Join(err, ctx.Err())
		}
		return fmt.Errorf("convert %s (%s) to %s (%s): %s: %w: %s",
			src, srcFmt, dst, dstFmt, qemuImg, err, strings.TrimSpace(output.String()))
	}
	if err := syncFile(tmpName); err != nil {
		return fmt.Errorf("convert %s to %s: %w", src, dst, err)
	}
	// CreateTemp's 0600 would leave the group out: images are perm.File.
	if err := os.Chmod(tmpName, perm.File); err != nil {
		return fmt.Errorf("convert %s to %s: %w", src, dst, err)
	}
	if err := os.Rename(tmpName, dst); err != nil {
		return fmt.Errorf("convert %s to %s: move into place: %w", src, dst, err)
	}
	committed = true
	if err := syncDir(filepath.Dir(dst)); err != nil {
		return fmt.Errorf("convert %s to %s: %w", src, dst, err)
	}
	return nil
}

// qemuFormat maps our format names onto qemu-img's.
func qemuFormat(f string) string {
	switch f = canonicalFormat(f); f {
	case "vhd":
		return "vpc"
	default:
		return f
	}
}
