package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/hostpattern"
)

func corpusEnv(name string) (string, bool) {
	if name == "NODEPOOL_PORT" {
		return "8005", true
	}
	return "", false
}

func corpusFiles(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "nodepool-configs", dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no corpus files in %s: %v", dir, err)
	}
	return files
}

func TestCorpusAccept(t *testing.T) {
	for _, file := range corpusFiles(t, "accept") {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := Parse(filepath.Base(file), data, corpusEnv); err != nil {
				t.Errorf("Parse: %v", err)
			}
		})
	}
}

func TestCorpusGood(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "nodepool-configs", "accept", "good.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := Parse("good.yaml", data, corpusEnv)
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.LauncherWebapp.Equal(&Webapp{ListenAddress: "0.0.0.0", Port: 8005}) {
		t.Errorf("webapp = %+v, want 0.0.0.0:8005 from %%(NODEPOOL_PORT)", cfg.LauncherWebapp)
	}
	if cfg.Builder.Webapp != nil {
		t.Errorf("builder.webapp = %+v, want none: nodepool's webapp is the launcher's", cfg.Builder.Webapp)
	}
	// Of nine providers only the two openstack ones are ours.
	var names []string
	for _, p := range cfg.Providers {
		names = append(names, p.Name)
	}
	if fmt.Sprint(names) != "[cloud1 cloud2]" {
		t.Errorf("providers = %v, want [cloud1 cloud2]", names)
	}
	if p := cfg.Provider("cloud2"); p.Rate != 0.001 || p.PostUploadHook != "/usr/bin/upload-hook" || p.RegionName != "chocolate" {
		t.Errorf("cloud2 = %+v", p)
	}
	trusty := cfg.DiskImage("trusty")
	if trusty == nil || trusty.Release != "trusty" || trusty.RebuildAge != time.Hour || trusty.PythonPath != "/bin/python3.6" ||
		len(trusty.Elements) != 6 || trusty.EnvVars["TMPDIR"] != "/opt/dib_tmp" {
		t.Errorf("trusty = %+v", trusty)
	}
	if got := cfg.NeededFormats("trusty"); fmt.Sprint(got) != "[qcow2 tar]" {
		t.Errorf("NeededFormats(trusty) = %v, want [qcow2 tar]", got)
	}
}

func TestCorpusReject(t *testing.T) {
	// The first problem each file must report; every problem must name a line and a key.
	want := map[string]struct {
		line int
		path string
		msg  string
	}{
		"duplicate_diskimage_name.yaml":   {70, "diskimages[1].name", `"trusty" is defined twice`},
		"missing_diskimage_provider.yaml": {6, "providers[0].diskimages[0].name", `"wrong" is not a diskimage; define it under diskimages`},
		"missing_parent_diskimage.yaml":   {191, "diskimages[2].parent", `"this_does_not_exist" is not a diskimage`},
		"no_diskimage_name.yaml":          {51, "diskimages[0].name", "is required"},
		"yaml_error.yaml":                 {57, "diskimages", "YAML syntax error"},
	}
	files := corpusFiles(t, "reject")
	if len(files) != len(want) {
		t.Errorf("%d reject files, %d expectations", len(files), len(want))
	}
	for _, file := range files {
		base := filepath.Base(file)
		t.Run(base, func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			_, err = Parse(base, data, corpusEnv)
			if err == nil {
				t.Fatal("Parse succeeded, want an error")
			}
			var es Errors
			if !errors.As(err, &es) || len(es) == 0 {
				t.Fatalf("error %v is not an Errors", err)
			}
			for _, e := range es {
				if e.Line <= 0 || e.Path == "" || e.File != base ||
					!strings.HasPrefix(e.Error(), fmt.Sprintf("%s:%d: %s: ", base, e.Line, e.Path)) {
					t.Errorf("error %q does not name file, line and key", e)
				}
			}
			w, ok := want[base]
			if !ok {
				t.Fatalf("no expectation for %s", base)
			}
			found := false
			for _, e := range es {
				if e.Line == w.line && e.Path == w.path && strings.Contains(e.Msg, w.msg) {
					found = true
				}
			}
			if !found {
				t.Errorf("want an error at line %d, %s, containing %q; got:\n%v", w.line, w.path, w.msg, err)
			}
		})
	}
}

