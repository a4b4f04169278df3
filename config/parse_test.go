package config

import (
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"
)

func noEnv(string) (string, bool) { return "", false }

func parse(text string) (*Config, error) {
	return Parse("nodepool.yaml", []byte(text), noEnv)
}

// parseFiles parses nodepool.yaml and the builder's own file.
func parseFiles(nodepool, own string) (*Config, error) {
	return ParseFiles(Text{Name: "nodepool.yaml", Data: []byte(nodepool)},
		&Text{Name: "nodepool-builder.yaml", Data: []byte(own)}, nil, noEnv)
}

func mustParseFiles(t *testing.T, nodepool, own string) *Config {
	t.Helper()
	cfg, err := parseFiles(nodepool, own)
	if err != nil {
		t.Fatalf("ParseFiles: %v", err)
	}
	return cfg
}

func mustParse(t *testing.T, text string) *Config {
	t.Helper()
	cfg, err := parse(text)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return cfg
}

// wantError checks that err holds an *Error at line and path whose message
// contains msg, and that it prints as "nodepool.yaml:line: path: ...".
func wantError(t *testing.T, err error, line int, path, msg string) {
	t.Helper()
	var es Errors
	if !errors.As(err, &es) {
		t.Fatalf("error %v (%T) is not an Errors", err, err)
	}
	for _, e := range es {
		if e.Line == line && e.Path == path && strings.Contains(e.Msg, msg) {
			prefix := fmt.Sprintf("nodepool.yaml:%d: ", line)
			if path != "" {
				prefix += path + ": "
			}
			if !strings.HasPrefix(e.Error(), prefix) {
				t.Errorf("error prints as %q, want prefix %q", e.Error(), prefix)
			}
			return
		}
	}
	t.Errorf("no error at line %d, path %q, containing %q; got:\n%v", line, path, msg, err)
}

