package main

import (
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
)

var (
	// exampleCron runs the builder --once from cron, appending to its log.
	exampleCron = filepath.Join("..", "..", "examples", "cron.d", "nodepool-builder")
	// exampleLogrotate rotates that log.
	exampleLogrotate = filepath.Join("..", "..", "examples", "logrotate.d", "nodepool-builder")
)

// TestLogrotateExampleRotatesTheCronLog: the logrotate example names the log
// the cron example appends to, logrotate reads it without an error, and
// rotating it renames the log, makes a new one for the next run, and
// compresses the one before.
func TestLogrotateExampleRotatesTheCronLog(t *testing.T) {
	logrotate := testenv.RequireBinary(t, "logrotate")
	cron, err := os.ReadFile(exampleCron)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^[^#].* >>(\S+) 2>&1`).FindSubmatch(cron)
	if m == nil {
		t.Fatalf("%s appends to no log", exampleCron)
	}
	cronLog := string(m[1])
	conf, err := os.ReadFile(exampleLogrotate)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(conf), "\n"+cronLog+" {\n") {
		t.Fatalf("%s does not rotate %s, the cron example's log", exampleLogrotate, cronLog)
	}

	// The same file, for a log in a directory of the test's and its user: the
	// nodepool user need not exist here.
	dir := t.TempDir()
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	g, err := user.LookupGroupId(u.Gid)
	if err != nil {
		t.Fatal(err)
	}
	logFile := filepath.Join(dir, "builder.log")
	text := strings.ReplaceAll(string(conf), cronLog, logFile)
	if strings.Count(text, " nodepool nodepool\n") != 2 {
		t.Fatalf("%s names the nodepool user other than in su and create:\n%s", exampleLogrotate, conf)
	}
	text = strings.ReplaceAll(text, " nodepool nodepool\n", " "+u.Username+" "+g.Name+"\n")
	confPath := filepath.Join(dir, "nodepool-builder")
	if err := os.WriteFile(confPath, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	rotate := func(args ...string) string {
		t.Helper()
		out, err := exec.CommandContext(t.Context(), logrotate, append(args, "-s", filepath.Join(dir, "state"), confPath)...).CombinedOutput()
		if err != nil || strings.Contains(string(out), "error:") {
			t.Fatalf("logrotate %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	write := func(line string) {
		t.Helper()
		f, err := os.OpenFile(logFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteString(line + "\n"); err != nil {
			t.Fatal(err)
		}
	}

	write("run 1")
	if out := rotate("-d"); !strings.Contains(out, "considering log "+logFile) {
		t.Fatalf("logrotate -d does not consider %s:\n%s", logFile, out)
	}
	rotate("-f")
	if got, err := os.ReadFile(logFile + ".1"); err != nil || string(got) != "run 1\n" {
		t.Fatalf("after a rotation %s.1 holds %q (%v), want the log before it", logFile, got, err)
	}
	fi, err := os.Stat(logFile)
	if err != nil {
		t.Fatalf("the rotation made no new log for the next run: %v", err)
	}
	if fi.Mode() != 0o640 {
		t.Errorf("the new log has mode %v, want 0640 as the builder's files", fi.Mode())
	}
	write("run 2")
	rotate("-f")
	if _, err := os.Stat(logFile + ".2.gz"); err != nil {
		t.Errorf("the second rotation did not compress the first one's log: %v", err)
	}
	if got, err := os.ReadFile(logFile + ".1"); err != nil || string(got) != "run 2\n" {
		t.Errorf("after the second rotation %s.1 holds %q (%v), want the last run's", logFile, got, err)
	}
}
