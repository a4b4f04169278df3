package config

import (
	"fmt"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"gopkg.in/yaml.v3"
)

// TestMain fails the tests when a reader read a key that the mapping it read
// from does not list: a key that no table lists, which reads nothing.
func TestMain(m *testing.M) {
	var mu sync.Mutex
	unlisted := map[string]bool{}
	unlistedRead = func(path, key string) {
		mu.Lock()
		defer mu.Unlock()
		unlisted[childPath(path, key)] = true
	}
	code := m.Run()
	if len(unlisted) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: keys read that their mapping does not list (add them to their section's table): %s\n",
			strings.Join(slices.Sorted(maps.Keys(unlisted)), ", "))
		code = 1
	}
	os.Exit(code)
}

// TestEveryRowReads: every row of a table whose key the builder reads sets
// something of the entry from a good value, and, where the key is
// inherited, laying it over the defaults changes them; the rows of keys the
// builder ignores read nothing.
func TestEveryRowReads(t *testing.T) {
	checkRows(t, "builder", builderTable, defaultBuilder, map[string]string{
		"poll-interval":              "30",
		"upload-workers":             "8",
		"keep-builds":                "3",
		"keep-uploads":               "3",
		"upload-attempts":            "2",
		"state-db":                   "/var/lib/nodepool/state.db",
		"gearman-servers":            "[{host: gearman.example.com}]",
		"leak-sweep":                 "false",
		"max-image-size":             "64G",
		"gearman-unserved-after":     "10",
		"download-connections":       "4",
		"webapp":                     "{port: 9100}",
		"gearman-functions":          "[image-build]",
		"gearman-min-build-interval": "0",
		"zuul-mqtt":                  "{url: 'mqtt://mqtt.example.com'}",
		"build-diskimages":           "false",
		"nat64-prefixes":             "['2001:db8:64::/96']",
		"providers":                  "[{name: cloud-a, upload-method: glance-direct}]",
	})
	// An entry without a name is not read further.
	checkRows(t, "builder.providers[0]", builderProviderTable, func() BuilderProvider {
		bp := defaults(builderProviderTable)
		bp.Name = "named"
		return bp
	}, map[string]string{"name": "cloud-a", "upload-method": "glance-direct"})
	checkRows(t, "builder.webapp", builderWebappTable, func() Webapp { return defaults(builderWebappTable) },
		map[string]string{"listen-address": "127.0.0.2", "port": "9100", "host-names": "[builder.example.com]"})
	checkRows(t, "zuul-images[0]", zuulImageTable, func() ZuulImage { return defaults(zuulImageTable) }, map[string]string{
		"name":                   "debian",
		"api-url":                "https://zuul.example.com/",
		"tenant":                 "main",
		"project":                "org/images",
		"branch":                 "master",
		"pipelines":              "[periodic]",
		"job":                    "build-debian",
		"poll-interval":          "30",
		"auth-token-file":        "/etc/nodepool/zuul-token",
		"ca-cert":                "/etc/nodepool/zuul-ca.pem",
		"require-checksum":       "true",
		"formats":                "[raw]",
		"artifacts":              "[{format: qcow2, type: image-qcow}]",
		"pause":                  "true",
		"metadata":               "{os_distro: debian}",
		"allow-unmerged-changes": "true",
		"artifact-hosts":         "[logs.example.com]",
	})
	checkRows(t, "zuul-images[0].artifacts[0]", artifactTable, func() artifactEntry { return defaults(artifactTable) },
		map[string]string{"format": "qcow2", "type": "image-qcow", "name": "debian.qcow2"})
	names := imageNames{"debian": {kind: "diskimage"}}
	checkRows(t, "providers[0]", providerTable, func() providerEntry {
		e := defaults(providerTable)
		e.names = names
		return e
	}, map[string]string{
		"name":                 "cloud-a",
		"cloud":                "mycloud",
		"region-name":          "RegionOne",
		"image-format":         "raw",
		"image-name-format":    "'{image_name}-{build_id}'",
		"image-upload-timeout": "60",
		"post-upload-hook":     "/usr/local/bin/check-upload",
		"rate":                 "0.5",
		"diskimages":           "[{name: debian}]",
	}, keyDriver)
	checkRows(t, "providers[0].diskimages[0]", providerImageTable, func() ProviderImage { return defaults(providerImageTable) },
		map[string]string{"name": "debian", "pause": "true", "meta": "{hw_disk_bus: scsi}"})
	checkRows(t, "", topTable, func() Config { return defaults(topTable) }, map[string]string{
		"images-dir":          "/var/lib/nodepool/images",
		"build-log-dir":       "/var/log/nodepool/other",
		"build-log-retention": "-1",
		"elements-dir":        "/etc/nodepool/elements",
		"webapp":              "{port: 9005}",
	}, keyDiskImages, keyProviders, keyZooKeeperServers, keyZooKeeperTLS, keyZooKeeperTimeout)
	checkRows(t, "", ownTable, func() Config { return Config{Builder: defaultBuilder()} },
		map[string]string{"builder": "{keep-builds: 3}"}, keyZuulImages)
	checkRows(t, "webapp", launcherWebappTable, func() Webapp { return defaults(launcherWebappTable) },
		map[string]string{"listen_address": "127.0.0.1", "port": "9005"})
	checkRows(t, "zookeeper-servers[0]", zkServerTable, func() zkServerEntry { return defaults(zkServerTable) },
		map[string]string{"host": "zk.example.com", "port": "2181", "chroot": "/nodepool"})
	checkRows(t, "zookeeper-tls", zkTLSTable, func() ZooKeeperTLS { return defaults(zkTLSTable) },
		map[string]string{"cert": "/etc/nodepool/zk.crt", "key": "/etc/nodepool/zk.key", "ca": "/etc/nodepool/zk-ca.pem"})
	checkRows(t, "diskimages[0]", secureDiskImageTable, func() secureImage { return defaults(secureDiskImageTable) },
		map[string]string{"name": "debian", "env-vars": "{DIB_PASSWORD: secret}"})
	checkRows(t, "builder.gearman-servers[0]", gearmanServerTable, func() GearmanServer { return defaults(gearmanServerTable) },
		map[string]string{"host": "gearman.example.com", "port": "4731"})
	checkRows(t, "builder.zuul-mqtt", zuulMQTTTable, func() ZuulMQTT { return defaults(zuulMQTTTable) }, map[string]string{
		"url":           "mqtts://mqtt.example.com",
		"topics":        "['zuul/+/post/#']",
		"username":      "nodepool",
		"password-file": "/etc/nodepool/mqtt.pw",
		"ca-cert":       "/etc/nodepool/mqtt-ca.pem",
		"client-cert":   "/etc/nodepool/mqtt.crt",
		"client-key":    "/etc/nodepool/mqtt.key",
	})
	// An entry is read as written, from nothing; what it lays is laid over
	// the defaults.
	checkRows(t, "diskimages[0]", diskImageTable, func() diskImageEntry { return diskImageEntry{} }, map[string]string{
		"name":                "debian",
		"abstract":            "true",
		"parent":              "base",
		"elements":            "[vm]",
		"env-vars":            "{DIB_RELEASE: bookworm}",
		"formats":             "[raw]",
		"keep-formats":        "[qcow2]",
		"delete-after-upload": "true",
		"release":             "12",
		"rebuild-age":         "3600",
		"build-timeout":       "600",
		"pause":               "true",
		"dib-cmd":             "/opt/dib/bin/disk-image-create",
		"username":            "root",
		"python-path":         "/usr/bin/python3",
		"shell-type":          "csh",
		"metadata":            "{os_distro: debian}",
	})
}

