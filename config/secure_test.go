package config

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// secureNodepool is a nodepool.yaml whose settings the secure files of the
// tests below lay theirs over.
const secureNodepool = `images-dir: /opt/images
zookeeper-servers:
  - host: zk-main.example.com
    chroot: /main
zookeeper-tls:
  cert: /main/cert.pem
  key: /main/key.pem
  ca: /main/ca.pem
zookeeper-timeout: 20.0
diskimages:
  - name: base
    abstract: true
    elements: [vm]
    env-vars: {FROM_BASE: b}
  - name: debian
    parent: base
    env-vars: {DIB_RELEASE: bookworm, TOKEN: public}
  - name: ubuntu
    elements: [ubuntu-minimal]
  - name: ubuntu-child
    parent: ubuntu
  - name: zimg
    pause: true
`

// secureOwn is the builder's own file beside secureNodepool.
const secureOwn = `zuul-images:
  - name: zimg
    api-url: https://zuul.example.com/
    project: org/images
    job: build-zimg
`

// parseSecure parses secureNodepool (or nodepool, when given), secureOwn and
// a secure file secure.conf holding secure, in the environment env.
func parseSecure(secure string, env map[string]string, nodepool ...string) (*Config, error) {
	np := secureNodepool
	if len(nodepool) > 0 {
		np = nodepool[0]
	}
	return ParseFiles(Text{Name: "nodepool.yaml", Data: []byte(np)},
		&Text{Name: "nodepool-builder.yaml", Data: []byte(secureOwn)},
		&Text{Name: "secure.conf", Data: []byte(secure)},
		func(name string) (string, bool) { v, ok := env[name]; return v, ok })
}

func mustParseSecure(t *testing.T, secure string, env map[string]string, nodepool ...string) *Config {
	t.Helper()
	cfg, err := parseSecure(secure, env, nodepool...)
	if err != nil {
		t.Fatalf("ParseFiles with secure.conf:\n%s\n%v", secure, err)
	}
	return cfg
}

