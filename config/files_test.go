package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const (
	pairNodepool = `images-dir: /opt/images
diskimages:
  - name: debian
    pause: true
    username: debian
    shell-type: sh
providers:
  - name: cloud
    cloud: c
    diskimages:
      - name: debian
`
	pairOwn = `zuul-images:
  - name: debian
    api-url: https://zuul.example.com/
    project: org/images
    job: build-debian
builder:
  keep-builds: 3
`
)

// wantFileError checks that err holds an *Error of file at line and path
// whose message contains msg.
func wantFileError(t *testing.T, err error, file string, line int, path, msg string) {
	t.Helper()
	var es Errors
	if !errors.As(err, &es) {
		t.Fatalf("error %v (%T) is not an Errors", err, err)
	}
	for _, e := range es {
		if e.File == file && e.Line == line && e.Path == path && strings.Contains(e.Msg, msg) {
			return
		}
	}
	t.Errorf("no error in %s at line %d, path %q, containing %q; got:\n%v", file, line, path, msg, err)
}

func TestParseFilesPair(t *testing.T) {
	cfg := mustParseFiles(t, pairNodepool, pairOwn)
	// nodepool's launcher reads shell-type, its config-validate refuses it.
	if len(cfg.Warnings) != 1 || !strings.HasPrefix(cfg.Warnings[0], "nodepool.yaml:6: diskimages[0].shell-type: ") {
		t.Errorf("warnings = %q, want one, of shell-type", cfg.Warnings)
	}
	if len(cfg.DiskImages) != 0 {
		t.Errorf("DiskImages = %+v, want none: the entry declares the zuul-image", cfg.DiskImages)
	}
	zi := cfg.ZuulImage("debian")
	if zi == nil || !zi.Declared || zi.Username != "debian" || zi.PythonPath != "auto" || zi.ShellType != "sh" || zi.Pause {
		t.Errorf("zuul-image = %+v, want declared, username debian, python-path auto, shell-type sh, not paused", zi)
	}
	if cfg.Builder.KeepBuilds != 3 {
		t.Errorf("keep-builds = %d, want 3 from the builder's own file", cfg.Builder.KeepBuilds)
	}
	if p := cfg.Provider("cloud"); p == nil || p.Entry("debian") == nil {
		t.Errorf("provider cloud does not list debian: %+v", p)
	}
}

func TestParseFilesErrors(t *testing.T) {
	const np, own = "nodepool.yaml", "nodepool-builder.yaml"
	tests := []struct {
		name           string
		nodepool, mine string
		file           string
		line           int
		path, msg      string
	}{
		{"zuul-image not declared", "images-dir: /i\n", pairOwn, own, 2, "zuul-images[0].name",
			`"debian" is not declared in nodepool.yaml: add "- {name: debian, pause: true}" under its diskimages`},
		{"nodepool's key in the builder's file", "images-dir: /i\n", "images-dir: /j\n", own, 1, "images-dir",
			"is a key of nodepool's, which belongs in nodepool.yaml, not in the builder's own file"},
		{"unknown key in the builder's file", "images-dir: /i\n", "zuul-image: []\n", own, 1, "zuul-image",
			"unknown key in the builder's config; did you mean zuul-images?"},
		{"zuul-images in both files", "images-dir: /i\nzuul-images: []\n", pairOwn, np, 2, "zuul-images",
			"is a setting of the builder's own, and the builder reads its own file nodepool-builder.yaml: move this section there"},
		{"builder in both files", "images-dir: /i\nbuilder: {}\n", "builder: {}\n", np, 2, "builder",
			"is a setting of the builder's own"},
		{"declared with elements", strings.Replace(pairNodepool, "pause: true", "pause: true\n    elements: [vm]\n    dib-cmd: x", 1), pairOwn,
			np, 3, "diskimages[0].name", `"debian" is a zuul-image (defined at nodepool-builder.yaml:2), so this entry declares it to nodepool, but it also holds diskimage-builder settings (elements, dib-cmd)`},
		{"declared with formats and metadata", strings.Replace(pairNodepool, "pause: true", "pause: true\n    formats: [raw]\n    metadata: {a: b}", 1), pairOwn,
			np, 3, "diskimages[0].name", "diskimage-builder settings (formats, metadata)"},
		{"declared unpaused", strings.Replace(pairNodepool, "pause: true", "pause: false", 1), pairOwn,
			np, 3, "diskimages[0].name", "needs pause: true so that a Python nodepool-builder reading this file never builds it"},
		{"zuul-image names a diskimage", "images-dir: /i\ndiskimages:\n  - {name: debian, elements: [vm]}\n", pairOwn,
			np, 3, "diskimages[0].name", "diskimage-builder settings (elements)"},
		{"builder setting bad", "images-dir: /i\n", "builder:\n  keep-builds: 0\n", own, 2, "builder.keep-builds", "1 or more"},
		{"syntax error in the builder's file", "images-dir: /i\n", "builder:\n  keep-builds: [\n", own, 3, "builder", "YAML syntax error"},
		{"unset variable in the builder's file", "images-dir: /i\n", "builder:\n  state-db: '%(NODEPOOL_NOPE)'\n", own, 2,
			"builder.state-db", "environment variable NODEPOOL_NOPE is not set"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseFiles(tt.nodepool, tt.mine)
			if err == nil {
				t.Fatal("ParseFiles accepted it")
			}
			wantFileError(t, err, tt.file, tt.line, tt.path, tt.msg)
		})
	}
}