const (
	head = "images-dir: /opt/images\n" // line 1 of every error case below
)

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		text string
		line int
		path string
		msg  string
	}{
		// Top level.
		{"top level not a mapping", "- a\n", 1, "", "expected a nodepool config"},
		{"images-dir not a string", "images-dir: [a]\n", 1, "images-dir", "expected a string, not a list"},
		{"images-dir twice", head + "images-dir: /b\n", 2, "images-dir", "appears twice in a nodepool config (first on line 1)"},
		{"images-dir missing with diskimages", "elements-dir: /e\ndiskimages:\n  - name: a\n", 2, "images-dir", "is required when diskimages are configured"},
		{"images-dir missing with zuul-images", "zuul-images:\n  - {name: z, api-url: 'https://z/', project: p, job: j}\n", 1, "images-dir", "is required when zuul-images are configured"},
		{"build-log-retention below -1", head + "build-log-retention: -2\n", 2, "build-log-retention", "must be -1 (keep all logs) or the number of logs"},
		{"build-log-retention decimal", head + "build-log-retention: 1.5\n", 2, "build-log-retention", "not the number 1.5"},
		{"webapp not a mapping", head + "webapp: 8005\n", 2, "webapp", "expected the webapp section"},
		{"webapp port too big", head + "webapp:\n  port: 70000\n", 3, "webapp.port", "must be a TCP port number from 1 to 65535, not 70000"},
		{"webapp port a string", head + "webapp:\n  port: http\n", 3, "webapp.port", `not "http"`},

		// diskimages.
		{"diskimages not a list", head + "diskimages:\n  name: a\n", 3, "diskimages", "expected a list of diskimages"},
		{"diskimage not a mapping", head + "diskimages:\n  - a\n", 3, "diskimages[0]", "expected a diskimage"},
		{"diskimage without name", head + "diskimages:\n  - elements: [vm]\n", 3, "diskimages[0].name", "is required; give every diskimage a name"},
		{"diskimage name a number", head + "diskimages:\n  - name: 12\n", 3, "diskimages[0].name", "quote it if it is meant as text: '12'"},
		{"diskimage name with slash", head + "diskimages:\n  - name: a/b\n", 3, "diskimages[0].name", "cannot be an image name"},
		{"diskimage name twice", head + "diskimages:\n  - name: a\n  - name: b\n  - name: a\n", 5, "diskimages[2].name", `"a" is defined twice (first on line 3 as a diskimage)`},
		{"diskimage key twice", head + "diskimages:\n  - name: a\n    pause: true\n    pause: false\n", 5, "diskimages[0].pause", "appears twice in a diskimage (first on line 4)"},
		{"unknown parent", head + "diskimages:\n  - name: a\n    parent: nope\n", 4, "diskimages[0].parent", `"nope" is not a diskimage`},
		{"parent cycle", head + "diskimages:\n  - name: a\n    parent: b\n  - name: b\n    parent: a\n", 4, "diskimages[0].parent", "parents form a cycle (a -> b -> a)"},
		{"own parent", head + "diskimages:\n  - name: a\n    parent: a\n", 4, "diskimages[0].parent", "parents form a cycle (a -> a)"},
		{"formats not a list", head + "diskimages:\n  - name: a\n    formats: qcow2\n", 4, "diskimages[0].formats", "expected a list of formats like [qcow2, raw]"},
		{"format not lowercase", head + "diskimages:\n  - name: a\n    formats: [raw, QCOW2]\n", 4, "diskimages[0].formats[1]", `"QCOW2" is not a format; formats are lowercase words`},
		{"keep-formats entry a number", head + "diskimages:\n  - name: a\n    keep-formats:\n      - 2\n", 5, "diskimages[0].keep-formats[0]", "the number 2 is not a format"},
		{"element not a string", head + "diskimages:\n  - name: a\n    elements:\n      - vm\n      - {x: y}\n", 6, "diskimages[0].elements[1]", "expected a list of diskimage-builder elements"},
		{"env-vars a list", head + "diskimages:\n  - name: a\n    env-vars: [A]\n", 4, "diskimages[0].env-vars", "expected a mapping of names to values"},
		{"env-var without value", head + "diskimages:\n  - name: a\n    env-vars:\n      DIB_X:\n", 5, "diskimages[0].env-vars.DIB_X", "has no value; write '' for an empty string"},
		{"env-var a list", head + "diskimages:\n  - name: a\n    env-vars:\n      DIB_X: [1]\n", 5, "diskimages[0].env-vars.DIB_X", "expected a string like DIB_RELEASE: bookworm, not a list"},
		{"env-var twice", head + "diskimages:\n  - name: a\n    env-vars:\n      A: x\n      A: y\n", 6, "diskimages[0].env-vars.A", "appears twice (first on line 5)"},
		{"release a boolean", head + "diskimages:\n  - name: a\n    release: true\n", 4, "diskimages[0].release", "expected a release name or number"},
		{"rebuild-age negative", head + "diskimages:\n  - name: a\n    rebuild-age: -5\n", 4, "diskimages[0].rebuild-age", "must be zero or a positive number of seconds"},
		{"rebuild-age text", head + "diskimages:\n  - name: a\n    rebuild-age: 1d\n", 4, "diskimages[0].rebuild-age", `not "1d"`},
		{"build-timeout zero", head + "diskimages:\n  - name: a\n    build-timeout: 0\n", 4, "diskimages[0].build-timeout", "must be a positive number of seconds"},
		{"pause not a boolean", head + "diskimages:\n  - name: a\n    pause: maybe\n", 4, "diskimages[0].pause", `expected true or false, not "maybe"`},
		{"quoted yes is not a boolean", head + "diskimages:\n  - name: a\n    delete-after-upload: 'yes'\n", 4, "diskimages[0].delete-after-upload", "expected true or false"},
		{"dib-cmd a number", head + "diskimages:\n  - name: a\n    dib-cmd: 5\n", 4, "diskimages[0].dib-cmd", "expected a string, not the number 5"},
		{"metadata a string", head + "diskimages:\n  - name: a\n    metadata: x\n", 4, "diskimages[0].metadata", "expected a mapping of names to values"},

		// zuul-images.
		{"zuul-images not a list", head + "zuul-images: x\n", 2, "zuul-images", "expected a list of zuul-images"},
		{"zuul-image unknown key", head + "zuul-images:\n  - name: z\n    api-url: https://z/\n    project: p\n    job: j\n    pipeline: post\n", 7, "zuul-images[0].pipeline", "unknown key in a zuul-images entry; did you mean pipelines?"},
		{"zuul-image without name", head + "zuul-images:\n  - api-url: https://z/\n    project: p\n    job: j\n", 3, "zuul-images[0].name", "is required"},
		{"zuul-image without api-url", head + "zuul-images:\n  - name: z\n    project: p\n    job: j\n", 3, "zuul-images[0].api-url", "is required; set it to the Zuul web root"},
		{"zuul-image without project", head + "zuul-images:\n  - name: z\n    api-url: https://z/\n    job: j\n", 3, "zuul-images[0].project", "is required"},
		{"zuul-image without job", head + "zuul-images:\n  - name: z\n    api-url: https://z/\n    project: p\n", 3, "zuul-images[0].job", "is required; name the Zuul job"},
		{"api-url not http", head + "zuul-images:\n  - name: z\n    api-url: ftp://z/\n    project: p\n    job: j\n", 4, "zuul-images[0].api-url", `"ftp://z/" is not an http or https URL`},
		{"api-url without host", head + "zuul-images:\n  - name: z\n    api-url: zuul.example.com\n    project: p\n    job: j\n", 4, "zuul-images[0].api-url", "is not an http or https URL"},
		{"zuul poll-interval zero", head + "zuul-images:\n  - {name: z, api-url: 'https://z/', project: p, job: j, poll-interval: 0}\n", 3, "zuul-images[0].poll-interval", "must be a positive number of seconds"},
		{"zuul pipelines a string", head + "zuul-images:\n  - {name: z, api-url: 'https://z/', project: p, job: j, pipelines: post}\n", 3, "zuul-images[0].pipelines", "expected a list of pipeline names like [periodic, post]"},
		{"zuul formats bad", head + "zuul-images:\n  - {name: z, api-url: 'https://z/', project: p, job: j, formats: [q c o w]}\n", 3, "zuul-images[0].formats[0]", "is not a format"},
		{"zuul name taken by a diskimage", head + "diskimages:\n  - {name: a, elements: [vm], pause: true}\nzuul-images:\n  - {name: a, api-url: 'https://z/', project: p, job: j}\n", 3, "diskimages[0].name", `"a" is a zuul-image (defined on line 5), so this entry declares it to nodepool, but it also holds diskimage-builder settings (elements)`},
		{"declaration without pause", head + "diskimages:\n  - {name: a}\nzuul-images:\n  - {name: a, api-url: 'https://z/', project: p, job: j}\n", 3, "diskimages[0].name", `declares zuul-image "a" to nodepool, and needs pause: true`},
		{"declaration twice", head + "diskimages:\n  - {name: a, pause: true}\n  - {name: a, pause: true}\nzuul-images:\n  - {name: a, api-url: 'https://z/', project: p, job: j}\n", 4, "diskimages[1].name", `zuul-image "a" is declared twice (first on line 3)`},
		{"declaration as a parent", head + "diskimages:\n  - {name: a, pause: true}\n  - {name: b, parent: a}\nzuul-images:\n  - {name: a, api-url: 'https://z/', project: p, job: j}\n", 4, "diskimages[1].parent", `"a" is a zuul-image, which is fetched from Zuul and cannot be a parent`},
		{"artifact without type", head + "zuul-images:\n  - name: z\n    api-url: https://z/\n    project: p\n    job: j\n    artifacts:\n      - format: raw\n", 8, "zuul-images[0].artifacts[0].type", "is required; give the artifact metadata.type"},
		{"artifact without format", head + "zuul-images:\n  - name: z\n    api-url: https://z/\n    project: p\n    job: j\n    artifacts:\n      - type: image-raw\n", 8, "zuul-images[0].artifacts[0].format", "is required"},
		{"artifact unknown key", head + "zuul-images:\n  - name: z\n    api-url: https://z/\n    project: p\n    job: j\n    artifacts:\n      - format: raw\n        type: image-raw\n        url: x\n", 10, "zuul-images[0].artifacts[0].url", "unknown key in an artifacts entry; known keys are format, type, name"},
		{"artifact format twice", head + "zuul-images:\n  - name: z\n    api-url: https://z/\n    project: p\n    job: j\n    artifacts:\n      - {format: qcow2, type: a}\n      - {format: qcow, type: b}\n", 9, "zuul-images[0].artifacts[1].format", "qcow2 is mapped twice (first on line 8)"},
		{"artifact-hosts a string", head + "zuul-images:\n  - name: z\n    api-url: https://z/\n    project: p\n    job: j\n    artifact-hosts:  logs.example.com\n", 7, "zuul-images[0].artifact-hosts", "expected a list of host names or addresses like [logs.example.com"},
		{"artifact-hosts empty", head + "zuul-images:\n  - name: z\n    api-url: https://z/\n    project: p\n    job: j\n    artifact-hosts:  []\n", 7, "zuul-images[0].artifact-hosts", "is empty, so no artifact could be fetched; list the hosts, or remove the key"},
		{"artifact-hosts entry a mapping", head + "zuul-images:\n  - name: z\n    api-url: https://z/\n    project: p\n    job: j\n    artifact-hosts: \n      - logs.example.com\n      - {host: x}\n", 9, "zuul-images[0].artifact-hosts[1]", "expected a host name or address"},
		{"artifact-hosts bare wildcard", head + "zuul-images:\n  - name: z\n    api-url: https://z/\n    project: p\n    job: j\n    artifact-hosts: \n      - logs.example.com\n      - '*'\n", 9, "zuul-images[0].artifact-hosts[1]", `"*": "*" is not a host name`},
		{"artifact-hosts bad port", head + "zuul-images:\n  - name: z\n    api-url: https://z/\n    project: p\n    job: j\n    artifact-hosts:  ['logs.example.com:99999']\n", 7, "zuul-images[0].artifact-hosts[0]", "is not a number from 1 to 65535; write a host name, an IP address or *.domain, optionally with :port"},
		{"artifact-hosts a URL", head + "zuul-images:\n  - name: z\n    api-url: https://z/\n    project: p\n    job: j\n    artifact-hosts:  ['https://logs.example.com/']\n", 7, "zuul-images[0].artifact-hosts[0]", "write a host name, an IP address or *.domain"},

		// providers.
		{"providers not a list", head + "providers: {name: a}\n", 2, "providers", "expected a list of providers"},
		{"provider not a mapping", head + "providers:\n  - cloud-a\n", 3, "providers[0]", "expected a provider"},
		{"provider without name", head + "providers:\n  - cloud: c\n", 3, "providers[0].name", "is required; give every provider a name"},
		{"other driver without name", head + "providers:\n  - driver: aws\n    region-name: us-west-2\n", 3, "providers[0].name", "is required; give every provider a name"},
		{"provider without cloud", head + "providers:\n  - name: a\n", 3, "providers[0].cloud", "is required; name the clouds.yaml entry"},
		{"provider cloud empty", head + "providers:\n  - name: a\n    cloud:\n", 4, "providers[0].cloud", "is required"},
		{"builder unknown key merged in", head + "defaults: &d {keep-builds: 3, keep: 1}\nbuilder:\n  <<: *d\n", 2, "builder.keep", "unknown key in the builder section"},
		{"provider cloud a list", head + "providers:\n  - name: a\n    cloud: [c]\n", 4, "providers[0].cloud", "expected a string, not a list"},
		{"provider name twice", head + "providers:\n  - {name: a, cloud: c}\n  - {name: a, cloud: d}\n", 4, "providers[1].name", `provider "a" is defined twice (first on line 3)`},
		{"driver not a string", head + "providers:\n  - name: a\n    driver: [x]\n", 4, "providers[0].driver", "expected a string"},
		{"image-format bad", head + "providers:\n  - {name: a, cloud: c, image-format: Raw}\n", 3, "providers[0].image-format", `"Raw" is not a format`},
		{"image-name-format unknown field", head + "providers:\n  - {name: a, cloud: c, image-name-format: '{image}-{timestamp}'}\n", 3, "providers[0].image-name-format", "uses {image}, which is not a placeholder; use {image_name}, {timestamp}, {upload_id}, {build_id}"},
		{"image-name-format open brace", head + "providers:\n  - {name: a, cloud: c, image-name-format: '{image_name'}\n", 3, "providers[0].image-name-format", "'{' without a closing '}'"},
		{"image-name-format close brace", head + "providers:\n  - {name: a, cloud: c, image-name-format: 'x}'}\n", 3, "providers[0].image-name-format", "'}' without an opening '{'"},
		{"image-name-format format spec", head + "providers:\n  - {name: a, cloud: c, image-name-format: '{timestamp:08d}'}\n", 3, "providers[0].image-name-format", "uses {timestamp:08d}"},
		{"image-upload-timeout negative", head + "providers:\n  - {name: a, cloud: c, image-upload-timeout: -1}\n", 3, "providers[0].image-upload-timeout", "must be a positive number of seconds"},
		{"rate text", head + "providers:\n  - {name: a, cloud: c, rate: fast}\n", 3, "providers[0].rate", "must be a number of seconds to wait between API calls"},
		{"provider diskimages not a list", head + "providers:\n  - {name: a, cloud: c, diskimages: x}\n", 3, "providers[0].diskimages", "expected a list of images"},
		{"provider image unknown", head + "diskimages:\n  - name: right\nproviders:\n  - name: a\n    cloud: c\n    diskimages:\n      - name: right\n      - name: wrong\n", 9, "providers[0].diskimages[1].name", `"wrong" is not a diskimage; define it under diskimages`},
		{"provider image abstract", head + "diskimages:\n  - name: base\n    abstract: true\nproviders:\n  - name: a\n    cloud: c\n    diskimages:\n      - name: base\n", 9, "providers[0].diskimages[0].name", `"base" is an abstract diskimage`},
		{"provider image twice", head + "diskimages:\n  - name: d\nproviders:\n  - name: a\n    cloud: c\n    diskimages:\n      - name: d\n      - name: d\n", 9, "providers[0].diskimages[1].name", `"d" is listed twice in this provider (first on line 8)`},
		{"provider image without name", head + "providers:\n  - name: a\n    cloud: c\n    diskimages:\n      - pause: true\n", 6, "providers[0].diskimages[0].name", "is required; name a diskimage or zuul-image"},
		{"provider image meta a list", head + "diskimages:\n  - name: d\nproviders:\n  - name: a\n    cloud: c\n    diskimages:\n      - name: d\n        meta: [x]\n", 9, "providers[0].diskimages[0].meta", "expected a mapping of names to values like {hw_disk_bus: scsi}"},
		{"provider image pause text", head + "diskimages:\n  - name: d\nproviders:\n  - name: a\n    cloud: c\n    diskimages:\n      - name: d\n        pause: sometimes\n", 9, "providers[0].diskimages[0].pause", "expected true or false"},

		// builder.
		{"builder not a mapping", head + "builder: [a]\n", 2, "builder", "expected the builder section"},
		{"builder unknown key", head + "builder:\n  keep-build: 3\n", 3, "builder.keep-build", "unknown key in the builder section; did you mean keep-builds?"},
		{"builder keep-builds zero", head + "builder:\n  keep-builds: 0\n", 3, "builder.keep-builds", "must be a number of ready builds to keep per image, 1 or more, not 0"},
		{"builder keep-uploads zero", head + "builder:\n  keep-uploads: 0\n", 3, "builder.keep-uploads", "1 or more, not 0"},
		{"builder upload-workers text", head + "builder:\n  upload-workers: many\n", 3, "builder.upload-workers", "must be a number of concurrent uploads"},
		{"builder max-image-size unit", head + "builder:\n  max-image-size: 64X\n", 3, "builder.max-image-size", "like 64G"},
		{"zookeeper server without host", head + "zookeeper-servers:\n  - port: 2181\n", 3, "zookeeper-servers[0].host", "name the ZooKeeper server"},
		{"zookeeper chroot", head + "zookeeper-servers:\n  - host: zk\n    chroot: nodepool\n", 4, "zookeeper-servers[0].chroot", "write it like /nodepool"},
		{"zookeeper tls without key", head + "zookeeper-tls:\n  cert: c\n  ca: a\n", 3, "zookeeper-tls.key", "PEM file"},
		{"builder max-image-size zero", head + "builder:\n  max-image-size: 0\n", 3, "builder.max-image-size", "a size in bytes"},
		{"builder upload-attempts negative", head + "builder:\n  upload-attempts: -1\n", 3, "builder.upload-attempts", "a number of tries per upload"},
		{"builder poll-interval zero", head + "builder:\n  poll-interval: 0\n", 3, "builder.poll-interval", "must be a positive number of seconds"},
		{"builder leak-sweep text", head + "builder:\n  leak-sweep: sometimes\n", 3, "builder.leak-sweep", "expected true or false"},
		{"builder state-db a number", head + "builder:\n  state-db: 1\n", 3, "builder.state-db", "expected a string"},
		{"gearman server without host", head + "builder:\n  gearman-servers:\n    - port: 4730\n", 4, "builder.gearman-servers[0].host", "is required"},
		{"gearman port zero", head + "builder:\n  gearman-servers:\n    - host: g\n      port: 0\n", 5, "builder.gearman-servers[0].port", "must be a TCP port number"},
		{"gearman unknown key", head + "builder:\n  gearman-servers:\n    - host: g\n      ssl: true\n", 5, "builder.gearman-servers[0].ssl", "unknown key in a gearman server; known keys are host, port"},
		{"gearman-servers a mapping", head + "builder:\n  gearman-servers: {host: g}\n", 3, "builder.gearman-servers", "expected a list of gearman servers"},
		{"top-level gearman server without host", head + "gearman-servers:\n  - port: 4730\n", 3, "gearman-servers[0].host", "is required"},
		{"download-connections zero", head + "builder:\n  download-connections: 0\n", 3, "builder.download-connections", "a number of connections per download, 1 to 64"},
		{"gearman-unserved-after zero", head + "builder:\n  gearman-unserved-after: 0\n", 3, "builder.gearman-unserved-after", "must be a positive number of seconds"},
		{"gearman-functions unknown", head + "builder:\n  gearman-functions: [image-build, image-destroy]\n", 3, "builder.gearman-functions[1]", `"image-destroy" is not a gearman function of the builder; they are image-build, image-upload, image-delete`},
		{"gearman-functions with an image", head + "builder:\n  gearman-functions:\n    - image-build:debian\n", 4, "builder.gearman-functions[0]", `"image-build:debian" is not a gearman function`},
		{"gearman-functions empty", head + "builder:\n  gearman-functions: []\n", 3, "builder.gearman-functions", "lists no gearman function; list one or more of image-build, image-upload, image-delete"},
		{"gearman-functions a string", head + "builder:\n  gearman-functions: image-build\n", 3, "builder.gearman-functions", "expected a list of gearman function kinds like [image-build, image-upload]"},
		{"gearman-min-build-interval negative", head + "builder:\n  gearman-min-build-interval: -1\n", 3, "builder.gearman-min-build-interval", "zero or a positive number of seconds"},
		{"builder webapp not a mapping", head + "builder:\n  webapp: 8006\n", 3, "builder.webapp", "expected the builder's webapp section"},
		{"builder webapp port too big", head + "builder:\n  webapp:\n    port: 70000\n", 4, "builder.webapp.port", "must be a TCP port number from 1 to 65535, not 70000"},
		{"builder webapp port a string", head + "builder:\n  webapp:\n    port: http\n", 4, "builder.webapp.port", `not "http"`},
		{"builder webapp address a list", head + "builder:\n  webapp:\n    listen-address: [a]\n", 4, "builder.webapp.listen-address", "expected a string, not a list"},
		{"builder webapp with nodepool's spelling", head + "builder:\n  webapp:\n    listen_address: 127.0.0.1\n", 4, "builder.webapp.listen_address", "unknown key in the builder's webapp section; did you mean listen-address?"},
		{"builder webapp host name with a port", head + "builder:\n  webapp:\n    host-names: [builder.example.com:8006]\n", 4, "builder.webapp.host-names[0]", `"builder.example.com:8006" is not a host name`},
		{"builder webapp host names a string", head + "builder:\n  webapp:\n    host-names: builder.example.com\n", 4, "builder.webapp.host-names", "expected a list of host names"},
		{"nat64-prefixes a string", head + "builder:\n  nat64-prefixes: '2001:db8:64::/96'\n", 3, "builder.nat64-prefixes", "expected a list of IPv6 prefixes like ['2001:db8:64::/96']"},
		{"nat64-prefixes an address", head + "builder:\n  nat64-prefixes: ['2001:db8:64::']\n", 3, "builder.nat64-prefixes[0]", `no '/'; write the prefix of your DNS64`},
		{"nat64-prefixes IPv4", head + "builder:\n  nat64-prefixes: [192.0.2.0/24]\n", 3, "builder.nat64-prefixes[0]", "192.0.2.0/24 is not an IPv6 prefix"},
		{"nat64-prefixes a length RFC 6052 lacks", head + "builder:\n  nat64-prefixes:\n    - 64:ff9b:1::/80\n", 4, "builder.nat64-prefixes[0]", "64:ff9b:1::/80 is /80; a NAT64 prefix is /32, /40, /48, /56, /64 or /96 (RFC 6052)"},
		{"nat64-prefixes host bits", head + "builder:\n  nat64-prefixes: ['2001:db8:64::1/96']\n", 3, "builder.nat64-prefixes[0]", "has bits set past /96; write 2001:db8:64::/96"},
		{"nat64-prefixes link-local", head + "builder:\n  nat64-prefixes: ['fe80::/64']\n", 3, "builder.nat64-prefixes[0]", "fe80::/64 overlaps fe80::/10, which is never a NAT64 prefix"},
		{"nat64-prefixes a number", head + "builder:\n  nat64-prefixes: [64]\n", 3, "builder.nat64-prefixes[0]", "expected an IPv6 prefix"},

		// Text level.
		{"unset variable", head + "webapp:\n  port: %(NODEPOOL_PORT)\n", 3, "webapp.port", "environment variable NODEPOOL_PORT is not set"},
		{"unset variable in a list", head + "diskimages:\n  - name: a\n    elements:\n      - vm\n      - %(NODEPOOL_ELEMENT)\n", 6, "diskimages[0].elements[1]", "NODEPOOL_ELEMENT is not set"},
		{"syntax error", head + "diskimages:\n  - name: a\n elements: [vm]\n", 4, "diskimages", "YAML syntax error: did not find expected key"},
		{"unclosed flow list", head + "diskimages:\n  - name: a\n    elements: [vm\n", 4, "diskimages", "YAML syntax error"},
		{"tab indentation", head + "builder:\n\tkeep-builds: 3\n", 3, "builder", "indent with spaces"},
		{"unknown anchor", head + "builder:\n  keep-builds: *n\n", 3, "builder", "alias *n refers to no anchor"},
		{"control character", head + "builder:\n  state-db: a\x01b\n", 3, "builder", "control characters are not allowed; remove the control character"},
		{"invalid UTF-8", head + "builder:\n  state-db: a\xffb\n", 3, "builder", "not valid UTF-8"},
		{"second document", head + "---\nbuilder: {}\n", 2, "", "a second YAML document starts here"},
		{"mapping value on first line", "a: b: c\n", 1, "a", "YAML syntax error: mapping values are not allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := parse(tt.text)
			if err == nil {
				t.Fatalf("Parse succeeded with %+v, want an error", cfg)
			}
			if cfg != nil {
				t.Errorf("Parse returned a config with its error")
			}
			wantError(t, err, tt.line, tt.path, tt.msg)
		})
	}
}

