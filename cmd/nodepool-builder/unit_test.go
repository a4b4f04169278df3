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
// the unit without it scored 9.2), writing where the example configs and the
// package put the images and logs.
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
		"\nReadWritePaths=/var/lib/nodepool /var/log/nodepool\n"} {
		if !strings.Contains(string(data), want) {
			t.Errorf("the unit lacks %q", strings.TrimSpace(want))
		}
	}
}

// exampleDIBDropIn is the drop-in a builder of diskimages adds to the unit.
var exampleDIBDropIn = filepath.Join("..", "..", "examples", "dib.conf")

// impliesNoNewPrivileges are the settings that, for a User= other than root,
// make systemd set no_new_privs whatever NoNewPrivileges= says: the list of
// systemd.exec(5) of systemd 252 (Debian 12), at NoNewPrivileges=.
var impliesNoNewPrivileges = []string{"DynamicUser", "LockPersonality", "MemoryDenyWriteExecute", "PrivateDevices",
	"ProtectClock", "ProtectHostname", "ProtectKernelLogs", "ProtectKernelModules", "ProtectKernelTunables",
	"RestrictAddressFamilies", "RestrictNamespaces", "RestrictRealtime", "RestrictSUIDSGID",
	"SystemCallArchitectures", "SystemCallFilter", "SystemCallLog"}

// TestDIBDropInLetsSudoGainRoot: the drop-in for diskimage-builder resets
// NoNewPrivileges and every setting of the unit that implies it, so that sudo
// can gain root, and keeps the file-system sandbox; systemd reads the unit
// with it without a complaint. (The package test runs it under systemd.)
func TestDIBDropInLetsSudoGainRoot(t *testing.T) {
	unit := unitUnderTest(t)
	unitSets, dropInSets := serviceSettings(t, unit), serviceSettings(t, exampleDIBDropIn)
	if v, ok := dropInSets["NoNewPrivileges"]; !ok || v != "no" {
		t.Errorf("the drop-in sets NoNewPrivileges=%q, want no", v)
	}
	for _, key := range impliesNoNewPrivileges {
		v, inUnit := unitSets[key]
		if !inUnit || isReset(v) {
			continue
		}
		if reset, ok := dropInSets[key]; !ok || !isReset(reset) {
			t.Errorf("the unit sets %s=%s, which implies NoNewPrivileges=yes, and the drop-in does not reset it (%q)", key, v, reset)
		}
	}
	for _, key := range []string{"User", "ProtectSystem", "ReadWritePaths", "PrivateTmp", "ProtectHome", "ExecStart"} {
		if v, ok := dropInSets[key]; ok {
			t.Errorf("the drop-in sets %s=%s: it should leave it to the unit", key, v)
		}
	}
	dir := unit + ".d"
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(exampleDIBDropIn)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "dib.conf"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	if code, about := testenv.VerifyUnit(t, unit); code != 0 || about != "" {
		t.Errorf("systemd-analyze verify with the DIB drop-in exited %d saying about the unit:\n%s", code, about)
	}
}

// serviceSettings reads the [Service] section of a unit file or drop-in: each
// key's last assignment, as systemd applies them in order (an empty one
// resets a list; the tests here need no more than the last).
func serviceSettings(t *testing.T, path string) map[string]string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	settings := map[string]string{}
	section := ""
	for line := range strings.SplitSeq(string(data), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "["):
			section = line
		case section == "[Service]":
			key, value, ok := strings.Cut(line, "=")
			if !ok {
				t.Fatalf("%s: %q is not a setting", path, line)
			}
			settings[key] = value
		}
	}
	return settings
}

// isReset tells whether a setting's value turns it off: empty, or false.
func isReset(v string) bool {
	switch v {
	case "", "no", "false", "off", "0":
		return true
	}
	return false
}
