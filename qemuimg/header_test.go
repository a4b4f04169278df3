package qemuimg

import (
	"strings"
	"testing"
)

// TestHeaderFormat: the magic of every format qemu's probe knows is found, so that a file
// claimed raw (or tar, iso...) that another format would read is refused.
func TestHeaderFormat(t *testing.T) {
	vdi := make([]byte, 72)
	copy(vdi[64:], "\x7f\x10\xda\xbe")
	tests := []struct {
		head, want string
	}{
		{"QFI\xfb\x00\x00\x00\x03", "qcow2"},
		{"QFI\xfb\x00\x00\x00\x02", "qcow2"},
		{"QFI\xfb\x00\x00\x00\x01", "qcow"},
		{"QED\x00", "qed"},
		{"KDMV\x01\x00\x00\x00", "vmdk"},
		{"COWD\x01\x00\x00\x00", "vmdk"},
		{"# Disk DescriptorFile\nversion=1\n", "vmdk"},
		{"#c\n   \r\nversion=3\r\nCID=1\n", "vmdk"},
		{string(vdi), "vdi"},
		{"conectix", "vpc"},
		{"vhdxfile", "vhdx"},
		{"LUKS\xba\xbe\x00\x01", "luks"},
		{"Bochs Virtual HD Image\x00", "bochs"},
		{"WithoutFreeSpace", "parallels"},
		{"WithouFreSpacExt", "parallels"},
		{"#!/bin/sh\n#V2.0 Format\nmodprobe cloop", "cloop"},
		{"", "raw"},
		{"just some text\nversion=1\n", "raw"},
		{strings.Repeat("#\n", 300) + "version=1\n", "raw"}, // beyond what qemu's probe reads
		{"\x00\x00\x00\x00QFI\xfb", "raw"},
	}
	for _, tt := range tests {
		if got := headerFormat([]byte(tt.head)); got != tt.want {
			t.Errorf("headerFormat(%q) = %s, want %s", tt.head, got, tt.want)
		}
	}
}
