package config

import (
	"context"
	"fmt"
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
