package config

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
)

// docsExample returns the YAML block that follows the marker
// "<!-- example: name -->" in docs/beside-nodepool.md.
func docsExample(t *testing.T, name string) string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "docs", "beside-nodepool.md"))
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile("(?s)<!-- example: " + regexp.QuoteMeta(name) + " -->\n```yaml\n(.*?)```")
	m := re.FindSubmatch(doc)
	if m == nil {
		t.Fatalf("docs/beside-nodepool.md has no example %s", name)
	}
	return string(m[1])
}

// configPair is a nodepool.yaml and the builder's own file.
type configPair struct {
	name, nodepool, own string
}

// ourPairs are the configs the project shows or tests with: the examples,
// the docs', the test data's.
func ourPairs(t *testing.T) []configPair {
	dir := t.TempDir()
	docs := configPair{"docs", filepath.Join(dir, "nodepool.yaml"), filepath.Join(dir, BuilderFileName)}
	writeConfigFile(t, docs.nodepool, docsExample(t, "nodepool.yaml"))
	writeConfigFile(t, docs.own, docsExample(t, "nodepool-builder.yaml"))
	return []configPair{
		{"examples", filepath.Join("..", "examples", "nodepool.yaml"), filepath.Join("..", "examples", BuilderFileName)},
		docs,
		{"testdata", filepath.Join("testdata", "zuul-images", "nodepool.yaml"), filepath.Join("testdata", "zuul-images", BuilderFileName)},
	}
}

// cloudsFor writes a clouds.yaml with each openstack provider's cloud, as
// nodepool's loadConfig looks them up, and returns the environment naming it.
func cloudsFor(t *testing.T, cfg *Config) []string {
	t.Helper()
	var b strings.Builder
	b.WriteString("clouds:\n")
	seen := map[string]bool{}
	for _, p := range cfg.Providers {
		if !seen[p.Cloud] {
			seen[p.Cloud] = true
			fmt.Fprintf(&b, "  %q: {auth_type: none, image_endpoint_override: 'http://127.0.0.1:9/'}\n", p.Cloud)
		}
	}
	return []string{"OS_CLIENT_CONFIG_FILE=" + writeConfigFile(t, filepath.Join(t.TempDir(), "clouds.yaml"), b.String())}
}

// TestNodepoolAcceptsOurConfigs: every nodepool.yaml the project shows is one
// nodepool 10's own code accepts, as nodepool config-validate and as
// nodepool-launcher and nodepool-builder load it; each zuul-image is a paused
// diskimage to nodepool, with the connection settings this builder records,
// every provider lists what ours says, and a launcher's label boots a
// zuul-image.
func TestNodepoolAcceptsOurConfigs(t *testing.T) {
	testenv.RequireNodepool(t)
	for _, pair := range ourPairs(t) {
		t.Run(pair.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cfg, err := Load(Files{Nodepool: pair.nodepool, Builder: pair.own})
			if err != nil {
				t.Fatal(err)
			}
			if len(cfg.Warnings) != 0 || len(cfg.ZuulImages) == 0 {
				t.Fatalf("warnings %q, %d zuul-images: want none and some", cfg.Warnings, len(cfg.ZuulImages))
			}
			env := cloudsFor(t, cfg)
			if log, err := testenv.NodepoolConfigValidate(ctx, pair.nodepool, env); err != nil {
				t.Fatalf("nodepool config-validate refuses %s: %v\n%s", pair.nodepool, err, log)
			}
			nc, err := testenv.NodepoolLoadConfig(ctx, pair.nodepool, env)
			if err != nil {
				t.Fatalf("nodepool's loadConfig fails on %s: %v", pair.nodepool, err)
			}
			booted := map[string]bool{}
			for _, p := range nc.Providers {
				for _, pool := range p.Pools {
					for _, image := range pool.Labels {
						booted[image] = true
					}
				}
			}
			bootable := 0
			for _, zi := range cfg.ZuulImages {
				d, ok := nc.Diskimages[zi.Name]
				if !ok || !d.Pause || d.Elements != "" {
					t.Errorf("zuul-image %s is, to nodepool, %+v (declared %v); want a paused diskimage with no elements", zi.Name, d, ok)
				}
				if d.Username != zi.Username || d.PythonPath != zi.PythonPath || d.ShellType != zi.ShellType {
					t.Errorf("zuul-image %s connects, to nodepool, as %q %q %q; the builder records %q %q %q", zi.Name,
						d.Username, d.PythonPath, d.ShellType, zi.Username, zi.PythonPath, zi.ShellType)
				}
				if booted[zi.Name] {
					bootable++
				}
			}
			if bootable == 0 {
				t.Errorf("no label of a launcher's pool boots a zuul-image: %+v", nc.Providers)
			}
			for _, p := range cfg.Providers {
				np, ok := nc.Providers[p.Name]
				if !ok || np.Driver != "openstack" {
					t.Errorf("provider %s is, to nodepool, %+v", p.Name, np)
					continue
				}
				for _, pi := range p.DiskImages {
					if got, ok := np.Diskimages[pi.Name]; !ok || got.Pause != pi.Pause {
						t.Errorf("provider %s lists %s to nodepool as %+v (%v), to the builder as %+v", p.Name, pi.Name, got, ok, pi)
					}
				}
				if want := p.Format(); np.ImageType != want {
					t.Errorf("provider %s takes %s to nodepool, %s to the builder", p.Name, np.ImageType, want)
				}
			}
			var ours []string
			for _, name := range cfg.ImageNames() {
				ours = append(ours, name)
			}
			for name := range nc.Diskimages {
				if !slices.Contains(ours, name) {
					t.Errorf("nodepool has diskimage %s, which the builder does not make", name)
				}
			}
		})
	}
}

