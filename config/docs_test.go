package config

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
)

// TestDocsNameEveryKey keeps docs/configuration.md from drifting away from the
// keys the parser knows: each key list the parser checks mappings against is
// named, key by key, under the heading of its section.
func TestDocsNameEveryKey(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	sections := []struct {
		heading string
		keys    []string
	}{
		{"## `nodepool.yaml` top level", keys(topTable)},
		{"### `webapp`", keys(launcherWebappTable)},
		{"## `diskimages`", keys(diskImageTable)},
		{"### Declaring a zuul-image", keysWhere(diskImageTable, func(s spec[diskImageEntry]) bool { return s.declares })},
		{"## `providers`", keys(providerTable)},
		{"### A provider's `diskimages`", keys(providerImageTable)},
		{"### `zookeeper-servers`", keys(zkServerTable)},
		{"### `zookeeper-tls`", keys(zkTLSTable)},
		{"## The secure file", slices.Concat(secureKeys, keys(secureDiskImageTable))},
		{"## `zuul-images`", keys(zuulImageTable)},
		{"### `artifacts`", keys(artifactTable)},
		{"## `builder`", keys(builderTable)},
		{"### `builder.gearman-servers`", keys(gearmanServerTable)},
		{"### `builder.providers`", keys(builderProviderTable)},
		{"### `builder.webapp`", keys(builderWebappTable)},
		{"### `builder.zuul-mqtt`", keys(zuulMQTTTable)},
	}
	for _, s := range sections {
		sec, ok := testenv.MarkdownSection(doc, s.heading)
		if !ok {
			t.Errorf("docs/configuration.md has no heading %q", s.heading)
			continue
		}
		for _, key := range s.keys {
			if !strings.Contains(sec, "`"+key+"`") {
				t.Errorf("docs/configuration.md, %s: key %s is not named (write it as `%s`)", s.heading, key, key)
			}
		}
	}
	// The top-level keys of the builder's own file are sections of their own.
	for _, key := range keys(ownTable) {
		if !strings.Contains(doc, "\n## `"+key+"`\n") {
			t.Errorf("docs/configuration.md has no section ## `%s`", key)
		}
	}
}
