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

// builderTable is the builder section. It is ours, so unknown keys are
// errors: they are most likely misspelt settings that would otherwise be lost.
// Every change of it is held until the reload signal confirms it.
var builderTable = []spec[Builder]{
	{key: keyPollInterval, reload: held,
		init: func(b *Builder) { b.PollInterval = DefaultPollInterval },
		read: func(r reader, b *Builder) { r.seconds(&b.PollInterval, false) }},
	{key: "upload-workers", reload: held,
		init: func(b *Builder) { b.UploadWorkers = DefaultUploadWorkers },
		read: func(r reader, b *Builder) {
			r.integer(&b.UploadWorkers, 1, math.MaxInt, "a number of concurrent uploads, 1 or more")
		}},
	{key: "keep-builds", reload: held,
		init: func(b *Builder) { b.KeepBuilds = DefaultKeepBuilds },
		read: func(r reader, b *Builder) {
			r.integer(&b.KeepBuilds, 1, math.MaxInt, "a number of ready builds to keep per image, 1 or more")
		}},
	{key: "keep-uploads", reload: held,
		init: func(b *Builder) { b.KeepUploads = DefaultKeepUploads },
		read: func(r reader, b *Builder) {
			r.integer(&b.KeepUploads, 1, math.MaxInt, "a number of ready uploads to keep per image and provider, 1 or more")
		}},
	{key: "upload-attempts", reload: held,
		init: func(b *Builder) { b.UploadAttempts = DefaultUploadAttempts },
		read: func(r reader, b *Builder) {
			r.integer(&b.UploadAttempts, 1, math.MaxInt, "a number of tries per upload, 1 or more")
		}},
	// Its default is beside images-dir, set once both are read.
	{key: "state-db", reload: held,
		read: func(r reader, b *Builder) { r.str(&b.StateDB) }},
	{key: keyGearmanServers, reload: held,
		read:    func(r reader, b *Builder) { b.GearmanServers = r.m.p.gearmanServers(r) },
		restart: "gearman-servers changed; the builder keeps the servers it started with until it is restarted",
		changed: func(old, next *Builder) bool { return !slices.Equal(old.GearmanServers, next.GearmanServers) }},
	{key: "leak-sweep", reload: held,
		init: func(b *Builder) { b.LeakSweep = true },
		read: func(r reader, b *Builder) { r.boolean(&b.LeakSweep) }},
	{key: "max-image-size", reload: held,
		init: func(b *Builder) { b.MaxImageSize = DefaultMaxImageSize },
		read: func(r reader, b *Builder) { r.byteSize(&b.MaxImageSize) }},
	{key: "gearman-unserved-after", reload: held,
		init: func(b *Builder) { b.GearmanUnservedAfter = DefaultGearmanUnservedAfter },
		read: func(r reader, b *Builder) { r.seconds(&b.GearmanUnservedAfter, false) }},
	{key: "download-connections", reload: held,
		read: func(r reader, b *Builder) {
			r.integer(&b.DownloadConnections, 1, 64, "a number of connections per download, 1 to 64")
		}},
	// Unlike nodepool's sections, the key with no value counts: "webapp:"
	// alone serves the pages on the defaults.
	{key: keyWebapp, reload: held,
		read: func(r reader, b *Builder) {
			if f, ok := r.m.fields[r.key]; ok {
				b.Webapp = r.m.p.builderWebapp(f.val, r.path())
			}
		},
		restart: "builder.webapp changed; the status pages stay where they are until the builder is restarted",
		changed: func(old, next *Builder) bool { return !old.Webapp.Equal(next.Webapp) }},
	{key: "gearman-functions", reload: held,
		read: func(r reader, b *Builder) {
			if fns, ok := r.m.p.gearmanFunctions(r); ok {
				b.GearmanFunctions = fns
			}
		}},
	{key: "gearman-min-build-interval", reload: held,
		init: func(b *Builder) { b.GearmanMinBuildInterval = DefaultGearmanMinBuildInterval },
		read: func(r reader, b *Builder) { r.seconds(&b.GearmanMinBuildInterval, true) }},
	{key: "zuul-mqtt", reload: held,
		read: func(r reader, b *Builder) {
			if n, ok := r.node(); ok {
				b.ZuulMQTT = r.m.p.zuulMQTT(n, r.path())
			}
		}},
	{key: "build-diskimages", reload: held,
		read: func(r reader, b *Builder) {
			build := !b.LeaveDiskImages
			r.boolean(&build)
			b.LeaveDiskImages = !build
		}},
	{key: "nat64-prefixes", reload: held,
		read: func(r reader, b *Builder) { b.NAT64Prefixes = r.m.p.nat64Prefixes(r) }},
	{key: keyProviders, reload: held,
		read: func(r reader, b *Builder) { b.Providers = r.m.p.builderProviders(r) }},
}

// builderProviderTable is an entry of builder.providers.
var builderProviderTable = []spec[BuilderProvider]{
	{key: keyName, need: "name the provider of nodepool.yaml these settings are for, e.g. name: cloud-a",
		read: func(r reader, bp *BuilderProvider) {
			r.str(&bp.Name)
			bp.path = r.path()
		}},
	{key: "upload-method",
		init: func(bp *BuilderProvider) { bp.UploadMethod = UploadPut },
		read: func(r reader, bp *BuilderProvider) {
			// An entry without a usable name is left out unchecked.
			s, ok := r.m.str(r.key)
			if !ok || bp.Name == "" {
				return
			}
			if !slices.Contains(UploadMethods, s) {
				r.errorf("%q is not an upload method; they are %s", s, strings.Join(UploadMethods, ", "))
				return
			}
			bp.UploadMethod = s
		}},
}

