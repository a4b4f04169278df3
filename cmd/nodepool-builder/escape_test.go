package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// evil is what a hostile Zuul or cloud might put in a name: it clears the
// screen and starts a line that passes for a log line.
const evil = "\x1b[2J\ntime=2026-01-01T00:00:00Z level=INFO msg=forged"

// TestExitReportEscapes: the summary of a --once run prints what Zuul or a
// cloud said with its control characters escaped, one line for each failed
// step and none of the hostile text's making; another error keeps the lines
// that part its problems, and shows the rest of its control characters escaped.
func TestExitReportEscapes(t *testing.T) {
	steps := errors.Join(errors.New("fetch Zuul build x"+evil+" of debian: refused"), errors.New("upload debian to cloud-a: 503"))
	tests := []struct {
		name string
		err  error
		want []string
	}{
		{"--once summary", withCode(exitFailed, &stepsFailed{errs: unjoin(steps), err: steps}), []string{
			"nodepool-builder: 2 step(s) failed:",
			`fetch Zuul build x\x1b[2J\ntime=2026-01-01T00:00:00Z level=INFO msg=forged of debian: refused`,
			"upload debian to cloud-a: 503",
		}},
		{"an error of several problems", withCode(exitUsage, fmt.Errorf("nodepool.yaml:3: one\nnodepool.yaml:9: two\x1b[2J\u009b")), []string{
			"nodepool-builder: nodepool.yaml:3: one",
			`nodepool.yaml:9: two\x1b[2J\u009b`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var text bytes.Buffer
			reportExit(&text, "text", exitFailed, tt.err)
			got := strings.Split(strings.TrimSuffix(text.String(), "\n"), "\n")
			if !slices.Equal(got, tt.want) {
				t.Errorf("text:\n%q\nwant:\n%q", got, tt.want)
			}
			var js bytes.Buffer
			reportExit(&js, "json", exitFailed, tt.err)
			var rec map[string]any
			if strings.ContainsRune(js.String(), '\x1b') || strings.Count(js.String(), "\n") != 1 ||
				json.Unmarshal(js.Bytes(), &rec) != nil {
				t.Errorf("JSON record is not one line of JSON with its control characters escaped: %q", js.String())
			}
		})
	}
}

// TestTakeOverEscapes: take-over-images-dir lists the files and builds it
// leaves, whoever named them, with their control characters escaped.
func TestTakeOverEscapes(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(context.Background(), store.Options{ImagesDir: dir, Access: store.Create})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cfg := &config.Config{Path: filepath.Join(dir, "nodepool.yaml"), ImagesDir: dir}
	builds := []store.Build{{Image: "gone" + evil, ID: "0123456789abcdef0123456789abcdef", BuilderID: st.BuilderID(), State: store.Ready}}
	var out bytes.Buffer
	printTakeOver(&out, cfg, st, builds, []string{"debian-0123" + evil + ".qcow2"})
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.ContainsRune(line, '\x1b') || strings.HasPrefix(line, "time=") {
			t.Errorf("a line of the hostile names' making: %q", line)
		}
	}
	for _, w := range []string{`  gone\x1b[2J\ntime=2026-01-01T00:00:00Z level=INFO msg=forged-0123456789abcdef0123456789abcdef (ready)`,
		`  debian-0123\x1b[2J\ntime=2026-01-01T00:00:00Z level=INFO msg=forged.qcow2`} {
		if !strings.Contains(out.String(), w+"\n") {
			t.Errorf("take-over does not list %q:\n%s", w, out.String())
		}
	}
}
