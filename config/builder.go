package config

import (
	"maps"
	"math"
	"net/netip"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/nodepool-builder/nodepool-builder/internal/nat64"
)

// Defaults of the builder section.
const (
	DefaultPollInterval   = 60 * time.Second
	DefaultUploadWorkers  = 4
	DefaultKeepBuilds     = 2
	DefaultKeepUploads    = 2
	DefaultUploadAttempts = 5
	DefaultGearmanPort    = 4730
	// DefaultGearmanUnservedAfter is how long a gearman job for one of the
	// builders' functions that no worker serves waits before a builder answers
	// it as failed (an unknown image or build).
	DefaultGearmanUnservedAfter = 30 * time.Second
	// DefaultMaxImageSize bounds an image file, decompressed: an artifact that
	// would be larger is refused.
	DefaultMaxImageSize int64 = 128 << 30
	// DefaultBuilderWebappPort is where the builder serves its status pages
	// when builder.webapp names no port. It is not nodepool-launcher's 8005,
	// so that the two run side by side on one host with one nodepool.yaml,
	// nor a port of zuul or its parts (zuul-web's 9000, gearman's 4730,
	// ZooKeeper's 2181 and 2281, statsd's 8125); being next to 8005, it is
	// easy to find.
	DefaultBuilderWebappPort = 8006
	// DefaultBuilderWebappAddress is the loopback address: the pages show
	// the images, builds, clouds and jobs of the builder to whoever reaches
	// them, so serving them beyond the host is the operator's choice
	// (listen-address), best behind a proxy that authenticates.
	DefaultBuilderWebappAddress = "127.0.0.1"
	// DefaultGearmanMinBuildInterval is how young the newest ready build of a
	// diskimage may be for an image-build gearman job to be refused: jobs in a
	// row do not rotate the good builds out.
	DefaultGearmanMinBuildInterval = time.Hour
)

// The kinds of gearman functions a builder serves, as builder.gearman-functions
// names them: each is registered as "<kind>:<image or build id>".
const (
	GearmanBuild  = "image-build"
	GearmanUpload = "image-upload"
	GearmanDelete = "image-delete"
)

// GearmanFunctionKinds are the kinds of gearman functions there are.
var GearmanFunctionKinds = []string{GearmanBuild, GearmanUpload, GearmanDelete}

func defaultBuilder() Builder {
	return Builder{
		PollInterval:   DefaultPollInterval,
		UploadWorkers:  DefaultUploadWorkers,
		KeepBuilds:     DefaultKeepBuilds,
		KeepUploads:    DefaultKeepUploads,
		UploadAttempts: DefaultUploadAttempts,
		LeakSweep:      true,
		MaxImageSize:   DefaultMaxImageSize,

		GearmanUnservedAfter:    DefaultGearmanUnservedAfter,
		GearmanMinBuildInterval: DefaultGearmanMinBuildInterval,
	}
}

var builderKeys = []string{
	"poll-interval", "upload-workers", "keep-builds", "keep-uploads",
	"upload-attempts", "state-db", "gearman-servers", "leak-sweep", "max-image-size",
	"gearman-unserved-after", "download-connections", "webapp",
	"gearman-functions", "gearman-min-build-interval", "zuul-mqtt", "build-diskimages",
	"nat64-prefixes", "providers",
}

// builderProviderKeys are the keys of an entry of builder.providers.
var builderProviderKeys = []string{"name", "upload-method"}

var gearmanKeys = []string{"host", "port"}

// builderWebappKeys are the keys of builder.webapp; dashed, as the rest of
// the builder section.
var builderWebappKeys = []string{"listen-address", "port", "host-names"}

