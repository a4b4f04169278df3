package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/nodepool-builder/nodepool-builder/store"
)

// TestHelpShowsEachDefaultOnce: a flag's help line names its default at most
// once, and a switch has none to name ("(default: false)" says nothing).
func TestHelpShowsEachDefaultOnce(t *testing.T) {
	runs := [][]string{{"--help"}}
	for _, c := range newApp(nil, nil).Commands {
		runs = append(runs, []string{c.Name, "--help"})
	}
	for _, args := range runs {
		r := runCmd(args...)
		if r.code != exitOK {
			t.Fatalf("%s exited %d: %s", strings.Join(args, " "), r.code, r.stderr)
		}
		for _, line := range strings.Split(r.stdout, "\n") {
			if !strings.HasPrefix(strings.TrimSpace(line), "-") {
				continue
			}
			if n := strings.Count(strings.ToLower(line), "default"); n > 1 || strings.Contains(line, "(default: false)") {
				t.Errorf("%s: %q", strings.Join(args, " "), strings.TrimSpace(line))
			}
		}
	}
}

// TestExitErrorInLogFormat: with --log-format json the error that ends the
// program, and the summary of a --once run's failures, are JSON log records
// like the logs before them; text stays a line of text.
func TestExitErrorInLogFormat(t *testing.T) {
	dir := t.TempDir()
	failing := writeFileT(t, filepath.Join(dir, "nodepool.yaml"), `images-dir: `+filepath.Join(dir, "images")+`
build-log-dir: `+filepath.Join(dir, "logs")+`
diskimages:
  - name: one
    dib-cmd: /bin/false
  - name: two
    dib-cmd: /bin/false
`)
	tests := []struct {
		name   string
		args   []string
		code   int
		want   []string // in the final record's msg, error or errors (JSON), or the final lines (text)
		errors int      // errors listed in the JSON record
	}{
		{name: "config missing", args: []string{"-c", filepath.Join(dir, "missing.yaml"), "--once"}, code: exitUsage,
			want: []string{"missing.yaml"}},
		{name: "unknown command", args: []string{"-c", failing, "bogus"}, code: exitUsage, want: []string{`unknown command "bogus"`}},
		{name: "once with failed steps", args: []string{"-c", failing, "--once"}, code: exitFailed,
			want: []string{"2 step(s) failed", "build one-", "build two-", "exited with code 1"}, errors: 2},
	}
	for _, tt := range tests {
		for _, format := range []string{"text", "json"} {
			t.Run(tt.name+" "+format, func(t *testing.T) {
				os.RemoveAll(filepath.Join(dir, "images"))
				r := runCmd(append([]string{"--log-format", format}, tt.args...)...)
				if r.code != tt.code {
					t.Fatalf("exited %d, want %d:\n%s", r.code, tt.code, r.stderr)
				}
				lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
				if format == "text" {
					text := r.stderr[strings.LastIndex(r.stderr, "nodepool-builder: "):]
					for _, s := range tt.want {
						if !strings.Contains(text, s) {
							t.Errorf("the text does not say %q:\n%s", s, r.stderr)
						}
					}
					return
				}
				var last map[string]any
				for _, line := range lines {
					var rec map[string]any
					if err := json.Unmarshal([]byte(line), &rec); err != nil {
						t.Fatalf("stderr line is not a JSON record: %v\n%s", err, line)
					}
					last = rec
				}
				if last["level"] != "ERROR" || last["exit_code"] != float64(tt.code) {
					t.Errorf("final record %v: want level ERROR and exit_code %d", last, tt.code)
				}
				errs, _ := last["errors"].([]any)
				if len(errs) != tt.errors {
					t.Errorf("final record lists %d errors, want %d: %v", len(errs), tt.errors, last)
				}
				all := fmt.Sprint(last["msg"], last["error"], errs)
				for _, s := range tt.want {
					if !strings.Contains(all, s) {
						t.Errorf("final record does not say %q: %v", s, last)
					}
				}
			})
		}
	}
}

// TestLogsAndExitShowNoUserinfo: whatever part logs a URL with a password in
// it, at any level, and whatever error ends the program or a --once run, the
// lines written show the URL without its userinfo, in text and JSON alike.
func TestLogsAndExitShowNoUserinfo(t *testing.T) {
	const password = "pw-3e9f"
	raw := "https://ci:" + password + "@zuul.example.org/api/tenant/t/builds?job_name=j"
	u, _ := url.Parse(raw)
	poll := fmt.Errorf("list Zuul builds: GET %s: EOF", raw)
	for _, format := range []string{"text", "json"} {
		t.Run(format, func(t *testing.T) {
			set := flag.NewFlagSet("test", flag.ContinueOnError)
			set.String("log-format", format, "")
			set.Bool("debug", true, "")
			var out bytes.Buffer
			log, err := newLoggerTo(cli.NewContext(newApp(nil, nil), set, nil), &out)
			if err != nil {
				t.Fatal(err)
			}
			log.Debug("polling "+raw, "url", u, "error", poll)
			log.With("api_url", raw).Warn("poll failed", "errors", []string{raw})
			reportExit(&out, format, exitFailed, &stepsFailed{errs: []error{poll, errors.New("other")}, err: errors.Join(poll, errors.New("other"))})
			reportExit(&out, format, exitUsage, poll)
			if strings.Contains(out.String(), password) {
				t.Errorf("the password shows:\n%s", out.String())
			}
			if n := strings.Count(out.String(), "https://zuul.example.org/api/tenant/t/builds?job_name=j"); n < 7 {
				t.Errorf("the URL shows %d times without its userinfo, want 7 or more:\n%s", n, out.String())
			}
		})
	}
}

// TestCommandsWithoutArgumentsRefuseThem: nodepool's listings take no
// arguments; ours refuse one instead of printing a list as if it were a filter
// (an empty one for dib-image-list bogus).
func TestCommandsWithoutArgumentsRefuseThem(t *testing.T) {
	dir := t.TempDir()
	images := filepath.Join(dir, "images")
	cfg := writeFileT(t, filepath.Join(dir, "nodepool.yaml"), "images-dir: "+images+"\ndiskimages:\n  - name: debian\n    dib-cmd: /bin/false\n")
	st, err := store.Open(t.Context(), store.Options{ImagesDir: images})
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{args: []string{"dib-image-list", "bogus"}, want: `dib-image-list takes no arguments, not "bogus"`},
		{args: []string{"dib-image-list", "debian"}, want: `dib-image-list takes no arguments, not "debian"`},
		{args: []string{"image-list", "debian"}, want: `image-list takes no arguments, not "debian"`},
		{args: []string{"image-list", "debian", "--json"}, want: "put flags such as --json before"},
		{args: []string{"image-status", "debian"}, want: `image-status takes no arguments, not "debian"`},
		{args: []string{"config-validate", "other.yaml"}, want: `config-validate takes no arguments, not "other.yaml"`},
	} {
		r := runCmd(append([]string{"-c", cfg}, tt.args...)...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tt.want) || r.stdout != "" {
			t.Errorf("%s exited %d, printed %q, want %d and %q:\n%s", strings.Join(tt.args, " "), r.code, r.stdout, exitUsage, tt.want, r.stderr)
		}
	}
}