// TestNodepoolRefusesOneFile: what the one-file layout's warning says is
// so: nodepool's config-validate refuses zuul-images and builder in
// nodepool.yaml, and nodepool's loadConfig, what nodepool-launcher runs,
// fails on a provider that names an undeclared zuul-image.
func TestNodepoolRefusesOneFile(t *testing.T) {
	testenv.RequireNodepool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	path := filepath.Join("testdata", "one-file.yaml")
	cfg, err := Load(Files{Nodepool: path})
	if err != nil {
		t.Fatal(err)
	}
	env := cloudsFor(t, cfg)
	log, err := testenv.NodepoolConfigValidate(ctx, path, env)
	if err == nil || !strings.Contains(log, "extra keys not allowed") {
		t.Errorf("nodepool config-validate of a one-file config: %v, want it refused for extra keys\n%s", err, log)
	}
	_, err = testenv.NodepoolLoadConfig(ctx, path, env)
	if err == nil || !strings.Contains(err.Error(), "KeyError: 'debian-bookworm'") {
		t.Errorf("nodepool's loadConfig of a one-file config: %v, want KeyError: 'debian-bookworm'", err)
	}
}

// nodepoolServers is a ZooKeeper cluster written as nodepool hands it to its
// client: host:port and the chroot, for each server.
func nodepoolServers(zk *ZooKeeper) string {
	if zk == nil {
		return ""
	}
	var hosts []string
	for _, s := range zk.Servers {
		hosts = append(hosts, fmt.Sprintf("%s:%d%s", s.Host, s.Port, s.Chroot))
	}
	return strings.Join(hosts, ",")
}

