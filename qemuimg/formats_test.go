package qemuimg

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestConvertSource(t *testing.T) {
	for _, c := range []struct {
		want      string
		available []string
		src       string // "": none
	}{
		{"raw", []string{"qcow2"}, "qcow2"},
		{"raw", []string{"vmdk", "vhd", "qcow2"}, "qcow2"}, // qcow2 first, whatever the order published
		{"qcow2", []string{"vmdk", "raw"}, "raw"},
		{"vhd", []string{"vmdk"}, "vmdk"},
		{"vmdk", []string{"vhd", "raw"}, "raw"},
		{"raw", []string{"raw"}, ""}, // not from itself: it is published, nothing converts
		{"raw", nil, ""},
		{"raw", []string{"tar", "iso"}, ""}, // not formats qemu-img converts from
		{"tar", []string{"qcow2"}, ""},      // nor to
		{"iso", []string{"raw"}, ""},
	} {
		src, ok := ConvertSource(c.want, c.available)
		if src != c.src || ok != (c.src != "") {
			t.Errorf("ConvertSource(%s, %v) = %q, %v; want %q", c.want, c.available, src, ok, c.src)
		}
	}
}

func TestInstalled(t *testing.T) {
	err := Installed("no-such-qemu-img")
	if err == nil || !strings.Contains(err.Error(), "no-such-qemu-img is not installed") {
		t.Errorf("Installed(no-such-qemu-img) = %v, want it is not installed", err)
	}
	// A path is taken as it is, as running it would.
	fake := filepath.Join(t.TempDir(), "qemu-img")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Installed(fake); err != nil {
		t.Errorf("Installed(%s) = %v", fake, err)
	}
	if err := Installed(fake + ".missing"); err == nil {
		t.Errorf("Installed(%s.missing) = nil, want an error", fake)
	}
	// Empty is qemu-img on PATH.
	dir := filepath.Dir(fake)
	t.Setenv("PATH", dir)
	if err := Installed(""); err != nil {
		t.Errorf("Installed(\"\") with qemu-img on PATH = %v", err)
	}
	t.Setenv("PATH", t.TempDir())
	if err := Installed(""); err == nil || !strings.Contains(err.Error(), "qemu-img is not installed") {
		t.Errorf("Installed(\"\") without qemu-img on PATH = %v, want it is not installed", err)
	}
}