// Problems of both files are reported in one go, nodepool.yaml's first, each
// naming its file.
func TestParseFilesErrorsOfBoth(t *testing.T) {
	_, err := parseFiles("images-dir: /i\nbuild-log-retention: x\n", "builder:\n  keep-builds: 0\n")
	var es Errors
	if !errors.As(err, &es) || len(es) != 2 || es[0].File != "nodepool.yaml" || es[1].File != "nodepool-builder.yaml" {
		t.Fatalf("errors = %v, want one of nodepool.yaml, then one of nodepool-builder.yaml", err)
	}
	if !strings.HasPrefix(es[1].Error(), "nodepool-builder.yaml:2: builder.keep-builds: ") {
		t.Errorf("the builder file's error prints as %q", es[1].Error())
	}
}

// nodepool's old top-level gearman-servers still works, with a warning:
// nodepool 10 refuses it.
func TestParseTopLevelGearmanServers(t *testing.T) {
	cfg := mustParseFiles(t, "images-dir: /i\ngearman-servers:\n  - host: g1\n", "builder:\n  gearman-servers:\n    - host: g2\n")
	if len(cfg.Builder.GearmanServers) != 2 {
		t.Errorf("gearman servers = %+v, want g2 and g1", cfg.Builder.GearmanServers)
	}
	if len(cfg.Warnings) != 1 || !strings.Contains(cfg.Warnings[0], "move it to builder.gearman-servers in nodepool-builder.yaml") {
		t.Errorf("warnings = %q", cfg.Warnings)
	}
}

func writeConfigFile(t *testing.T, path, text string) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestLoadFiles(t *testing.T) {
	dir := t.TempDir()
	np := writeConfigFile(t, filepath.Join(dir, "nodepool.yaml"), pairNodepool)

	t.Run("no builder file beside", func(t *testing.T) {
		// The declaration is then a paused diskimage with no elements.
		cfg, err := Load(Files{Nodepool: np})
		if err != nil {
			t.Fatal(err)
		}
		if cfg.BuilderPath != "" || len(cfg.ZuulImages) != 0 || cfg.DiskImage("debian") == nil {
			t.Errorf("config = %+v, want no builder file and debian a diskimage", cfg)
		}
	})
	t.Run("named and missing", func(t *testing.T) {
		missing := filepath.Join(dir, "elsewhere.yaml")
		_, err := Load(Files{Nodepool: np, Builder: missing})
		if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), "--builder-config") {
			t.Errorf("Load = %v, want a not-exist error naming %s and the flag", err, missing)
		}
	})
	t.Run("named as nodepool.yaml", func(t *testing.T) {
		_, err := Load(Files{Nodepool: np, Builder: np})
		if err == nil || !strings.Contains(err.Error(), "it is the nodepool config itself") {
			t.Errorf("Load = %v, want a refusal of nodepool.yaml as the builder's file", err)
		}
	})
	t.Run("named", func(t *testing.T) {
		own := writeConfigFile(t, filepath.Join(dir, "mine.yaml"), pairOwn)
		cfg, err := Load(Files{Nodepool: np, Builder: own})
		if err != nil {
			t.Fatal(err)
		}
		if cfg.BuilderPath != own || cfg.ZuulImage("debian") == nil || cfg.Files.Builder != own {
			t.Errorf("config = %+v, want the zuul-image of %s", cfg, own)
		}
	})
	t.Run("beside", func(t *testing.T) {
		own := writeConfigFile(t, filepath.Join(dir, BuilderFileName), pairOwn)
		defer os.Remove(own)
		cfg, err := Load(Files{Nodepool: np})
		if err != nil {
			t.Fatal(err)
		}
		if cfg.BuilderPath != own || cfg.ZuulImage("debian") == nil {
			t.Errorf("config = %+v, want the zuul-image of %s", cfg, own)
		}
	})
	t.Run("errors name the builder file", func(t *testing.T) {
		own := writeConfigFile(t, filepath.Join(dir, "bad.yaml"), "builder:\n  keep-builds: 0\n")
		_, err := Load(Files{Nodepool: np, Builder: own})
		var e *Error
		if !errors.As(err, &e) || e.File != own || e.Line != 2 {
			t.Errorf("Load = %v, want an error of %s:2", err, own)
		}
	})
}

