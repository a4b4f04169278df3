package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
)

// exampleUnit is the systemd unit operators install.
var exampleUnit = filepath.Join("..", "..", "examples", "nodepool-builder.service")

// unitUnderTest copies the example unit into a directory of its own with
// ExecStart pointing at a program that exists (systemd-analyze verify refuses
// a missing one), and returns the copy's path.
func unitUnderTest(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(exampleUnit)
	if err != nil {
		t.Fatal(err)
	}
	const installed = "ExecStart=/usr/local/bin/nodepool-builder "
	if !bytes.Contains(data, []byte(installed)) {
		t.Fatalf("%s has no %q line", exampleUnit, installed)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	data = bytes.Replace(data, []byte(installed), []byte("ExecStart="+self+" "), 1)
	path := filepath.Join(t.TempDir(), "nodepool-builder.service")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestVerifyUnitJudgesTheUnit: testenv.VerifyUnit passes over a defect of a unit the
// host adds beside the unit under test, and still reports the unit's own, in
// its file and in a drop-in of it.
func TestVerifyUnitJudgesTheUnit(t *testing.T) {
	// A unit path with a defective unit that network-online.target, which the
	// example unit wants, pulls in; the ':' keeps the usual paths after it.
	units := t.TempDir()
	neighbour := filepath.Join(units, "keystone.service")
	if err := os.WriteFile(neighbour, []byte("[Unit]\nAfter=keystone.service\nNoSuchKey=1\n[Service]\nExecStart=/bin/true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	wants := filepath.Join(units, "network-online.target.wants")
	if err := os.Mkdir(wants, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(neighbour, filepath.Join(wants, "keystone.service")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SYSTEMD_UNIT_PATH", units+":")

	unit := unitUnderTest(t)
	if _, out := testenv.SystemdAnalyze(t, "verify", unit); !strings.Contains(out, "NoSuchKey") {
		t.Fatalf("systemd-analyze verify of the example unit did not reach the defective neighbour:\n%s", out)
	}
	if code, about := testenv.VerifyUnit(t, unit); code != 0 || about != "" {
		t.Errorf("verify of the example unit beside a defective one = %d, %q; want 0 and nothing about the unit", code, about)
	}
	data, err := os.ReadFile(unit)
	if err != nil {
		t.Fatal(err)
	}
	data = bytes.Replace(data, []byte("\n[Service]\n"), []byte("\n[Service]\nUnitOwnKey=1\n"), 1)
	if err := os.WriteFile(unit, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(unit+".d", 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(unit+".d", "own.conf"), []byte("[Service]\nDropInOwnKey=1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, about := testenv.VerifyUnit(t, unit)
	for _, want := range []string{"UnitOwnKey", "DropInOwnKey"} {
		if !strings.Contains(about, want) {
			t.Errorf("verify of a unit with an unknown key %s says nothing of it about the unit: %q", want, about)
		}
	}
	if strings.Contains(about, "keystone") {
		t.Errorf("what verify says about the unit includes the neighbour's defect: %q", about)
	}
}

// TestExampleUnitIsSandboxed: the example systemd unit is one systemd reads
// without a complaint, with its sandboxing (an exposure of 2.0 or less, where
// the unit without it scored 9.2), and so is the drop-in its comments give for
// a builder that runs diskimage-builder.
func TestExampleUnitIsSandboxed(t *testing.T) {
	unit := unitUnderTest(t)
	// verify exits 0 for unknown keys too: any word from it about the unit is a defect.
	if code, about := testenv.VerifyUnit(t, unit); code != 0 || about != "" {
		t.Errorf("systemd-analyze verify exited %d saying about the unit:\n%s", code, about)
	}
	if code, out := testenv.SystemdAnalyze(t, "security", "--offline=yes", "--threshold=20", unit); code != 0 {
		t.Errorf("systemd-analyze security exited %d: the unit is exposed above 2.0:\n%s", code, out)
	}
	data, err := os.ReadFile(unit)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"\nNoNewPrivileges=yes\n", "\nProtectSystem=strict\n", "\nPrivateTmp=yes\n", "\nProtectHome=yes\n",
		"\nReadWritePaths=/opt/nodepool/images /var/log/nodepool\n"} {
		if !strings.Contains(string(data), want) {
			t.Errorf("the unit lacks %q", strings.TrimSpace(want))
		}
	}

	// The drop-in for DIB, as the comments give it: "#   " lines from its
	// [Service] to the line that says what to run next.
	var dropIn []string
	in := false
	for line := range strings.SplitSeq(string(data), "\n") {
		switch {
		case line == "#   [Service]":
			in = true
		case in && !strings.HasPrefix(line, "#   "):
			in = false
		}
		if in {
			dropIn = append(dropIn, strings.TrimPrefix(line, "#   "))
		}
	}
	if len(dropIn) < 5 || !strings.Contains(strings.Join(dropIn, "\n"), "NoNewPrivileges=no") {
		t.Fatalf("the unit's comments give no DIB drop-in that relaxes NoNewPrivileges: %q", dropIn)
	}
	dir := unit + ".d"
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "dib.conf"), []byte(strings.Join(dropIn, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, about := testenv.VerifyUnit(t, unit); code != 0 || about != "" {
		t.Errorf("systemd-analyze verify with the DIB drop-in exited %d saying about the unit:\n%s\ndrop-in:\n%s", code, about, strings.Join(dropIn, "\n"))
	}
}