func TestParseByteSizes(t *testing.T) {
	for text, want := range map[string]int64{
		"1073741824": 1 << 30, "64G": 64 << 30, "64 GiB": 64 << 30, "512M": 512 << 20, "2T": 2 << 40, "100KB": 100 << 10,
	} {
		cfg := mustParse(t, "images-dir: /opt/images\nbuilder:\n  max-image-size: "+text+"\n")
		if cfg.Builder.MaxImageSize != want {
			t.Errorf("max-image-size: %s = %d, want %d", text, cfg.Builder.MaxImageSize, want)
		}
	}
}

func TestParseCollectsAllErrors(t *testing.T) {
	text := `images-dir: /opt/images
builder:
  keep-builds: 0
diskimages:
  - name: a
    pause: maybe
providers:
  - name: p
    diskimages:
      - name: missing
`
	_, err := parse(text)
	var es Errors
	if !errors.As(err, &es) {
		t.Fatalf("error %v is not an Errors", err)
	}
	var got []string
	for _, e := range es {
		got = append(got, fmt.Sprintf("%d %s", e.Line, e.Path))
	}
	want := []string{"3 builder.keep-builds", "6 diskimages[0].pause", "8 providers[0].cloud", "10 providers[0].diskimages[0].name"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("errors at %q, want %q:\n%v", got, want, err)
	}
}