// TestSecureFileMeaning: what the secure file holds is laid over
// nodepool.yaml as nodepool's loadSecureConfig lays it: a non-empty server
// list and a non-empty zookeeper-tls replace nodepool.yaml's, env-vars merge
// into the diskimage named, the secure file's winning, and go to that image
// alone; %(NODEPOOL_X) is substituted.
func TestSecureFileMeaning(t *testing.T) {
	mainZK := &ZooKeeper{
		Servers:     []ZooKeeperServer{{Host: "zk-main.example.com", Port: 2281, Chroot: "/main"}},
		ServersFile: "nodepool.yaml",
		TLS:         &ZooKeeperTLS{Cert: "/main/cert.pem", Key: "/main/key.pem", CA: "/main/ca.pem"},
		Timeout:     20 * time.Second,
	}
	withZK := func(change func(zk *ZooKeeper)) *ZooKeeper {
		zk := *mainZK
		change(&zk)
		return &zk
	}
	mainEnv := map[string]map[string]string{
		"debian":       {"FROM_BASE": "b", "DIB_RELEASE": "bookworm", "TOKEN": "public"},
		"ubuntu":       nil,
		"ubuntu-child": nil,
	}
	withEnv := func(image string, env map[string]string) map[string]map[string]string {
		out := maps.Clone(mainEnv)
		out[image] = env
		return out
	}
	tests := []struct {
		name     string
		secure   string
		nodepool string // "": secureNodepool
		env      map[string]string
		zk       *ZooKeeper
		envVars  map[string]map[string]string
	}{
		{name: "nothing of note", secure: "diskimages: []\n", zk: mainZK, envVars: mainEnv},
		{name: "servers in both: the secure list wins, chroot and all",
			secure: "zookeeper-servers:\n  - host: zk1.example.com\n    port: 2182\n  - host: zk2.example.com\n",
			zk: withZK(func(zk *ZooKeeper) {
				zk.Servers = []ZooKeeperServer{{Host: "zk1.example.com", Port: 2182}, {Host: "zk2.example.com", Port: 2281}}
				zk.ServersFile = "secure.conf"
			}), envVars: mainEnv},
		{name: "servers only in the secure file",
			nodepool: "images-dir: /opt/images\nzookeeper-timeout: 5.0\ndiskimages: [{name: zimg, pause: true}]\n",
			secure:   "zookeeper-servers:\n  - {host: zk1.example.com, chroot: /np}\nzookeeper-tls: {cert: c, key: k, ca: a}\n",
			zk: &ZooKeeper{Servers: []ZooKeeperServer{{Host: "zk1.example.com", Port: 2281, Chroot: "/np"}},
				ServersFile: "secure.conf", TLS: &ZooKeeperTLS{Cert: "c", Key: "k", CA: "a"}, Timeout: 5 * time.Second}},
		{name: "an empty server list leaves nodepool.yaml's", secure: "zookeeper-servers: []\n", zk: mainZK, envVars: mainEnv},
		{name: "tls in the secure file replaces nodepool.yaml's",
			secure: "zookeeper-tls:\n  cert: /s/cert.pem\n  key: /s/key.pem\n  ca: /s/ca.pem\n",
			zk: withZK(func(zk *ZooKeeper) {
				zk.TLS = &ZooKeeperTLS{Cert: "/s/cert.pem", Key: "/s/key.pem", CA: "/s/ca.pem"}
			}), envVars: mainEnv},
		{name: "an empty tls section leaves nodepool.yaml's", secure: "zookeeper-tls: {}\n", zk: mainZK, envVars: mainEnv},
		{name: "tls without servers anywhere: no ZooKeeper",
			nodepool: "images-dir: /opt/images\ndiskimages: [{name: zimg, pause: true}]\n", secure: "zookeeper-tls: {cert: c, key: k, ca: a}\n"},
		{name: "env-vars merge, the secure file's winning, into the image named alone",
			secure: "diskimages:\n  - name: debian\n    env-vars:\n      TOKEN: s3cret\n      DIB_PASSWORD: pw\n  - name: ubuntu\n    env-vars: {U: '1'}\n",
			zk:     mainZK,
			envVars: map[string]map[string]string{
				"debian":       {"FROM_BASE": "b", "DIB_RELEASE": "bookworm", "TOKEN": "s3cret", "DIB_PASSWORD": "pw"},
				"ubuntu":       {"U": "1"},
				"ubuntu-child": nil, // nodepool gives ubuntu's secure env-vars to ubuntu alone
			}},
		{name: "entries for one image apply in order",
			secure: "diskimages:\n  - {name: ubuntu, env-vars: {A: '1', B: '1'}}\n  - {name: ubuntu, env-vars: {B: '2'}}\n",
			zk:     mainZK, envVars: withEnv("ubuntu", map[string]string{"A": "1", "B": "2"})},
		{name: "substitution",
			secure: "zookeeper-servers:\n  - host: '%(NODEPOOL_ZK_HOST)'\ndiskimages:\n  - name: ubuntu\n    env-vars: {DIB_PASSWORD: '%(NODEPOOL_DIB_PASSWORD)'}\n",
			env:    map[string]string{"NODEPOOL_ZK_HOST": "zk9.example.com", "NODEPOOL_DIB_PASSWORD": "from-env"},
			zk: withZK(func(zk *ZooKeeper) {
				zk.Servers, zk.ServersFile = []ZooKeeperServer{{Host: "zk9.example.com", Port: 2281}}, "secure.conf"
			}), envVars: withEnv("ubuntu", map[string]string{"DIB_PASSWORD": "from-env"})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var cfg *Config
			if tt.nodepool != "" {
				cfg = mustParseSecure(t, tt.secure, tt.env, tt.nodepool)
			} else {
				cfg = mustParseSecure(t, tt.secure, tt.env)
			}
			if cfg.SecurePath != "secure.conf" {
				t.Errorf("SecurePath = %q, want secure.conf", cfg.SecurePath)
			}
			if !reflect.DeepEqual(cfg.ZooKeeper, tt.zk) {
				t.Errorf("ZooKeeper = %+v, want %+v", cfg.ZooKeeper, tt.zk)
			}
			if tt.envVars == nil {
				return
			}
			got := map[string]map[string]string{}
			for _, d := range cfg.DiskImages {
				got[d.Name] = d.EnvVars
			}
			if !reflect.DeepEqual(got, tt.envVars) {
				t.Errorf("env-vars = %v, want %v", got, tt.envVars)
			}
			if len(cfg.Warnings) != 0 {
				t.Errorf("warnings %q, want none", cfg.Warnings)
			}
		})
	}
}