// TestNodepoolReadsTheSecureFileAsWeDo: on the same nodepool.yaml and secure
// file, nodepool's own loader (loadConfig, then loadSecureConfig, as its
// builder and launcher run them with -s) and ours take the same ZooKeeper
// servers, the same zookeeper-tls and the same env-vars of every diskimage;
// and what nodepool's loader refuses in a secure file, ours refuses.
func TestNodepoolReadsTheSecureFileAsWeDo(t *testing.T) {
	testenv.RequireNodepool(t)
	const main = `images-dir: /opt/images
build-log-dir: /opt/logs
%s
diskimages:
  - name: base
    abstract: true
    elements: [vm]
    env-vars: {FROM_BASE: b, SHARED: base}
  - name: debian
    parent: base
    env-vars: {DIB_RELEASE: bookworm, SHARED: debian}
  - name: ubuntu
    elements: [ubuntu-minimal]
  - name: ubuntu-child
    parent: ubuntu
`
	const mainZK = `zookeeper-servers:
  - host: zk-main.example.com
    port: 2181
    chroot: /main
zookeeper-tls:
  cert: /main/cert.pem
  key: /main/key.pem
  ca: /main/ca.pem`
	pairs := []struct {
		name, zk, secure string
		nodepool         string // "": main with zk
		refused          bool   // by both loaders
	}{
		{name: "the docs' example", nodepool: docsExample(t, "nodepool.yaml"), secure: docsExample(t, "secure.conf")},
		{name: "servers only in the secure file", secure: `zookeeper-servers:
  - host: zk1.example.com
    chroot: /nodepool
  - host: zk2.example.com
    port: 2282
    chroot: /nodepool
zookeeper-tls:
  cert: /s/cert.pem
  key: /s/key.pem
  ca: /s/ca.pem
`},
		{name: "servers in both", zk: mainZK, secure: "zookeeper-servers:\n  - host: zk1.example.com\n    port: 2182\n"},
		{name: "an empty server list", zk: mainZK, secure: "zookeeper-servers: []\ndiskimages: []\n"},
		{name: "tls in the secure file", zk: mainZK, secure: "zookeeper-tls:\n  cert: /s/cert.pem\n  key: /s/key.pem\n  ca: /s/ca.pem\n"},
		{name: "an empty tls section", zk: mainZK, secure: "zookeeper-tls: {}\n"},
		{name: "env-vars merge", zk: mainZK, secure: `diskimages:
  - name: debian
    env-vars:
      SHARED: secure
      DIB_PASSWORD: '%(NODEPOOL_DIB_PASSWORD)'
  - name: ubuntu
    env-vars: {A: '1', B: '1'}
  - name: ubuntu
    env-vars: {B: '2'}
`},
		{name: "an unknown diskimage", zk: mainZK, secure: "diskimages:\n  - {name: fedora, env-vars: {A: b}}\n", refused: true},
		{name: "an abstract diskimage", zk: mainZK, secure: "diskimages:\n  - {name: base, env-vars: {A: b}}\n", refused: true},
		{name: "a diskimage without env-vars", zk: mainZK, secure: "diskimages:\n  - name: debian\n", refused: true},
	}
	t.Setenv("NODEPOOL_DIB_PASSWORD", "from-the-environment")
	for _, pair := range pairs {
		t.Run(pair.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			dir := t.TempDir()
			nodepool := pair.nodepool
			if nodepool == "" {
				nodepool = fmt.Sprintf(main, pair.zk)
			}
			files := Files{
				Nodepool: writeConfigFile(t, filepath.Join(dir, "nodepool.yaml"), nodepool),
				Secure:   writeConfigFile(t, filepath.Join(dir, "secure.conf"), pair.secure),
			}
			cfg, err := Load(files)
			env := []string{"OS_CLIENT_CONFIG_FILE=" + writeConfigFile(t, filepath.Join(dir, "clouds.yaml"), "clouds: {}\n")}
			if err == nil {
				env = cloudsFor(t, cfg)
			}
			nc, npErr := testenv.NodepoolLoadSecureConfig(ctx, files.Nodepool, files.Secure, env)
			if pair.refused {
				if err == nil || npErr == nil {
					t.Fatalf("ours: %v; nodepool's: %v; want both to refuse the secure file", err, npErr)
				}
				var e *Error
				if !errors.As(err, &e) || e.File != files.Secure || e.Line == 0 {
					t.Errorf("our error %v does not name the secure file and a line", err)
				}
				return
			}
			if err != nil || npErr != nil {
				t.Fatalf("ours: %v; nodepool's: %v; want both to load the pair", err, npErr)
			}
			if len(cfg.Warnings) != 0 {
				t.Errorf("warnings %q, want none", cfg.Warnings)
			}
			if got := nodepoolServers(cfg.ZooKeeper); got != nc.ZooKeeperServers {
				t.Errorf("ZooKeeper servers: ours %q, nodepool's %q", got, nc.ZooKeeperServers)
			}
			var tls testenv.NodepoolZooKeeperTLS
			if cfg.ZooKeeper != nil && cfg.ZooKeeper.TLS != nil {
				tls = testenv.NodepoolZooKeeperTLS{Cert: cfg.ZooKeeper.TLS.Cert, Key: cfg.ZooKeeper.TLS.Key, CA: cfg.ZooKeeper.TLS.CA}
			}
			if tls != nc.ZooKeeperTLS {
				t.Errorf("zookeeper-tls: ours %+v, nodepool's %+v", tls, nc.ZooKeeperTLS)
			}
			if len(cfg.DiskImages) != len(nc.Diskimages) {
				t.Errorf("diskimages: ours %d, nodepool's %d", len(cfg.DiskImages), len(nc.Diskimages))
			}
			for _, d := range cfg.DiskImages {
				theirs := nc.Diskimages[d.Name].EnvVars
				if len(d.EnvVars) != 0 || len(theirs) != 0 {
					if !maps.Equal(d.EnvVars, theirs) {
						t.Errorf("env-vars of %s: ours %v, nodepool's %v", d.Name, d.EnvVars, theirs)
					}
				}
			}
		})
	}
}