// builder reads the builder section. It is ours, so unknown keys are errors:
// they are most likely misspelt settings that would otherwise be lost.
func (p *parser) builder(n *yaml.Node, path string) Builder {
	b := defaultBuilder()
	m, ok := p.readMapping(n, path, "the builder section", builderKeys, true)
	if !ok {
		return b
	}
	if v, ok := m.seconds("poll-interval", false); ok {
		b.PollInterval = v
	}
	count := func(key string, dst *int, rule string) {
		if v, ok := m.integer(key, 1, math.MaxInt, rule); ok {
			*dst = v
		}
	}
	count("upload-workers", &b.UploadWorkers, "a number of concurrent uploads, 1 or more")
	count("keep-builds", &b.KeepBuilds, "a number of ready builds to keep per image, 1 or more")
	count("keep-uploads", &b.KeepUploads, "a number of ready uploads to keep per image and provider, 1 or more")
	count("upload-attempts", &b.UploadAttempts, "a number of tries per upload, 1 or more")
	if s, ok := m.str("state-db"); ok {
		b.StateDB = s
	}
	if v, ok := m.boolean("leak-sweep"); ok {
		b.LeakSweep = v
	}
	if v, ok := m.boolean("build-diskimages"); ok {
		b.LeaveDiskImages = !v
	}
	if v, ok := m.byteSize("max-image-size"); ok {
		b.MaxImageSize = v
	}
	b.NAT64Prefixes = p.nat64Prefixes(m)
	b.GearmanServers = p.gearmanServers(m)
	if v, ok := m.integer("download-connections", 1, 64, "a number of connections per download, 1 to 64"); ok {
		b.DownloadConnections = v
	}
	if v, ok := m.seconds("gearman-unserved-after", false); ok {
		b.GearmanUnservedAfter = v
	}
	if v, ok := m.seconds("gearman-min-build-interval", true); ok {
		b.GearmanMinBuildInterval = v
	}
	if fns, ok := p.gearmanFunctions(m); ok {
		b.GearmanFunctions = fns
	}
	if f, ok := m.fields["webapp"]; ok {
		b.Webapp = p.builderWebapp(f.val, m.sub("webapp"))
	}
	if n, ok := m.get("zuul-mqtt"); ok {
		b.ZuulMQTT = p.zuulMQTT(n, m.sub("zuul-mqtt"))
	}
	b.Providers = p.builderProviders(m)
	return b
}

// builderProviders reads builder.providers: the builder's own settings of
// nodepool.yaml's providers, each named once. Whether each names a provider
// nodepool.yaml has is checked once both files are read (checkBuilderProviders).
func (p *parser) builderProviders(m *mapping) map[string]BuilderProvider {
	const example = "[{name: cloud-a, upload-method: glance-direct}]"
	items, _ := m.list("providers", "providers", example)
	if len(items) == 0 {
		return nil
	}
	out := map[string]BuilderProvider{}
	methods := strings.Join(UploadMethods, ", ")
	for i, item := range items {
		path := indexPath(m.sub("providers"), i)
		pm, ok := p.readMapping(item, path, "a provider's builder settings", builderProviderKeys, true)
		if !ok {
			continue
		}
		if !pm.require("name", "name the provider of nodepool.yaml these settings are for, e.g. name: cloud-a") {
			continue
		}
		name, ok := pm.str("name")
		if !ok || name == "" {
			continue
		}
		bp := BuilderProvider{Name: name, UploadMethod: UploadPut, line: item.Line, path: pm.sub("name")}
		if s, ok := pm.str("upload-method"); ok {
			if !slices.Contains(UploadMethods, s) {
				n, _ := pm.get("upload-method")
				p.errorf(n, pm.sub("upload-method"), "%q is not an upload method; they are %s", s, methods)
				continue
			}
			bp.UploadMethod = s
		}
		if _, dup := out[name]; dup {
			n, _ := pm.get("name")
			p.errorf(n, pm.sub("name"), "provider %q is listed twice under builder.providers; give each its settings once", name)
			continue
		}
		out[name] = bp
	}
	return out
}

// checkBuilderProviders refuses an entry of builder.providers that names no
// provider of nodepool.yaml: most likely a misspelt name, whose settings
// would otherwise be lost.
func checkBuilderProviders(cfg *Config, np, op *parser) {
	names := make([]string, 0, len(cfg.Providers))
	for _, pr := range cfg.Providers {
		names = append(names, pr.Name)
	}
	for _, name := range slices.Sorted(maps.Keys(cfg.Builder.Providers)) {
		bp := cfg.Builder.Providers[name]
		if slices.Contains(names, name) {
			continue
		}
		hint := "; its providers are " + strings.Join(names, ", ")
		if near, ok := nearestKey(name, names); ok {
			hint = "; did you mean " + near + "?"
		} else if len(names) == 0 {
			hint = ", which lists none"
		}
		op.errorf(&yaml.Node{Line: bp.line}, bp.path, "%q is not a provider of %s%s", name, np.file, hint)
	}
	for _, pr := range cfg.Providers {
		bp, ok := cfg.Builder.Providers[pr.Name]
		if ok && bp.UploadMethod == UploadWebDownload && pr.PostUploadHook != "" {
			op.errorf(&yaml.Node{Line: bp.line}, bp.path, "provider %s has a post-upload-hook in %s, which is given the "+
				"image's file, and upload-method web-download has the cloud fetch the image without one being downloaded; "+
				"use glance-direct or put for it, or drop the hook", pr.Name, np.file)
		}
	}
}