// TestSecureFileErrors: what nodepool's loader refuses in a secure file, and
// what would silently not apply, is an error naming the secure file, the line
// and the key.
func TestSecureFileErrors(t *testing.T) {
	tests := []struct {
		name   string
		secure string
		line   int
		path   string
		msg    string
	}{
		{"an unknown diskimage", "diskimages:\n  - name: fedora\n    env-vars: {A: b}\n", 2, "diskimages[0].name",
			`"fedora" is not a diskimage of nodepool.yaml, and nodepool's loader refuses`},
		{"an abstract diskimage", "diskimages:\n  - name: base\n    env-vars: {A: b}\n", 2, "diskimages[0].name",
			`"base" is an abstract diskimage`},
		{"a diskimage without env-vars", "diskimages:\n  - name: debian\n", 2, "diskimages[0].env-vars",
			"nodepool's loader fails on a diskimage of the secure file without env-vars"},
		{"a diskimage without a name", "diskimages:\n  - env-vars: {A: b}\n", 2, "diskimages[0].name", "is required"},
		{"a misspelt key", "zookeeper-tsl:\n  cert: c\n", 1, "zookeeper-tsl", "unknown key in the secure file; did you mean zookeeper-tls?"},
		{"a misspelt diskimage key", "diskimages:\n  - name: debian\n    env_vars: {A: b}\n", 3, "diskimages[0].env_vars",
			"did you mean env-vars?"},
		{"a misspelt server key", "zookeeper-servers:\n  - host: zk\n    prot: 2181\n", 3, "zookeeper-servers[0].prot",
			"unknown key in a ZooKeeper server; did you mean port?"},
		{"an incomplete tls section", "zookeeper-tls:\n  cert: c\n  ca: a\n", 2, "zookeeper-tls.key", "is required"},
		{"a server without a host", "zookeeper-servers:\n  - port: 2181\n", 2, "zookeeper-servers[0].host", "is required"},
		{"a syntax error", "diskimages:\n  - name: debian\n   env-vars: {A: b}\n", 2, "diskimages", "YAML syntax error"},
		{"an empty file", "# nothing\n", 1, "", "holds no config"},
		{"not a mapping", "- zookeeper-servers\n", 1, "", "expected the secure file"},
		{"an unset variable", "diskimages:\n  - name: debian\n    env-vars: {P: '%(NODEPOOL_UNSET)'}\n", 3, "diskimages[0].env-vars.P",
			"environment variable NODEPOOL_UNSET is not set"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := parseSecure(tt.secure, nil)
			if err == nil {
				t.Fatalf("ParseFiles succeeded with %+v, want an error", cfg)
			}
			wantFileError(t, err, "secure.conf", tt.line, tt.path, tt.msg)
			var es Errors
			errors.As(err, &es)
			for _, e := range es {
				if e.File == "secure.conf" && !strings.HasPrefix(e.Error(), "secure.conf:") {
					t.Errorf("error %q does not start with the file and line", e)
				}
			}
		})
	}
}

// TestSecureFileWarnings: a key nodepool knows elsewhere but does not read
// from the secure file does nothing there, to nodepool or to the builder; it
// loads with a warning naming the file, the line and where it belongs.
func TestSecureFileWarnings(t *testing.T) {
	tests := []struct {
		name   string
		secure string
		want   string
	}{
		{"a key of nodepool.yaml", "zookeeper-timeout: 60.0\n",
			"secure.conf:1: zookeeper-timeout: nodepool reads only zookeeper-servers, zookeeper-tls and the env-vars of diskimages from the secure file"},
		{"a key of the builder's file", "builder:\n  keep-builds: 1\n", "secure.conf:1: builder: nodepool reads only"},
		{"a diskimage key", "diskimages:\n  - name: debian\n    env-vars: {A: b}\n    elements: [x]\n",
			"secure.conf:4: diskimages[0].elements: nodepool reads only the name and env-vars of a diskimage from the secure file"},
		{"a zuul-image", "diskimages:\n  - name: zimg\n    env-vars: {A: b}\n",
			`secure.conf:2: diskimages[0].name: "zimg" is a zuul-image, fetched from Zuul and never built here, so its env-vars are not used`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := mustParseSecure(t, tt.secure, nil)
			if len(cfg.Warnings) != 1 || !strings.HasPrefix(cfg.Warnings[0], tt.want) {
				t.Errorf("warnings %q, want one starting %q", cfg.Warnings, tt.want)
			}
			if d := cfg.DiskImage("debian"); d.Elements[0] != "vm" || len(d.Elements) != 1 {
				t.Errorf("debian's elements = %v, want nodepool.yaml's alone", d.Elements)
			}
			if cfg.Builder.KeepBuilds != DefaultKeepBuilds || cfg.ZooKeeper.Timeout != 20*time.Second {
				t.Errorf("a key the secure file does not take was taken: keep-builds %d, zookeeper-timeout %s",
					cfg.Builder.KeepBuilds, cfg.ZooKeeper.Timeout)
			}
		})
	}
}