// gearmanServerTable is an entry of builder.gearman-servers, and of
// nodepool's old top-level gearman-servers.
var gearmanServerTable = hostPortRows(ours, "name the gearman server's host, e.g. host: gearman.example.com",
	DefaultGearmanPort, func(g *GearmanServer) (*string, *int) { return &g.Host, &g.Port })

// builderWebappTable is builder.webapp; dashed, as the rest of the builder
// section.
var builderWebappTable = []spec[Webapp]{
	{key: "listen-address",
		init: func(w *Webapp) { w.ListenAddress = DefaultBuilderWebappAddress },
		read: func(r reader, w *Webapp) { r.str(&w.ListenAddress) }},
	{key: keyPort,
		init: func(w *Webapp) { w.Port = DefaultBuilderWebappPort },
		read: func(r reader, w *Webapp) { r.port(&w.Port) }},
	{key: "host-names",
		read: func(r reader, w *Webapp) {
			names, ok := r.m.strList(r.key, "host names the pages answer to", "[builder.example.com]")
			if !ok {
				return
			}
			items, _ := r.node()
			for i, name := range names {
				if !hostName(name) {
					r.m.p.errorf(items.Content[i], indexPath(r.path(), i),
						"%q is not a host name; write the name alone, as in builder.example.com, without a scheme, port or path", name)
					continue
				}
				w.HostNames = append(w.HostNames, name)
			}
		}},
}

func defaultBuilder() Builder { return defaults(builderTable) }

// builder reads the builder section.
func (p *parser) builder(n *yaml.Node, path string) Builder {
	b := defaultBuilder()
	if m, ok := p.readMapping(n, path, "the builder section", keys(builderTable), true); ok {
		readInto(m, builderTable, &b)
	}
	return b
}

// builderProviders reads builder.providers: the builder's own settings of
// nodepool.yaml's providers, each named once. Whether each names a provider
// nodepool.yaml has is checked once both files are read (checkBuilderProviders).
// An entry with a wrong value is left out.
func (p *parser) builderProviders(r reader) map[string]BuilderProvider {
	const example = "[{name: cloud-a, upload-method: glance-direct}]"
	items, _ := r.m.list(r.key, r.key, example)
	if len(items) == 0 {
		return nil
	}
	out := map[string]BuilderProvider{}
	for i, item := range items {
		pm, ok := p.readMapping(item, indexPath(r.path(), i), "a provider's builder settings", keys(builderProviderTable), true)
		if !ok {
			continue
		}
		errs := len(p.errs)
		bp := defaults(builderProviderTable)
		readInto(pm, builderProviderTable, &bp)
		if len(p.errs) > errs || bp.Name == "" {
			continue
		}
		bp.line = item.Line
		if _, dup := out[bp.Name]; dup {
			n, _ := pm.get(keyName)
			p.errorf(n, bp.path, "provider %q is listed twice under builder.providers; give each its settings once", bp.Name)
			continue
		}
		out[bp.Name] = bp
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
func (p *parser) gearmanFunctions(r reader) ([]string, bool) {
	const example = "[image-build, image-upload]"
	items, ok := r.m.list(r.key, "gearman function kinds", example)
	if !ok {
		return nil, false
	}
	known := strings.Join(GearmanFunctionKinds, ", ")
	if len(items) == 0 {
		r.errorf("lists no gearman function; list one or more of %s, or leave out gearman-servers to serve none", known)
		return nil, false
	}
	out := []string{}
	good := true
	for i, item := range items {
		item = resolve(item)
		path := indexPath(r.path(), i)
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
func (p *parser) nat64Prefixes(r reader) []netip.Prefix {
	const example = "['2001:db8:64::/96']"
	items, _ := r.m.list(r.key, "IPv6 prefixes", example)
	var out []netip.Prefix
	for i, item := range items {
		item = resolve(item)
		path := indexPath(r.path(), i)
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

// builderWebapp reads builder.webapp: the defaults when it has no value.
func (p *parser) builderWebapp(n *yaml.Node, path string) *Webapp {
	w := defaults(builderWebappTable)
	if isNull(n) {
		return &w
	}
	if m, ok := p.readMapping(n, path, "the builder's webapp section", keys(builderWebappTable), true); ok {
		readInto(m, builderWebappTable, &w)
	}
	return &w
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

// gearmanServers reads a gearman-servers list: the builder section's, or
// nodepool's old top-level one.
func (p *parser) gearmanServers(r reader) []GearmanServer {
	var out []GearmanServer
	for gm := range r.m.mappings(r.key, "gearman servers", "[{host: gearman.example.com, port: 4730}]", "a gearman server", keys(gearmanServerTable)) {
		g := defaults(gearmanServerTable)
		readInto(gm, gearmanServerTable, &g)
		if g.Host != "" {
			out = append(out, g)
		}
	}
	return out
}