func TestParseDefaults(t *testing.T) {
	cfg := mustParseFiles(t, `images-dir: /opt/images
webapp: {}
diskimages:
  - name: d
  - name: z
    pause: true
providers:
  - name: p
    cloud: c
    diskimages:
      - name: d
      - name: z
`, `builder:
  webapp: {}
zuul-images:
  - name: z
    api-url: https://zuul.example.com/
    project: org/images
    job: build-z
`)
	want := &Config{
		Path:              "nodepool.yaml",
		BuilderPath:       "nodepool-builder.yaml",
		ImagesDir:         "/opt/images",
		BuildLogDir:       "/var/log/nodepool/builds",
		BuildLogRetention: 7,
		LauncherWebapp:    &Webapp{ListenAddress: "0.0.0.0", Port: 8005},
		DiskImages: []DiskImage{{
			Name:         "d",
			RebuildAge:   86400 * time.Second,
			BuildTimeout: 28800 * time.Second,
			DIBCmd:       "disk-image-create",
			Username:     "zuul",
			PythonPath:   "auto",
		}},
		ZuulImages: []ZuulImage{{
			Declared:     true,
			Username:     "zuul",
			PythonPath:   "auto",
			Name:         "z",
			APIURL:       "https://zuul.example.com/",
			Project:      "org/images",
			JobName:      "build-z",
			PollInterval: 60 * time.Second,
		}},
		Providers: []Provider{{
			Name:               "p",
			Cloud:              "c",
			ImageNameFormat:    "{image_name}-{timestamp}",
			ImageUploadTimeout: 3600 * time.Second,
			Rate:               1.0,
			DiskImages:         []ProviderImage{{Name: "d"}, {Name: "z"}},
		}},
		Builder: Builder{
			PollInterval:   60 * time.Second,
			UploadWorkers:  4,
			KeepBuilds:     2,
			KeepUploads:    2,
			UploadAttempts: 5,
			StateDB:        "/opt/images/builder.db",
			LeakSweep:      true,
			MaxImageSize:   DefaultMaxImageSize,

			GearmanUnservedAfter:    DefaultGearmanUnservedAfter,
			GearmanMinBuildInterval: time.Hour,
			Webapp:                  &Webapp{ListenAddress: "127.0.0.1", Port: 8006},
		},
	}
	cfg.own = nil // its own settings as read, which TestOwnSettingsChanged checks
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("Parse =\n%+v\nwant\n%+v", cfg, want)
	}
}

