package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeFileT writes a file for a test, making its directory.
func writeFileT(t *testing.T, path, content string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// runCmd runs the command with args and returns what it printed.
func runCmd(args ...string) result {
	var out, errb bytes.Buffer
	code := run(context.Background(), append([]string{"nodepool-builder"}, args...), &out, &errb)
	return result{code, out.String(), errb.String()}
}

// TestCloudsSearchNamedOnce: with the systemd unit's OS_CLIENT_CONFIG_FILE,
// /etc/openstack/clouds.yaml is both the file named and a place the search
// looks anyway; what the command prints names every file once.
func TestCloudsSearchNamedOnce(t *testing.T) {
	if _, err := os.Stat("/etc/openstack/clouds.yaml"); err == nil {
		t.Skip("this machine has /etc/openstack/clouds.yaml")
	}
	dir := t.TempDir()
	work, home := filepath.Join(dir, "work"), filepath.Join(dir, "home")
	if err := os.MkdirAll(work, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Chdir(work)
	t.Setenv("HOME", home)
	t.Setenv("XDG_CONFIG_HOME", "")
	t.Setenv("OS_CLIENT_CONFIG_FILE", "/etc/openstack/clouds.yaml")
	cfg := writeFileT(t, filepath.Join(dir, "nodepool.yaml"), `images-dir: `+filepath.Join(dir, "images")+`
zuul-images:
  - name: debian
    api-url: https://zuul.example.com/
    tenant: example
    project: org/images
    job: build-debian
providers:
  - name: cloud-a
    cloud: cloud-a
    diskimages:
      - name: debian
`)
	places := []string{"/etc/openstack/clouds.yaml", filepath.Join(work, "clouds.yaml"), filepath.Join(home, ".config/openstack/clouds.yaml")}
	for _, tt := range []struct {
		name  string
		files []string // clouds.yaml files that exist, defining another cloud
		want  string
	}{
		{name: "no clouds.yaml", want: "no clouds.yaml found"},
		{name: "cloud missing", files: []string{places[1], places[2]}, want: `cloud "cloud-a" is not defined in ` + places[1]},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for _, f := range tt.files {
				writeFileT(t, f, "clouds:\n  other: {auth_type: none, image_endpoint_override: http://x}\n")
				t.Cleanup(func() { os.Remove(f) })
			}
			for _, args := range [][]string{{"-c", cfg, "--once"}} {
				r := runCmd(args...)
				if r.code != exitUsage || !strings.Contains(r.stderr, tt.want) {
					t.Fatalf("%s exited %d, want %d and %q:\n%s", strings.Join(args, " "), r.code, exitUsage, tt.want, r.stderr)
				}
				for _, p := range places {
					if n := strings.Count(r.stderr, p); n != 1 {
						t.Errorf("%s names %s %d times, want once:\n%s", strings.Join(args, " "), p, n, r.stderr)
					}
				}
			}
		})
	}
}
