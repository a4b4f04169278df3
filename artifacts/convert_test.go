package artifacts

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/internal/perm"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
)

// qemuInfo returns the format and virtual size qemu-img reports for path.
func qemuInfo(t *testing.T, qemuImg, path string) (string, int64) {
	t.Helper()
	out, err := exec.Command(qemuImg, "info", "--output=json", path).Output()
	if err != nil {
		t.Fatalf("qemu-img info %s: %v", path, err)
	}
	var info struct {
		Format      string `json:"format"`
		VirtualSize int64  `json:"virtual-size"`
	}
	if err := json.Unmarshal(out, &info); err != nil {
		t.Fatalf("parse qemu-img info: %v", err)
	}
	return info.Format, info.VirtualSize
}

func TestConvert(t *testing.T) {
	qemuImg := testenv.RequireBinary(t, "qemu-img")
	dir := t.TempDir()
	// 3 MiB + 512 bytes: not a whole number of VHD geometry cylinders, so force_size matters.
	disk := testImage(3<<20 + 512)
	raw := filepath.Join(dir, "img.raw")
	if err := os.WriteFile(raw, disk, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		format   string // what to convert raw into, in our names
		qemuName string // what qemu-img info then reports
	}{
		{"qcow2", "qcow2"},
		{"qcow", "qcow2"},
		{"vhd", "vpc"},
	}
	for _, tt := range tests {
		t.Run(tt.format, func(t *testing.T) {
			ctx := context.Background()
			conv := filepath.Join(dir, "img."+tt.format)
			if err := Convert(ctx, qemuImg, raw, "raw", conv, tt.format); err != nil {
				t.Fatalf("Convert raw to %s: %v", tt.format, err)
			}
			// Images are for the builder's user and group: 0640, not
			// CreateTemp's 0600 nor the umask's 0644.
			if fi, err := os.Stat(conv); err != nil || fi.Mode().Perm() != perm.File {
				t.Errorf("converted image mode %v, %v; want %v", fi.Mode().Perm(), err, perm.File)
			}
			format, size := qemuInfo(t, qemuImg, conv)
			if format != tt.qemuName || size != int64(len(disk)) {
				t.Errorf("converted image is %s of %d bytes, want %s of %d", format, size, tt.qemuName, len(disk))
			}
			back := filepath.Join(dir, "back-"+tt.format+".raw")
			if err := Convert(ctx, "", conv, tt.format, back, "raw"); err != nil {
				t.Fatalf("Convert %s to raw: %v", tt.format, err)
			}
			got, err := os.ReadFile(back)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, disk) {
				t.Errorf("raw -> %s -> raw gave %d bytes that differ from the %d original", tt.format, len(got), len(disk))
			}
		})
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("temporary file left behind: %s", e.Name())
		}
	}
}

func TestConvertFailure(t *testing.T) {
	qemuImg := testenv.RequireBinary(t, "qemu-img")
	dir := t.TempDir()
	src := filepath.Join(dir, "not-qcow2")
	if err := os.WriteFile(src, []byte("this is not a qcow2 image"), 0o644); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "out.raw")
	err := Convert(context.Background(), qemuImg, src, "qcow2", dst, "raw")
	if err == nil {
		t.Fatal("Convert of a broken image succeeded")
	}
	// qemu-img's own complaint must reach the caller.
	if !strings.Contains(err.Error(), src) || !strings.Contains(strings.ToLower(err.Error()), "qcow2") {
		t.Errorf("error %q names neither the source nor the problem", err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d files after a failed conversion, want only the source", len(entries))
	}
}