func TestLoadZuulImagesExample(t *testing.T) {
	path := filepath.Join("testdata", "zuul-images", "nodepool.yaml")
	cfg, err := Load(Files{Nodepool: path})
	if err != nil {
		t.Fatal(err)
	}
	want := &Config{
		Files:             Files{Nodepool: path},
		Path:              path,
		BuilderPath:       filepath.Join("testdata", "zuul-images", BuilderFileName),
		ImagesDir:         "/var/lib/nodepool/images",
		BuildLogDir:       "/var/log/nodepool/builds",
		BuildLogRetention: 14,
		LauncherWebapp:    &Webapp{ListenAddress: "0.0.0.0", Port: 8005},
		ZooKeeper: &ZooKeeper{
			Servers:     []ZooKeeperServer{{Host: "zk.example.com", Port: 2281, Chroot: "/nodepool"}},
			ServersFile: path,
			TLS:         &ZooKeeperTLS{Cert: "/etc/nodepool/zk-client.pem", Key: "/etc/nodepool/zk-client.key", CA: "/etc/nodepool/zk-ca.pem"},
			Timeout:     30 * time.Second,
		},
		ZuulImages: []ZuulImage{
			{
				Declared:             true,
				Username:             "debian",
				PythonPath:           "/usr/bin/python3",
				Name:                 "debian-bookworm",
				APIURL:               "https://zuul.example.com/",
				Tenant:               "example",
				Project:              "org/images",
				Branch:               "master",
				Pipelines:            []string{"periodic", "post"},
				JobName:              "build-debian-bookworm-image",
				PollInterval:         300 * time.Second,
				AuthTokenFile:        "/etc/nodepool/zuul.token",
				CACert:               "/etc/ssl/zuul-ca.pem",
				RequireChecksum:      true,
				AllowUnmergedChanges: true,
				ArtifactHosts:        hostPatterns(t, "zuul.example.com", "*.logs.example.com", "swift.internal:8080"),
				Formats:              []string{"vhd"},
				Artifacts: []ArtifactMapping{
					{Format: "qcow2", Type: "image-qcow"},
					{Format: "raw", Type: "image-raw", Name: "raw image"},
				},
				Metadata: map[string]string{"os_distro": "debian", "os_version": "12"},
			},
			{
				Declared:     true,
				Username:     "zuul",
				PythonPath:   "/usr/bin/python3.11",
				Name:         "ubuntu-noble",
				APIURL:       "http://zuul.internal:9000",
				Project:      "org/images",
				JobName:      "build-ubuntu-noble-image",
				PollInterval: 120 * time.Second,
				Pause:        true,
			},
		},
		Providers: []Provider{
			{
				Name:               "cloud-a",
				Cloud:              "mycloud",
				RegionName:         "RegionOne",
				ImageNameFormat:    "{image_name}-{build_id}-{upload_id}",
				ImageUploadTimeout: 2 * time.Hour,
				PostUploadHook:     "/usr/local/bin/check-image",
				Rate:               0.5,
				DiskImages: []ProviderImage{
					{Name: "debian-bookworm", Meta: map[string]string{"hw_disk_bus": "scsi"}},
					{Name: "ubuntu-noble", Pause: true},
				},
			},
			{
				Name:               "cloud-b",
				Cloud:              "othercloud",
				ImageNameFormat:    "{image_name}-{timestamp}",
				ImageUploadTimeout: time.Hour,
				Rate:               1,
				DiskImages:         []ProviderImage{{Name: "debian-bookworm"}},
			},
		},
		Builder: Builder{
			PollInterval:   120 * time.Second,
			UploadWorkers:  8,
			KeepBuilds:     3,
			KeepUploads:    1,
			UploadAttempts: 7,
			StateDB:        "/var/lib/nodepool/state/builder.db",
			GearmanServers: []GearmanServer{{Host: "gearman.example.com", Port: 4730}, {Host: "192.0.2.10", Port: 4731},
				{Host: "gearman2.example.com", Port: 4730}},
			LeakSweep:    false,
			MaxImageSize: 64 << 30,

			GearmanUnservedAfter:    45 * time.Second,
			GearmanMinBuildInterval: DefaultGearmanMinBuildInterval,
			DownloadConnections:     6,
			Webapp:                  &Webapp{ListenAddress: "127.0.0.1", Port: 8016},
		},
	}
	// The text it was loaded from, which TestSnapshot checks, and its own
	// settings as read, which TestOwnSettingsChanged checks.
	cfg.Snapshot, cfg.own = nil, nil
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("Load =\n%+v\nwant\n%+v", cfg, want)
	}
	if got := cfg.NeededFormats("debian-bookworm"); fmt.Sprint(got) != "[qcow2 vhd]" {
		t.Errorf("NeededFormats(debian-bookworm) = %v, want [qcow2 vhd]", got)
	}
	if got := cfg.NeededFormats("ubuntu-noble"); fmt.Sprint(got) != "[qcow2]" {
		t.Errorf("NeededFormats(ubuntu-noble) = %v, want [qcow2] (paused entries count)", got)
	}
	if len(cfg.DiskImages) != 0 {
		t.Errorf("DiskImages = %+v, want none: the entries declare zuul-images", cfg.DiskImages)
	}
}

