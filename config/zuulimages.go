package config

import (
	"net/url"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/hostpattern"
	"gopkg.in/yaml.v3"
)

var zuulImageKeys = []string{
	"name", "api-url", "tenant", "project", "branch", "pipelines", "job",
	"poll-interval", "auth-token-file", "ca-cert", "require-checksum",
	"formats", "artifacts", "pause", "metadata", "allow-unmerged-changes",
	"artifact-hosts",
}

var artifactKeys = []string{"format", "type", "name"}

// zuulImages reads the zuul-images list: of the builder's own file, or of a
// one-file nodepool.yaml. The section is ours, so unknown keys are errors. pollInterval is the builder's, the default for each entry.
func (p *parser) zuulImages(top *mapping, names imageNames, pollInterval time.Duration) []ZuulImage {
	items, ok := top.list("zuul-images", "zuul-images", "[{name: debian, api-url: https://zuul.example.com/, project: org/images, job: build-debian}]")
	if !ok {
		return nil
	}
	var out []ZuulImage
	for i, item := range items {
		path := indexPath(top.sub("zuul-images"), i)
		m, ok := p.readMapping(item, path, "a zuul-images entry", zuulImageKeys, true)
		if !ok {
			continue
		}
		z, ok := p.zuulImage(m, pollInterval)
		if !ok {
			continue
		}
		nameNode, _ := m.get("name")
		if p.claim(names, nameNode, m.sub("name"), z.Name, "zuul-image") {
			out = append(out, z)
		}
	}
	return out
}

// zuulImage reads one entry; false means it has no usable name.
func (p *parser) zuulImage(m *mapping, pollInterval time.Duration) (ZuulImage, bool) {
	z := ZuulImage{PollInterval: pollInterval, Username: DefaultUsername, PythonPath: DefaultPythonPath}
	if m.require("name", "give every zuul-image the name providers refer to it by") {
		z.Name, _ = m.str("name")
	}
	if m.require("api-url", "set it to the Zuul web root, e.g. https://zuul.example.com/") {
		if s, ok := m.str("api-url"); ok {
			if u, err := url.Parse(s); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				n, _ := m.get("api-url")
				p.errorf(n, m.sub("api-url"), "%q is not an http or https URL; write the Zuul web root like https://zuul.example.com/", s)
			} else {
				z.APIURL = s
			}
		}
	}
	z.Tenant, _ = m.str("tenant")
	if m.require("project", "name the project whose job builds the image, e.g. org/images") {
		z.Project, _ = m.str("project")
	}
	z.Branch, _ = m.str("branch")
	z.Pipelines, _ = m.strList("pipelines", "pipeline names", "[periodic, post]")
	if m.require("job", "name the Zuul job that builds the image") {
		z.Job, _ = m.str("job")
	}
	if v, ok := m.seconds("poll-interval", false); ok {
		z.PollInterval = v
	}
	z.AuthTokenFile, _ = m.str("auth-token-file")
	z.CACert, _ = m.str("ca-cert")
	z.RequireChecksum, _ = m.boolean("require-checksum")
	z.AllowUnmergedChanges, _ = m.boolean("allow-unmerged-changes")
	z.Formats, _ = m.formats("formats")
	z.Pause, _ = m.boolean("pause")
	z.Metadata, _ = m.strMap("metadata", "os_distro: debian")
	z.Artifacts = p.artifactMappings(m)
	z.ArtifactHosts = p.artifactHosts(m)
	return z, z.Name != ""
}

// artifactHosts reads artifact-hosts: the hosts artifacts may be fetched from.
// nil when absent.
func (p *parser) artifactHosts(m *mapping) []hostpattern.Pattern {
	const example = "[logs.example.com, '*.swift.example.com', '192.0.2.7:8080']"
	items, ok := m.list("artifact-hosts", "host names or addresses", example)
	if !ok {
		return nil
	}
	if len(items) == 0 {
		n, _ := m.get("artifact-hosts")
		p.errorf(n, m.sub("artifact-hosts"), "is empty, so no artifact could be fetched; list the hosts, or remove the key to allow the api-url's host and the builds' log hosts")
		return nil
	}
	out := make([]hostpattern.Pattern, 0, len(items))
	for i, item := range items {
		item = resolve(item)
		path := indexPath(m.sub("artifact-hosts"), i)
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

// artifactMappings reads the artifacts list: which artifact holds which format.
func (p *parser) artifactMappings(m *mapping) []ArtifactMapping {
	items, _ := m.list("artifacts", "artifact mappings", "[{format: qcow2, type: image-qcow}]")
	var out []ArtifactMapping
	seen := map[string]int{}
	for i, item := range items {
		path := indexPath(m.sub("artifacts"), i)
		am, ok := p.readMapping(item, path, "an artifacts entry", artifactKeys, true)
		if !ok {
			continue
		}
		var a ArtifactMapping
		good := am.require("format", "name the format this artifact holds, e.g. format: qcow2")
		if n, ok := am.get("format"); ok {
			a.Format, ok = p.checkFormat(n, am.sub("format"))
			good = good && ok
			if line, dup := seen[a.Format]; ok && dup {
				p.errorf(n, am.sub("format"), "%s is mapped twice (first on line %d); keep one mapping per format", a.Format, line)
				good = false
			} else if ok {
				seen[a.Format] = n.Line
			}
		}
		if am.require("type", "give the artifact metadata.type to match, e.g. type: image-qcow") {
			a.Type, _ = am.str("type")
		}
		a.Name, _ = am.str("name")
		if good && a.Type != "" {
			out = append(out, a)
		}
	}
	return out
}