// An empty file (or one of comments, blanks or a null document) is refused:
// it is what a file cut short looks like, and taken as a config without
// images, it would have every upload deleted. Keys without values still load.
func TestParseEmpty(t *testing.T) {
	for _, text := range []string{"", "# nothing\n", "\n  \n", "~\n", "null\n", "---\n# a comment\n", "--- null\n"} {
		_, err := parse(text)
		wantError(t, err, 1, "", "holds no config")
		_, err = parseFiles("images-dir: /i\n", text)
		if err == nil || !strings.Contains(err.Error(), "nodepool-builder.yaml:1: holds no config") {
			t.Errorf("an empty builder file %q: %v, want it refused", text, err)
		}
	}
	cfg := mustParse(t, "diskimages:\nproviders:\nbuilder:\n")
	if cfg.BuildLogRetention != 7 || cfg.Builder.KeepBuilds != 2 || !cfg.Builder.LeakSweep ||
		cfg.LauncherWebapp != nil || cfg.Builder.Webapp != nil || cfg.Builder.StateDB != "" || len(cfg.ImageNames()) != 0 {
		t.Errorf("Parse = %+v, want defaults and no images", cfg)
	}
}

func TestParseValues(t *testing.T) {
	cfg := mustParse(t, `images-dir: /opt/images
build-log-retention: -1
diskimages:
  - name: d
    formats: [qcow, raw, qcow2]
    keep-formats: [qcow]
    release: 9
    rebuild-age: 0
    build-timeout: 1.5
    pause: yes
    delete-after-upload: on
    env-vars:
      DIB_QUIET: 0
      EMPTY: ''
providers:
  - name: p
    cloud: c
    image-format: qcow
    rate: 2
    diskimages:
      - name: d
        pause: True
        connection-type: ssh      # nodepool's, ignored
        meta:
          hw_disk_bus: scsi
          hw_vif_multiqueue_enabled: true
    pools: [{name: main}]
builder:
  poll-interval: 0.5
  gearman-functions: [image-upload, image-build, image-upload]
  gearman-min-build-interval: 0
`)
	d := cfg.DiskImage("d")
	if got := fmt.Sprint(d.Formats, d.KeepFormats); got != "[qcow2 raw] [qcow2]" {
		t.Errorf("formats, keep-formats = %s, want [qcow2 raw] [qcow2]", got)
	}
	if d.Release != "9" || d.RebuildAge != 0 || d.BuildTimeout != 1500*time.Millisecond || !d.Pause || !d.DeleteAfterUpload {
		t.Errorf("diskimage = %+v", d)
	}
	if want := map[string]string{"DIB_QUIET": "0", "EMPTY": ""}; !reflect.DeepEqual(d.EnvVars, want) {
		t.Errorf("env-vars = %v, want %v", d.EnvVars, want)
	}
	p := cfg.Provider("p")
	if p.ImageFormat != "qcow2" || p.Rate != 2 {
		t.Errorf("provider = %+v, want image-format qcow2 and rate 2", p)
	}
	wantImage := ProviderImage{Name: "d", Pause: true, Meta: map[string]string{"hw_disk_bus": "scsi", "hw_vif_multiqueue_enabled": "true"}}
	if !reflect.DeepEqual(p.DiskImages, []ProviderImage{wantImage}) {
		t.Errorf("provider diskimages = %+v, want %+v", p.DiskImages, wantImage)
	}
	if cfg.BuildLogRetention != -1 || cfg.Builder.PollInterval != 500*time.Millisecond {
		t.Errorf("build-log-retention %d, poll-interval %v", cfg.BuildLogRetention, cfg.Builder.PollInterval)
	}
	if b := cfg.Builder; !reflect.DeepEqual(b.GearmanFunctions, []string{"image-upload", "image-build"}) || b.GearmanMinBuildInterval != 0 ||
		!b.ServesGearman(GearmanBuild) || b.ServesGearman(GearmanDelete) {
		t.Errorf("gearman-functions %v, gearman-min-build-interval %v; want [image-upload image-build] without image-delete, and 0",
			b.GearmanFunctions, b.GearmanMinBuildInterval)
	}
}

