package qemuimg

import (
	"fmt"
	"os/exec"
	"slices"
)

// program is the qemu-img to run: qemuImg, or "qemu-img" from PATH when empty.
func program(qemuImg string) string {
	if qemuImg == "" {
		return "qemu-img"
	}
	return qemuImg
}

// Installed returns an error when qemuImg (empty: "qemu-img") is not a program
// found as it would be run, on PATH unless it names a path.
func Installed(qemuImg string) error {
	name := program(qemuImg)
	if _, err := exec.LookPath(name); err != nil {
		return fmt.Errorf("%s is not installed: %w", name, err)
	}
	return nil
}

// convertible are the formats Convert reads and writes, in the order a source
// is preferred in: qcow2, the format published most, first.
var convertible = []string{"qcow2", "raw", "vhd", "vmdk"}

// ConvertSource picks, of the formats available, the one Convert makes format
// want from; false when want is not a format Convert writes or none available
// is one it reads.
func ConvertSource(want string, available []string) (string, bool) {
	if !slices.Contains(convertible, want) {
		return "", false
	}
	for _, src := range convertible {
		if src != want && slices.Contains(available, src) {
			return src, true
		}
	}
	return "", false
}