// TestNodepoolRefusesWhatWeWarnOf: each key the builder loads with a warning
// that nodepool's config-validate refuses it is refused by nodepool 10's own
// validator, and the warning names the file, the line and the key.
func TestNodepoolRefusesWhatWeWarnOf(t *testing.T) {
	testenv.RequireNodepool(t)
	const provider = "images-dir: /opt/images\ndiskimages:\n  - name: debian\n    elements: [vm]\n" +
		"providers:\n  - name: cloud-a\n    cloud: cloud-a\n    diskimages:\n      - name: debian\n"
	tests := []struct {
		name, text, key string
		line            int
		warns           string
	}{
		{"hostname-format", provider + "    hostname-format: '{label.name}-{provider.name}-{node.id}'\n", "hostname-format", 10,
			"providers[0].hostname-format: is an older nodepool's key: nodepool 10 reads it nowhere, and its config-validate refuses it"},
		{"upload-script", provider + "    upload-script: /usr/local/bin/upload\n", "upload-script", 10,
			"providers[0].upload-script: is an older nodepool's key: nodepool 10 reads it nowhere, and its config-validate refuses it"},
		{"image-format", provider + "    image-format: raw\n", "image-format", 10,
			"providers[0].image-format: is not a key of nodepool 10's providers, and nodepool's config-validate refuses it"},
		{"shell-type", strings.Replace(provider, "elements: [vm]\n", "elements: [vm]\n    shell-type: csh\n", 1), "shell-type", 5,
			"diskimages[0].shell-type: nodepool's launcher reads it, but nodepool 10's config-validate refuses it"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			path := writeConfigFile(t, filepath.Join(t.TempDir(), "nodepool.yaml"), tt.text)
			cfg, err := Load(Files{Nodepool: path})
			if err != nil {
				t.Fatal(err)
			}
			if want := fmt.Sprintf("%s:%d: %s", path, tt.line, tt.warns); len(cfg.Warnings) != 1 || !strings.HasPrefix(cfg.Warnings[0], want) {
				t.Errorf("warnings %q, want one starting %q", cfg.Warnings, want)
			}
			log, err := testenv.NodepoolConfigValidate(ctx, path, cloudsFor(t, cfg))
			// e.g. "extra keys not allowed @ data['diskimages'][0]['shell-type']"
			if want := regexp.MustCompile(`extra keys not allowed @ data\S*\['` + tt.key + `'\]`); err == nil || !want.MatchString(log) {
				t.Errorf("nodepool config-validate: %v, want it to refuse the file with %q\n%s", err, want, log)
			}
		})
	}
}