func TestParseOtherDriversUntouched(t *testing.T) {
	// Keys that would be wrong for openstack mean nothing for other drivers.
	cfg := mustParse(t, `providers:
  - name: static-rack
    driver: static
    cloud: [not, a, string]
    diskimages:
      - name: not-an-image
  - name: k8s
    driver: kubernetes
    rate: fast
`)
	if len(cfg.Providers) != 0 {
		t.Errorf("Providers = %+v, want none", cfg.Providers)
	}
}

func TestParseZuulPollIntervalDefault(t *testing.T) {
	cfg := mustParse(t, `images-dir: /i
zuul-images:
  - {name: a, api-url: 'http://zuul:9000', project: p, job: j}
  - {name: b, api-url: 'https://zuul/', tenant: t, project: p, job: j, poll-interval: 30}
builder:
  poll-interval: 90
`)
	if got := cfg.ZuulImage("a").PollInterval; got != 90*time.Second {
		t.Errorf("a: poll-interval %v, want builder's 90s", got)
	}
	if got := cfg.ZuulImage("b").PollInterval; got != 30*time.Second {
		t.Errorf("b: poll-interval %v, want its own 30s", got)
	}
	if cfg.ZuulImage("a").Tenant != "" || cfg.ZuulImage("b").Tenant != "t" {
		t.Errorf("tenants %q, %q", cfg.ZuulImage("a").Tenant, cfg.ZuulImage("b").Tenant)
	}
}

func TestParseAnchorsAndMerges(t *testing.T) {
	cfg := mustParse(t, `images-dir: /i
diskimages:
  - name: a
    elements: &elems [debian-minimal, vm]
    env-vars: &env
      DIB_RELEASE: bookworm
  - <<: {name: ignored, rebuild-age: 60, release: '12'}
    name: b
    elements: *elems
    env-vars:
      <<: *env
      EXTRA: x
`)
	b := cfg.DiskImage("b")
	if b == nil {
		t.Fatalf("no diskimage b in %+v", cfg.DiskImages)
	}
	if b.RebuildAge != time.Minute || b.Release != "12" || fmt.Sprint(b.Elements) != "[debian-minimal vm]" {
		t.Errorf("b = %+v", b)
	}
	if want := map[string]string{"DIB_RELEASE": "bookworm", "EXTRA": "x"}; !reflect.DeepEqual(b.EnvVars, want) {
		t.Errorf("b env-vars = %v, want %v", b.EnvVars, want)
	}
}