// gearmanFunctions reads builder.gearman-functions: the kinds of gearman
// functions the builder serves. ok is false when the key is absent or wrong.
func (p *parser) gearmanFunctions(m *mapping) ([]string, bool) {
	const example = "[image-build, image-upload]"
	items, ok := m.list("gearman-functions", "gearman function kinds", example)
	if !ok {
		return nil, false
	}
	known := strings.Join(GearmanFunctionKinds, ", ")
	if len(items) == 0 {
		n, _ := m.get("gearman-functions")
		p.errorf(n, m.sub("gearman-functions"), "lists no gearman function; list one or more of %s, or leave out gearman-servers to serve none", known)
		return nil, false
	}
	out := []string{}
	good := true
	for i, item := range items {
		item = resolve(item)
		path := indexPath(m.sub("gearman-functions"), i)
		if isNull(item) || item.Kind != yaml.ScalarNode || !slices.Contains(GearmanFunctionKinds, item.Value) {
			p.errorf(item, path, "%s is not a gearman function of the builder; they are %s", p.describe(item), known)
			good = false
			continue
		}
		if !slices.Contains(out, item.Value) {
			out = append(out, item.Value)
		}
	}
	return out, good
}

// nat64Prefixes reads builder.nat64-prefixes: the prefixes of the network's
// NAT64 translators, besides the well-known one. nil when absent.
func (p *parser) nat64Prefixes(m *mapping) []netip.Prefix {
	const example = "['2001:db8:64::/96']"
	items, _ := m.list("nat64-prefixes", "IPv6 prefixes", example)
	var out []netip.Prefix
	for i, item := range items {
		item = resolve(item)
		path := indexPath(m.sub("nat64-prefixes"), i)
		if isNull(item) || item.Kind != yaml.ScalarNode || item.ShortTag() != "!!str" {
			p.errorf(item, path, "expected an IPv6 prefix like %s; this entry is %s", example, p.describe(item))
			continue
		}
		prefix, err := netip.ParsePrefix(item.Value)
		if err == nil {
			err = nat64.CheckPrefix(prefix)
		}
		if err != nil {
			p.errorf(item, path, "%v; write the prefix of your DNS64, as in %s", err, example)
			continue
		}
		if !slices.Contains(out, prefix) {
			out = append(out, prefix)
		}
	}
	return out
}

// builderWebapp reads builder.webapp. Unlike nodepool's sections, the key
// with no value counts: "webapp:" alone serves the pages on the defaults.
func (p *parser) builderWebapp(n *yaml.Node, path string) *Webapp {
	w := &Webapp{ListenAddress: DefaultBuilderWebappAddress, Port: DefaultBuilderWebappPort}
	if isNull(n) {
		return w
	}
	m, ok := p.readMapping(n, path, "the builder's webapp section", builderWebappKeys, true)
	if !ok {
		return w
	}
	m.listen(w, "listen-address")
	if names, ok := m.strList("host-names", "host names the pages answer to", "[builder.example.com]"); ok {
		items, _ := m.get("host-names")
		for i, name := range names {
			if !hostName(name) {
				p.errorf(items.Content[i], indexPath(m.sub("host-names"), i),
					"%q is not a host name; write the name alone, as in builder.example.com, without a scheme, port or path", name)
				continue
			}
			w.HostNames = append(w.HostNames, name)
		}
	}
	return w
}

// hostName tells whether s is a DNS name: dot-separated labels of letters,
// digits, '-' and '_', at most 253 bytes.
func hostName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(strings.TrimSuffix(s, "."), ".") {
		if label == "" || len(label) > 63 || strings.ContainsFunc(label, func(r rune) bool {
			return !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '-' || r == '_')
		}) {
			return false
		}
	}
	return true
}

// gearmanServers reads a gearman-servers list of a mapping: the builder
// section's, or nodepool's old top-level one.
func (p *parser) gearmanServers(m *mapping) []GearmanServer {
	var out []GearmanServer
	for gm := range m.mappings("gearman-servers", "gearman servers", "[{host: gearman.example.com, port: 4730}]", "a gearman server", gearmanKeys) {
		var g GearmanServer
		g.Host, g.Port = gm.hostPort(DefaultGearmanPort, "name the gearman server's host, e.g. host: gearman.example.com")
		if g.Host != "" {
			out = append(out, g)
		}
	}
	return out
}
