package testenv

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// SystemdAnalyze runs systemd-analyze and returns its exit code and output.
func SystemdAnalyze(t testing.TB, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, RequireBinary(t, "systemd-analyze"), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), out.String()
	}
	if err != nil {
		t.Fatalf("systemd-analyze %s: %v", strings.Join(args, " "), err)
	}
	return 0, out.String()
}

// VerifyUnit runs systemd-analyze verify on unit and returns its exit code and
// what it says about the unit: the lines that name the unit (its file and its
// drop-ins' paths name it too). verify also loads the units the unit refers to,
// and through them the host's (with Debian's glance-api enabled, a keystone.service
// that orders itself after itself): what it says about those is the host's to
// answer for, and only logged.
func VerifyUnit(t testing.TB, unit string) (int, string) {
	t.Helper()
	code, out := SystemdAnalyze(t, "verify", unit)
	name := filepath.Base(unit)
	var about, others []string
	for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
		switch {
		case strings.TrimSpace(line) == "":
		case strings.Contains(line, name):
			about = append(about, line)
		default:
			others = append(others, line)
		}
	}
	if len(others) > 0 {
		t.Logf("systemd-analyze verify on other units than %s:\n%s", name, strings.Join(others, "\n"))
	}
	return code, strings.Join(about, "\n")
}
