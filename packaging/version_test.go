package packaging

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
)

// versionScript prints the version make stamps and packages with.
var versionScript, _ = filepath.Abs(filepath.Join("..", "scripts", "version.sh"))

// debianVersion is the syntax dpkg accepts for a version without an epoch or
// a Debian revision (the package is native).
var debianVersion = regexp.MustCompile(`^[0-9][A-Za-z0-9.+~]*$`)

// TestVersion: version.sh turns git describe into a Debian version that
// sorts as the commits do: before any tag, on a tag, after it, and for a
// pre-release tag before the release.
func TestVersion(t *testing.T) {
	git := testenv.RequireBinary(t, "git")
	dir := t.TempDir()
	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com",
			"GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com",
			"GIT_COMMITTER_DATE=2025-05-20T12:34:56Z", "GIT_AUTHOR_DATE=2025-05-20T12:34:56Z")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	commit := func(content string) string {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, "f"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		run(git, "add", "f")
		run(git, "commit", "-q", "-m", content)
		return run(git, "rev-parse", "--short=7", "HEAD")
	}
	version := func() string {
		t.Helper()
		v := run("sh", versionScript)
		if !debianVersion.MatchString(v) {
			t.Errorf("version %q is not a Debian version", v)
		}
		return v
	}

	run(git, "init", "-q")
	if v := run("sh", versionScript); v != "" {
		t.Errorf("version before the first commit = %q, want nothing", v)
	}
	first := commit("1")
	var seen []string
	for _, step := range []struct {
		do   func()
		want string
	}{
		{func() {}, "0.0.0~git20250520123456.g" + first},
		{func() { os.WriteFile(filepath.Join(dir, "f"), []byte("changed"), 0o644) }, "0.0.0~git20250520123456.g" + first + "+dirty"},
		{func() { run(git, "checkout", "-q", "f"); run(git, "tag", "v1.2.3-rc1") }, "1.2.3~rc1"},
		{func() { run(git, "tag", "-d", "v1.2.3-rc1"); run(git, "tag", "v1.2.3") }, "1.2.3"},
		{func() { os.WriteFile(filepath.Join(dir, "f"), []byte("changed"), 0o644) }, "1.2.3+dirty"},
		{func() { run(git, "checkout", "-q", "f"); commit("2"); commit("3") }, "1.2.3+git2.g"},
		{func() { run(git, "tag", "not-a-version") }, "1.2.3+git2.g"},
		{func() { commit("4"); run(git, "tag", "v1.10.0") }, "1.10.0"},
	} {
		step.do()
		v := version()
		if !strings.HasPrefix(v, step.want) || (!strings.HasSuffix(step.want, ".g") && v != step.want) {
			t.Errorf("version = %q, want %q", v, step.want)
		}
		seen = append(seen, v)
	}
	t.Logf("versions: %s", strings.Join(seen, " "))
	// dpkg orders them as they were made (the dirty ones aside).
	ordered := []string{seen[0], seen[2], seen[3], seen[5], seen[7]}
	dpkg := testenv.RequireBinary(t, "dpkg")
	for i := 1; i < len(ordered); i++ {
		if err := exec.Command(dpkg, "--compare-versions", ordered[i-1], "lt", ordered[i]).Run(); err != nil {
			t.Errorf("dpkg does not sort %s before %s", ordered[i-1], ordered[i])
		}
	}
}
