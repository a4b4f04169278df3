package config

import (
	"net/url"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/hostpattern"
	"gopkg.in/yaml.v3"
)

// zuulImageTable is a zuul-images entry. The section is ours, so unknown
// keys are errors; every change of it is held until the reload signal
// confirms it.
var zuulImageTable = []spec[ZuulImage]{
	{key: keyName, reload: held, need: "give every zuul-image the name providers refer to it by",
		read: func(r reader, z *ZuulImage) { r.str(&z.Name) }},
	{key: "api-url", reload: held, need: "set it to the Zuul web root, e.g. https://zuul.example.com/",
		read: func(r reader, z *ZuulImage) {
			s, ok := r.m.str(r.key)
			if !ok {
				return
			}
			if u, err := url.Parse(s); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				r.errorf("%q is not an http or https URL; write the Zuul web root like https://zuul.example.com/", s)
				return
			}
			z.APIURL = s
		}},
	{key: "tenant", reload: held,
		read: func(r reader, z *ZuulImage) { r.str(&z.Tenant) }},
	{key: "project", reload: held, need: "name the project whose job builds the image, e.g. org/images",
		read: func(r reader, z *ZuulImage) { r.str(&z.Project) }},
	{key: "branch", reload: held,
		read: func(r reader, z *ZuulImage) { r.str(&z.Branch) }},
	{key: "pipelines", reload: held,
		read: func(r reader, z *ZuulImage) { r.strList(&z.Pipelines, "pipeline names", "[periodic, post]") }},
	{key: "job", reload: held, need: "name the Zuul job that builds the image",
		read: func(r reader, z *ZuulImage) { r.str(&z.JobName) }},
	// Its default is the builder's poll-interval, which zuulImages gives.
	{key: keyPollInterval, reload: held,
		read: func(r reader, z *ZuulImage) { r.seconds(&z.PollInterval, false) }},
	{key: "auth-token-file", reload: held,
		read: func(r reader, z *ZuulImage) { r.str(&z.AuthTokenFile) }},
	{key: keyCACert, reload: held,
		read: func(r reader, z *ZuulImage) { r.str(&z.CACert) }},
	{key: "require-checksum", reload: held,
		read: func(r reader, z *ZuulImage) { r.boolean(&z.RequireChecksum) }},
	{key: keyFormats, reload: held,
		read: func(r reader, z *ZuulImage) { r.formats(&z.Formats) }},
	{key: "artifacts", reload: held,
		read: func(r reader, z *ZuulImage) { z.Artifacts = r.m.p.artifactMappings(r) }},
	{key: keyPause, reload: held,
		read: func(r reader, z *ZuulImage) { r.boolean(&z.Pause) }},
	{key: keyMetadata, reload: held,
		read: func(r reader, z *ZuulImage) { r.strMap(&z.Metadata, "os_distro: debian") }},
	{key: "allow-unmerged-changes", reload: held,
		read: func(r reader, z *ZuulImage) { r.boolean(&z.AllowUnmergedChanges) }},
	{key: "artifact-hosts", reload: held,
		read: func(r reader, z *ZuulImage) { z.ArtifactHosts = r.m.p.artifactHosts(r) }},
}

// artifactEntry is an artifacts entry as read, with where its format is
// written, for the check that each format is mapped once.
type artifactEntry struct {
	ArtifactMapping
	formatAt   *yaml.Node
	formatPath string
}

// artifactTable is an artifacts entry.
var artifactTable = []spec[artifactEntry]{
	{key: "format", need: "name the format this artifact holds, e.g. format: qcow2",
		read: func(r reader, a *artifactEntry) {
			n, _ := r.node()
			if f, ok := r.m.p.checkFormat(n, r.path()); ok {
				a.Format, a.formatAt, a.formatPath = f, n, r.path()
			}
		}},
	{key: "type", need: "give the artifact metadata.type to match, e.g. type: image-qcow",
		read: func(r reader, a *artifactEntry) { r.str(&a.Type) }},
	{key: keyName,
		read: func(r reader, a *artifactEntry) { r.str(&a.Name) }},
}

// zuulImages reads the zuul-images list: of the builder's own file, or of a
// one-file nodepool.yaml. pollInterval is the builder's, the default for each
// entry.
func (p *parser) zuulImages(top *mapping, names imageNames, pollInterval time.Duration) []ZuulImage {
	items, ok := top.list(keyZuulImages, keyZuulImages, "[{name: debian, api-url: https://zuul.example.com/, project: org/images, job: build-debian}]")
	if !ok {
		return nil
	}
	var out []ZuulImage
	for i, item := range items {
		path := indexPath(top.sub(keyZuulImages), i)
		m, ok := p.readMapping(item, path, "a zuul-images entry", keys(zuulImageTable), true)
		if !ok {
			continue
		}
		// Username and PythonPath are its declaration's, nodepool's defaults
		// until one is read.
		d, z := baseDiskImage(), defaults(zuulImageTable)
		z.PollInterval, z.Username, z.PythonPath = pollInterval, d.Username, d.PythonPath
		readInto(m, zuulImageTable, &z)
		if z.Name == "" {
			continue
		}
		nameNode, _ := m.get(keyName)
		if p.claim(names, nameNode, m.sub(keyName), z.Name, "zuul-image") {
			out = append(out, z)
		}
	}
	return out
}

// artifactHosts reads artifact-hosts: the hosts artifacts may be fetched from.
// nil when absent.
func (p *parser) artifactHosts(r reader) []hostpattern.Pattern {
	const example = "[logs.example.com, '*.swift.example.com', '192.0.2.7:8080']"
	items, ok := r.m.list(r.key, "host names or addresses", example)
	if !ok {
		return nil
	}
	if len(items) == 0 {
		r.errorf("is empty, so no artifact could be fetched; list the hosts, or remove the key to allow the api-url's host and the builds' log hosts")
		return nil
	}
	out := make([]hostpattern.Pattern, 0, len(items))
	for i, item := range items {
		item = resolve(item)
		path := indexPath(r.path(), i)
		if isNull(item) || item.Kind != yaml.ScalarNode || item.ShortTag() != "!!str" || item.Value == "" {
			p.errorf(item, path, "expected a host name or address like %s; this entry is %s", example, p.describe(item))
			continue
		}
		hp, err := hostpattern.Parse(item.Value)
		if err != nil {
			p.errorf(item, path, "%v; write a host name, an IP address or *.domain, optionally with :port", err)
			continue
		}
		out = append(out, hp)
	}
	return out
}

// artifactMappings reads the artifacts list: which artifact holds which
// format. An entry with a wrong value is left out.
func (p *parser) artifactMappings(r reader) []ArtifactMapping {
	items, _ := r.m.list(r.key, "artifact mappings", "[{format: qcow2, type: image-qcow}]")
	var out []ArtifactMapping
	seen := map[string]int{}
	for i, item := range items {
		am, ok := p.readMapping(item, indexPath(r.path(), i), "an artifacts entry", keys(artifactTable), true)
		if !ok {
			continue
		}
		errs := len(p.errs)
		var a artifactEntry
		readInto(am, artifactTable, &a)
		good := len(p.errs) == errs
		if a.formatAt != nil {
			if line, dup := seen[a.Format]; dup {
				p.errorf(a.formatAt, a.formatPath, "%s is mapped twice (first on line %d); keep one mapping per format", a.Format, line)
				good = false
			} else {
				seen[a.Format] = a.formatAt.Line
			}
		}
		if good && a.Type != "" {
			out = append(out, a.ArtifactMapping)
		}
	}
	return out
}