// A change of either file changes the snapshot, the builder's own file coming
// or going included; the same files read twice give the same snapshot; a
// snapshot loads the text it holds, whatever the files hold by then.
func TestSnapshot(t *testing.T) {
	dir := t.TempDir()
	np := writeConfigFile(t, filepath.Join(dir, "nodepool.yaml"), pairNodepool)
	files := Files{Nodepool: np}
	snap := func() *Snapshot {
		t.Helper()
		s, err := Read(files)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	first := snap()
	if !first.Equal(snap()) {
		t.Fatal("two snapshots of unchanged files differ")
	}
	own := writeConfigFile(t, filepath.Join(dir, BuilderFileName), "")
	withEmpty := snap()
	if first.Equal(withEmpty) {
		t.Error("an empty builder file appearing does not change the snapshot")
	}
	writeConfigFile(t, own, pairOwn)
	withOwn := snap()
	if withEmpty.Equal(withOwn) {
		t.Error("a change of the builder file does not change the snapshot")
	}
	writeConfigFile(t, np, strings.Replace(pairNodepool, "/opt/images", "/opt/other", 1))
	if withOwn.Equal(snap()) {
		t.Error("a change of nodepool.yaml does not change the snapshot")
	}
	cfg, err := withOwn.Load()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Snapshot != withOwn || cfg.Files != files || cfg.ImagesDir != "/opt/images" || cfg.ZuulImage("debian") == nil {
		t.Errorf("the snapshot loaded %+v, want the text it held", cfg)
	}
	os.Remove(np)
	if _, err := Read(files); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Read without nodepool.yaml = %v, want not-exist", err)
	}
}

// A ZooKeeper server without a port is where nodepool 10's loadConfig puts it,
// 2281, so that the launcher and the builder reading one file reach one server.
func TestZooKeeperDefaultPort(t *testing.T) {
	cfg := mustParse(t, "images-dir: /i\nzookeeper-servers:\n  - host: zk\n")
	if cfg.ZooKeeper == nil || len(cfg.ZooKeeper.Servers) != 1 || cfg.ZooKeeper.Servers[0].Port != 2281 {
		t.Errorf("zookeeper = %+v, want zk:2281", cfg.ZooKeeper)
	}
}

// build-diskimages: false leaves the diskimages of a shared nodepool.yaml to
// the Python nodepool-builders that read it too; they stay in the config.
func TestParseBuildDiskImages(t *testing.T) {
	cfg := mustParseFiles(t, "images-dir: /i\ndiskimages:\n  - {name: d, elements: [vm]}\n", "builder:\n  build-diskimages: false\n")
	if !cfg.Builder.LeaveDiskImages || cfg.DiskImage("d") == nil {
		t.Errorf("builder = %+v, diskimage d %v; want the diskimages left to others and d in the config", cfg.Builder, cfg.DiskImage("d"))
	}
	if cfg := mustParse(t, "images-dir: /i\n"); cfg.Builder.LeaveDiskImages {
		t.Error("diskimages are left to others by default")
	}
}