func TestParseMergeList(t *testing.T) {
	// In a list of merged mappings the earlier one wins; keys written in the
	// mapping win over both. (The anchors are kept under a nodepool key whose
	// contents the builder does not read: a top-level key of their own would
	// be unknown.)
	cfg := mustParse(t, `images-dir: /i
tenant-resource-limits:
  - &fast {poll-interval: 10, keep-builds: 5, upload-workers: 9}
  - &slow {poll-interval: 600, keep-builds: 1, keep-uploads: 3}
builder:
  <<: [*fast, *slow]
  upload-workers: 2
`)
	b := cfg.Builder
	if b.PollInterval != 10*time.Second || b.KeepBuilds != 5 || b.KeepUploads != 3 || b.UploadWorkers != 2 {
		t.Errorf("builder = %+v, want poll 10s, keep-builds 5, keep-uploads 3, workers 2", b)
	}
}

func TestSubstitute(t *testing.T) {
	env := map[string]string{"NODEPOOL_PORT": "8022", "NODEPOOL_DIR": "/srv/images", "HOME": "/root"}
	getenv := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	cfg, err := Parse("nodepool.yaml", []byte(`images-dir: %(NODEPOOL_DIR)
elements-dir: '%(HOME)/elements'
build-log-dir: '%(NODEPOOL_DIR)/logs-%(NODEPOOL_PORT)'
webapp:
  port: %(NODEPOOL_PORT)
`), getenv)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ImagesDir != "/srv/images" || cfg.LauncherWebapp.Port != 8022 || cfg.BuildLogDir != "/srv/images/logs-8022" {
		t.Errorf("substituted config = %+v, webapp %+v", cfg, cfg.LauncherWebapp)
	}
	// Only NODEPOOL_ variables are substituted, like nodepool.
	if cfg.ElementsDir != "%(HOME)/elements" {
		t.Errorf("elements-dir = %q, want %%(HOME) left alone", cfg.ElementsDir)
	}
}

func TestSubstituteUnsetReportsOnlyVariables(t *testing.T) {
	// With the variable unset the port is empty; that must not add a second
	// error about the port.
	_, err := Parse("nodepool.yaml", []byte("webapp:\n  port: %(NODEPOOL_PORT)\nbuild-log-dir: %(NODEPOOL_LOGS)\n"), noEnv)
	var es Errors
	if !errors.As(err, &es) || len(es) != 2 {
		t.Fatalf("errors = %v, want two", err)
	}
	wantError(t, err, 2, "webapp.port", "NODEPOOL_PORT is not set")
	wantError(t, err, 3, "build-log-dir", "NODEPOOL_LOGS is not set")
}

func TestParseNilGetenvReadsEnvironment(t *testing.T) {
	t.Setenv("NODEPOOL_TEST_IMAGES", "/from/env")
	cfg, err := Parse("n.yaml", []byte("images-dir: %(NODEPOOL_TEST_IMAGES)\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ImagesDir != "/from/env" {
		t.Errorf("images-dir = %q, want /from/env", cfg.ImagesDir)
	}
}

func TestCheckNameFormat(t *testing.T) {
	tests := []struct {
		format string
		ok     bool
	}{
		{"{image_name}-{timestamp}", true},
		{"{image_name}-{build_id}-{upload_id}", true},
		{"{{literal}}-{image_name}", true},
		{"plain", true},
		{"", true},
		{"{image_name", false},
		{"image_name}", false},
		{"{}", false},
		{"{provider}", false},
		{"{timestamp!r}", false},
	}
	for _, tt := range tests {
		err := checkNameFormat(tt.format)
		if (err == nil) != tt.ok {
			t.Errorf("checkNameFormat(%q) = %v, want ok=%v", tt.format, err, tt.ok)
		}
	}
}

func TestParseUnknownKeys(t *testing.T) {
	// Every section the builder reads refuses a key that neither nodepool's
	// schema nor the builder knows, naming the key most likely meant.
	const provider = "providers:\n  - name: p\n    cloud: c\n"
	tests := []struct {
		name string
		text string
		want string // the whole error
	}{
		{"diskimage for diskimages in a provider", head + "diskimages:\n  - name: d\n" + provider + "    diskimage:\n      - name: d\n",
			"nodepool.yaml:7: providers[0].diskimage: unknown key in a provider; did you mean diskimages?"},
		{"image_format in a provider", head + provider + "    image_format: raw\n",
			"nodepool.yaml:5: providers[0].image_format: unknown key in a provider; did you mean image-format?"},
		{"top-level provider", head + "provider:\n  - name: p\n    cloud: c\n",
			"nodepool.yaml:2: provider: unknown key in a nodepool config; did you mean providers?"},
		{"misspelt diskimages key", head + "diskimages:\n  - name: d\n    elemnts: [vm]\n",
			"nodepool.yaml:4: diskimages[0].elemnts: unknown key in a diskimage; did you mean elements?"},
		{"misspelt zuul-images key", head + "zuul-images:\n  - name: z\n    api_url: https://z/\n    project: p\n    job: j\n",
			"nodepool.yaml:4: zuul-images[0].api_url: unknown key in a zuul-images entry; did you mean api-url?"},
		{"misspelt provider diskimages entry key", head + "diskimages:\n  - name: d\n" + provider + "    diskimages:\n      - name: d\n        puase: true\n",
			"nodepool.yaml:9: providers[0].diskimages[0].puase: unknown key in a provider diskimages entry; did you mean pause?"},
		{"misspelt webapp key", head + "webapp:\n  listen-address: 127.0.0.1\n",
			"nodepool.yaml:3: webapp.listen-address: unknown key in the webapp section; did you mean listen_address?"},
		{"misspelt builder key", head + "builder:\n  upload-worker: 2\n",
			"nodepool.yaml:3: builder.upload-worker: unknown key in the builder section; did you mean upload-workers?"},
		{"misspelt zookeeper server key", head + "zookeeper-servers:\n  - host: zk\n    prot: 2181\n",
			"nodepool.yaml:4: zookeeper-servers[0].prot: unknown key in a ZooKeeper server; did you mean port?"},
		{"unknown key merged into a provider", head + "common: &c {cloud: c, rat: 2}\nproviders:\n  - <<: *c\n    name: p\n",
			"nodepool.yaml:2: providers[0].rat: unknown key in a provider; did you mean rate?"},
		{"nothing near: the known keys are listed", head + "zookeeper-tls:\n  cert: c\n  key: k\n  ca: a\n  verify: false\n",
			"nodepool.yaml:6: zookeeper-tls.verify: unknown key in the zookeeper-tls section; known keys are cert, key, ca"},
		{"nothing near at the top level", head + "colour: blue\n",
			"nodepool.yaml:2: colour: unknown key in a nodepool config; known keys are images-dir, build-log-dir, build-log-retention, elements-dir, webapp, diskimages, providers, zookeeper-servers, zookeeper-tls, zookeeper-timeout, gearman-servers, labels, max-hold-age, tenant-resource-limits, drivers-dir, zuul-images, builder"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := parse(tt.text)
			if err == nil {
				t.Fatalf("Parse succeeded with %+v, want %q", cfg, tt.want)
			}
			var es Errors
			if !errors.As(err, &es) {
				t.Fatalf("error %v is not an Errors", err)
			}
			for _, e := range es {
				if e.Error() == tt.want {
					return
				}
			}
			t.Errorf("no error %q; got:\n%v", tt.want, err)
		})
	}
}

