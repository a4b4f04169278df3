package dib

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/progress"
)

func TestStepOf(t *testing.T) {
	for line, want := range map[string]string{
		"2026-03-01 12:00:00.000 | dib-run-parts Running /tmp/in_target.d/install.d/10-apt-packages": "install.d/10-apt-packages",
		"dib-run-parts Running /tmp/dib_build.x/hooks/root.d/08-debootstrap":                         "root.d/08-debootstrap",
		"Building elements: base debian-minimal vm":                                                  "elements: base debian-minimal vm",
		"dib-run-parts Running /x/post-install.d/1-a\x1b[31m\x07":                                    "post-install.d/1-a",
		"Building elements: a\x1b]0;title\x07b":                                                      "elements: a]0;titleb",
		"Building elements: " + strings.Repeat("e", 200):                                             "elements: " + strings.Repeat("e", 69) + "…",
		"+ echo hello":  "",
		"Running tests": "",
	} {
		if got := stepOf(line); got != want {
			t.Errorf("stepOf(%q) = %q, want %q", line, got, want)
		}
	}
}

func TestBuildHasAProgressTaskWithItsStep(t *testing.T) {
	f := newFixture(t)
	gate := filepath.Join(f.dir, "go")
	b := f.builder(f.diskimages(`
  - name: debian
    dib-cmd: {{DIB}}
    elements: [debian-minimal]
    formats: [raw]
    env-vars:
      FAKE_DIB_WAIT_FOR: ` + gate + `
`))
	tr := progress.NewTracker()
	b.opts.Progress = tr
	errc := make(chan error, 1)
	go func() {
		_, err := b.Build(context.Background(), "debian")
		errc <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		run := tr.Running()
		if len(run) == 1 && run[0].Note != "" {
			s := run[0]
			if s.Kind != progress.Build || !strings.HasPrefix(s.Subject, "debian-") || s.Note != "pre-install.d/01-fake-wait" || s.Total != 0 {
				t.Errorf("task = %+v, want a build of debian at pre-install.d/01-fake-wait", s)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the tracker shows %+v, want a build with a note", run)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("build: %v\nlog:\n%s", err, f.lastLog("debian"))
	}
	if run := tr.Running(); len(run) != 0 {
		t.Errorf("tasks after the build: %+v, want none", run)
	}
}