// TestSecureFileValuesStayOutOfErrors: the secure file holds secrets, so its
// problems quote none of its values, even one written where another key
// belongs; nodepool.yaml's problems still show theirs.
func TestSecureFileValuesStayOutOfErrors(t *testing.T) {
	const secret = "hunter2-s3cret"
	for _, secure := range []string{
		"diskimages:\n  - name: debian\n    env-vars: DIB_PASSWORD=" + secret + "\n",
		"diskimages:\n  - name: debian\n    env-vars: [" + secret + "]\n",
		"zookeeper-tls: " + secret + "\n",
		"zookeeper-servers:\n  - host: " + secret + "\n    chroot: " + secret + "\n",
		"zookeeper-servers:\n  - host: 12345\n",
		"zookeeper-servers:\n  - host: zk\n    port: " + secret + "\n",
		"diskimages: " + secret + "\n",
		secret + "\n",
	} {
		_, err := parseSecure(secure, nil)
		if err == nil {
			t.Errorf("secure file %q loads, want an error", secure)
			continue
		}
		if strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), "12345") {
			t.Errorf("the error of secure file %q shows its value: %v", secure, err)
		}
	}
	// nodepool.yaml's own errors still quote what they refuse.
	_, err := Parse("nodepool.yaml", []byte("images-dir: /i\nzookeeper-tls: plain\n"), noEnv)
	if err == nil || !strings.Contains(err.Error(), `"plain"`) {
		t.Errorf("nodepool.yaml's error %v does not quote the value", err)
	}
}

// TestLoadSecureFile: Load reads the file -s names, which must exist, and a
// change of it alone changes the snapshot, so that a daemon reloads it.
func TestLoadSecureFile(t *testing.T) {
	dir := t.TempDir()
	np := writeConfigFile(t, filepath.Join(dir, "nodepool.yaml"), "images-dir: /opt/images\ndiskimages:\n  - name: debian\n")
	secure := writeConfigFile(t, filepath.Join(dir, "secure.conf"), "diskimages:\n  - {name: debian, env-vars: {P: one}}\n")
	files := Files{Nodepool: np, Secure: secure}
	first, err := Read(files)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := first.Load()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.SecurePath != secure || cfg.Files.Secure != secure || cfg.DiskImage("debian").EnvVars["P"] != "one" {
		t.Errorf("loaded %+v, want debian's P from %s", cfg, secure)
	}
	if got, want := cfg.Files.Flags(), "-c "+np+" -s "+secure; got != want {
		t.Errorf("Flags() = %q, want %q", got, want)
	}
	again, err := Read(files)
	if err != nil || !first.Equal(again) {
		t.Fatalf("two reads of unchanged files differ (%v)", err)
	}
	writeConfigFile(t, secure, "diskimages:\n  - {name: debian, env-vars: {P: two}}\n")
	changed, err := Read(files)
	if err != nil {
		t.Fatal(err)
	}
	if first.Equal(changed) {
		t.Error("a change of the secure file does not change the snapshot")
	}
	if first.Equal(&Snapshot{Files: Files{Nodepool: np}, Nodepool: first.Nodepool}) {
		t.Error("a snapshot without the secure file equals one with it")
	}

	missing := filepath.Join(dir, "missing.conf")
	_, err = Load(Files{Nodepool: np, Secure: missing})
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), "-s") {
		t.Errorf("Load with a missing secure file = %v, want a not-exist error naming it and -s", err)
	}
	writeConfigFile(t, secure, "diskimages:\n  - {name: nope, env-vars: {P: two}}\n")
	_, err = Load(files)
	var e *Error
	if !errors.As(err, &e) || e.File != secure || e.Line != 2 {
		t.Errorf("Load = %v, want an error of %s:2", err, secure)
	}
}
