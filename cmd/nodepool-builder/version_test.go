package main

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestDescribeBuild(t *testing.T) {
	const rev = "abcdef1234567890abcdef1234567890abcdef12"
	vcs := func(modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}
	}
	tests := []struct {
		name            string
		version, commit string // stamped by make build
		info            *debug.BuildInfo
		want            string
	}{
		{name: "make build", version: "1.2.3-4-gabcdef1", commit: rev,
			info: &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}},
			want: "1.2.3-4-gabcdef1 (commit abcdef123456)"},
		{name: "make build of a changed checkout", version: "1.2.3-4-gabcdef1-dirty", commit: rev,
			info: &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}},
			want: "1.2.3-4-gabcdef1-dirty (commit abcdef123456)"},
		{name: "make build before any tag", version: "abcdef1", commit: rev,
			want: "abcdef1 (commit abcdef123456)"},
		{name: "stamped version, commit from Go", version: "1.2.3",
			info: &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs("false")},
			want: "1.2.3 (commit abcdef123456)"},
		{name: "go build in a checkout", info: &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs("false")},
			want: "devel (commit abcdef123456)"},
		{name: "go build in a changed checkout",
			info: &debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20260101120000-abcdef123456+dirty"}, Settings: vcs("true")},
			want: "v0.0.0-20260101120000-abcdef123456+dirty (commit abcdef123456, modified)"},
		{name: "go install of a release", info: &debug.BuildInfo{Main: debug.Module{Version: "v1.2.3"}},
			want: "v1.2.3"},
		{name: "go build without VCS", info: &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}},
			want: "devel"},
		{name: "nothing recorded", want: "unknown"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, c := describeBuild(tt.version, tt.commit, tt.info)
			got := v
			if c != "" {
				got += " (commit " + c + ")"
			}
			if got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

// TestVersionFlag: --version prints the program's name, version and commit.
func TestVersionFlag(t *testing.T) {
	r := runCmd("--version")
	want := "nodepool-builder version " + versionText() + "\n"
	if r.code != exitOK || r.stdout != want || !strings.Contains(want, version()) {
		t.Errorf("--version exited %d and printed %q, want %q", r.code, r.stdout, want)
	}
}