// checkRows reads samples[key] (YAML) with each row of table into start()
// and checks that it reads without error and sets something. The keys of
// readElsewhere are read before their entry is (isOpenStack reads driver).
func checkRows[T any](t *testing.T, section string, table []spec[T], start func() T, samples map[string]string, readElsewhere ...string) {
	t.Helper()
	for _, s := range table {
		at := section + "." + s.key
		sample, has := samples[s.key]
		switch {
		case s.owner == launchers || s.owner == older:
			if s.read != nil || s.lay != nil || has {
				t.Errorf("%s: the builder ignores it, but its row reads it or it has a sample", at)
			}
			continue
		case s.read == nil:
			if !slices.Contains(readElsewhere, s.key) {
				t.Errorf("%s: its row reads nothing", at)
			}
			continue
		case !has:
			t.Errorf("%s: no sample value to read", at)
			continue
		}
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(s.key+": "+sample), &doc); err != nil {
			t.Fatalf("%s: sample %q: %v", at, sample, err)
		}
		p := &parser{file: "test.yaml"}
		m, ok := p.readMapping(doc.Content[0], section, "a test mapping", keys(table), true)
		if !ok {
			t.Fatalf("%s: %v", at, p.errs)
		}
		v := start()
		readInto(m, []spec[T]{s}, &v)
		if len(p.errs) > 0 {
			t.Errorf("%s: reading %s: %v", at, sample, p.errs)
			continue
		}
		if reflect.DeepEqual(v, start()) {
			t.Errorf("%s: reading %s sets nothing", at, sample)
		}
		if s.lay != nil {
			into := defaults(table)
			if s.lay(&into, &v); reflect.DeepEqual(into, defaults(table)) {
				t.Errorf("%s: laying %s over the defaults changes nothing", at, sample)
			}
		}
	}
	for key := range samples {
		if _, ok := specOf(table, key); !ok {
			t.Errorf("%s: a sample for %s, which no row lists", section, key)
		}
	}
}