func TestParseAcceptsNodepoolKeysItDoesNotUse(t *testing.T) {
	// Keys of nodepool's schema that only the launcher uses are accepted and
	// ignored, whatever their contents, in every section the builder reads.
	tests := []struct {
		name string
		text string
	}{
		{"labels", "labels:\n  - name: l\n    min-ready: 1\n    anything: goes\n"},
		{"max-hold-age", "max-hold-age: 86400\n"},
		{"tenant-resource-limits", "tenant-resource-limits:\n  - tenant-name: t\n    max-cores: 8\n"},
		{"drivers-dir of an older nodepool", "drivers-dir: /etc/nodepool/drivers\n"},
		{"launcher keys of an openstack provider", "providers:\n  - name: p\n    cloud: c\n" +
			"    boot-timeout: 120\n    launch-timeout: 900\n    launch-retries: 3\n    max-concurrency: 10\n" +
			"    nodepool-id: x\n    clean-floating-ips: true\n    port-cleanup-interval: 600\n" +
			"    cloud-images:\n      - name: c\n        whatever: 1\n" +
			"    pools:\n      - name: main\n        max-servers: 4\n        labels: [{name: l, diskimage: d}]\n"},
		{"launcher keys of a provider diskimages entry", "diskimages:\n  - name: d\nproviders:\n  - name: p\n    cloud: c\n" +
			"    diskimages:\n      - name: d\n        config-drive: true\n        connection-type: ssh\n        connection-port: 22\n"},
		{"any key of another driver", "providers:\n  - name: k\n    driver: kubernetes\n    context: admin\n    colour: blue\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mustParse(t, head+tt.text)
		})
	}
}

func TestParseBuilderWebapp(t *testing.T) {
	// The builder's pages are set in builder.webapp; nodepool's top-level
	// webapp is the launcher's and never sets them.
	tests := []struct {
		name         string
		text         string
		want         *Webapp
		wantLauncher *Webapp
	}{
		{"absent", "builder:\n  keep-builds: 2\n", nil, nil},
		{"only the launcher's", "webapp:\n  port: 8005\n", nil, &Webapp{ListenAddress: "0.0.0.0", Port: 8005}},
		{"empty: the defaults", "builder:\n  webapp:\n", &Webapp{ListenAddress: "127.0.0.1", Port: 8006}, nil},
		{"an empty mapping: the defaults", "builder:\n  webapp: {}\n", &Webapp{ListenAddress: "127.0.0.1", Port: 8006}, nil},
		{"a port", "builder:\n  webapp:\n    port: 9100\n", &Webapp{ListenAddress: "127.0.0.1", Port: 9100}, nil},
		{"both", "webapp:\n  listen_address: 127.0.0.1\n  port: 8005\nbuilder:\n  webapp:\n    listen-address: 127.0.0.2\n    port: 8007\n",
			&Webapp{ListenAddress: "127.0.0.2", Port: 8007}, &Webapp{ListenAddress: "127.0.0.1", Port: 8005}},
		{"host names", "builder:\n  webapp:\n    host-names: [builder.example.com, nb01.]\n",
			&Webapp{ListenAddress: "127.0.0.1", Port: 8006, HostNames: []string{"builder.example.com", "nb01."}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := mustParse(t, head+tt.text)
			if !reflect.DeepEqual(cfg.Builder.Webapp, tt.want) {
				t.Errorf("builder.webapp = %+v, want %+v", cfg.Builder.Webapp, tt.want)
			}
			if !reflect.DeepEqual(cfg.LauncherWebapp, tt.wantLauncher) {
				t.Errorf("launcher's webapp = %+v, want %+v", cfg.LauncherWebapp, tt.wantLauncher)
			}
		})
	}
}

// TestParseNAT64Prefixes: builder.nat64-prefixes is read as prefixes, repeats
// dropped; without it there are none beyond the well-known one, which the
// fetcher always judges.
func TestParseNAT64Prefixes(t *testing.T) {
	cfg := mustParse(t, head+"builder:\n  nat64-prefixes: ['2001:db8:64::/96', 'fd00:64::/64', '2001:DB8:64::/96']\n")
	want := []netip.Prefix{netip.MustParsePrefix("2001:db8:64::/96"), netip.MustParsePrefix("fd00:64::/64")}
	if !reflect.DeepEqual(cfg.Builder.NAT64Prefixes, want) {
		t.Errorf("nat64-prefixes = %v, want %v", cfg.Builder.NAT64Prefixes, want)
	}
	if cfg := mustParse(t, head); cfg.Builder.NAT64Prefixes != nil {
		t.Errorf("without the key, nat64-prefixes = %v", cfg.Builder.NAT64Prefixes)
	}
}

func TestParseArtifactHosts(t *testing.T) {
	cfg := mustParse(t, `images-dir: /opt/images
zuul-images:
  - name: z
    api-url: https://zuul.example.com/
    project: org/images
    job: build-z
    artifact-hosts:
      - Logs.Example.com
      - '*.swift.example.com:443'
      - 192.0.2.7:8080
      - '[2001:db8::7]'
`)
	var got []string
	for _, p := range cfg.ZuulImages[0].ArtifactHosts {
		got = append(got, p.String())
	}
	want := []string{"logs.example.com", "*.swift.example.com:443", "192.0.2.7:8080", "[2001:db8::7]"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("artifact-hosts = %q, want %q", got, want)
	}
}