// A one-file config, the builder's settings in nodepool.yaml, loads as the
// same config in two files does, with warnings that say what to move where.
func TestLoadOneFile(t *testing.T) {
	pair, err := Load(Files{Nodepool: filepath.Join("testdata", "zuul-images", "nodepool.yaml")})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("testdata", "one-file.yaml")
	cfg, err := Load(Files{Nodepool: path})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		path + " holds zuul-images and builder, which nodepool's config-validate refuses",
		"move them into nodepool-builder.yaml",
		"gearman-servers: is an older nodepool's key",
		"zuul-images debian-bookworm, ubuntu-noble are not declared under diskimages",
	} {
		if !strings.Contains(strings.Join(cfg.Warnings, "\n"), want) {
			t.Errorf("warnings %q do not say %q", cfg.Warnings, want)
		}
	}
	// What differs: where it was read from, the text of its own settings
	// (gearman-servers at the top level), and what the declarations add.
	cfg.Files, cfg.Snapshot, cfg.Path, cfg.BuilderPath, cfg.Warnings = pair.Files, pair.Snapshot, pair.Path, pair.BuilderPath, pair.Warnings
	cfg.own = pair.own
	cfg.ZooKeeper.ServersFile = pair.ZooKeeper.ServersFile
	for i := range cfg.ZuulImages {
		zi, pz := &cfg.ZuulImages[i], pair.ZuulImages[i]
		if zi.Declared || zi.Username != DefaultUsername || zi.PythonPath != DefaultPythonPath || zi.ShellType != "" {
			t.Errorf("undeclared %s = %+v, want nodepool's defaults", zi.Name, zi)
		}
		zi.Declared, zi.Username, zi.PythonPath, zi.ShellType = pz.Declared, pz.Username, pz.PythonPath, pz.ShellType
	}
	// The pair's launcher stanzas are more complete; nothing here reads them.
	if !reflect.DeepEqual(cfg, pair) {
		t.Errorf("one file =\n%+v\ntwo files =\n%+v", cfg, pair)
	}
}

func TestLoadMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nodepool.yaml")
	_, err := Load(Files{Nodepool: path})
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), path) {
		t.Errorf("Load(missing) = %v, want a not-exist error naming the file", err)
	}
}

func TestLoadNamesFileInErrors(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nodepool.yaml")
	if err := os.WriteFile(path, []byte("images-dir: /i\nbuilder:\n  keep-builds: 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(Files{Nodepool: path})
	var e *Error
	if !errors.As(err, &e) || e.File != path || e.Line != 3 || e.Path != "builder.keep-builds" {
		t.Errorf("Load error = %v, want %s:3: builder.keep-builds", err, path)
	}
}

func hostPatterns(t *testing.T, entries ...string) []hostpattern.Pattern {
	t.Helper()
	out := make([]hostpattern.Pattern, len(entries))
	for i, e := range entries {
		p, err := hostpattern.Parse(e)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = p
	}
	return out
}
