package main

import (
	"strings"
	"testing"
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
