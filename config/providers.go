package config

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Defaults of openstack provider keys.
const (
	DefaultImageNameFormat = "{image_name}-{timestamp}"
	// DefaultImageUploadTimeout is nodepool's own default of image-upload-timeout.
	DefaultImageUploadTimeout = 3600 * time.Second
	DefaultRate               = 1.0
	DefaultImageFormat        = "qcow2"
)

// nameFormatFields are the placeholders image-name-format may use.
var nameFormatFields = []string{"image_name", "timestamp", "upload_id", "build_id"}

// keyDriver is the key that says whose provider an entry is: isOpenStack
// reads it before the entry is read.
const keyDriver = "driver"

// providerEntry is a provider as read, with the image names its diskimages
// must name.
type providerEntry struct {
	Provider
	names imageNames
}

// providerTable is an openstack provider: nodepool 10's openstack driver
// schema (its OpenStack driver documentation, providers.[openstack], and the
// schema of nodepool's config-validate), the keys this builder reads and the
// launcher's, and older nodepools' keys. What pools and cloud-images hold is
// the launcher's to check.
var providerTable = []spec[providerEntry]{
	{key: keyName, owner: nodepools, need: "give every provider a name",
		read: func(r reader, e *providerEntry) { r.str(&e.Name) }},
	{key: keyDriver, owner: nodepools},
	{key: "cloud", owner: nodepools, need: "name the clouds.yaml entry of the cloud to upload to, e.g. cloud: mycloud",
		read: func(r reader, e *providerEntry) { r.str(&e.Cloud) }},
	{key: "region-name", owner: nodepools,
		read: func(r reader, e *providerEntry) { r.str(&e.RegionName) }},
	// The builder's own, though in nodepool's section: it warns, as
	// nodepool's config-validate refuses it.
	{key: "image-format", owner: ours,
		read: func(r reader, e *providerEntry) {
			n, ok := r.node()
			if !ok {
				return
			}
			e.ImageFormat, _ = r.m.p.checkFormat(n, r.path())
			r.warnf("is not a key of nodepool 10's providers, and nodepool's config-validate " +
				"refuses it: nodepool's builders and launchers take a provider's format from its cloud's image_format in " +
				"clouds.yaml, which this builder reads too; set it there")
		}},
	{key: "image-name-format", owner: nodepools,
		init: func(e *providerEntry) { e.ImageNameFormat = DefaultImageNameFormat },
		read: func(r reader, e *providerEntry) {
			s, ok := r.m.str(r.key)
			if !ok {
				return
			}
			if err := checkNameFormat(s); err != nil {
				r.errorf("%v", err)
				return
			}
			e.ImageNameFormat = s
		}},
	{key: "image-upload-timeout", owner: nodepools,
		init: func(e *providerEntry) { e.ImageUploadTimeout = DefaultImageUploadTimeout },
		read: func(r reader, e *providerEntry) { r.seconds(&e.ImageUploadTimeout, false) }},
	// Taken away, later uploads would go unchecked.
	{key: "post-upload-hook", owner: nodepools, reload: heldRemoved,
		read: func(r reader, e *providerEntry) { r.str(&e.PostUploadHook) },
		changed: func(old, next *providerEntry) bool {
			return old.PostUploadHook != "" && next.PostUploadHook == ""
		}},
	{key: "rate", owner: nodepools,
		init: func(e *providerEntry) { e.Rate = DefaultRate },
		read: func(r reader, e *providerEntry) {
			r.number(&e.Rate, "a number of seconds to wait between API calls, like 1.0")
		}},
	{key: keyDiskImages, owner: nodepools,
		read: func(r reader, e *providerEntry) { e.DiskImages = r.m.p.providerImages(r, e.names) }},
	{key: "max-concurrency", owner: launchers},
	{key: "priority", owner: launchers},
	{key: "boot-timeout", owner: launchers},
	{key: "launch-timeout", owner: launchers},
	{key: "launch-retries", owner: launchers},
	{key: "nodepool-id", owner: launchers},
	{key: "clean-floating-ips", owner: launchers},
	{key: "port-cleanup-interval", owner: launchers},
	{key: "pools", owner: launchers},
	{key: "cloud-images", owner: launchers},
	{key: "hostname-format", owner: older},
	{key: "upload-script", owner: older},
}

// providerImageTable is an entry of a provider's diskimages list: nodepool
// 10's schema for it (providers.[openstack].diskimages). The name is its first
// row: an entry without a usable one is not read further.
var providerImageTable = []spec[ProviderImage]{
	{key: keyName, owner: nodepools, need: "name a diskimage or zuul-image to upload here",
		read: func(r reader, pi *ProviderImage) { r.str(&pi.Name) }},
	{key: keyPause, owner: nodepools,
		read: func(r reader, pi *ProviderImage) { r.boolean(&pi.Pause) }},
	{key: "meta", owner: nodepools,
		read: func(r reader, pi *ProviderImage) { r.strMap(&pi.Meta, "hw_disk_bus: scsi") }},
	{key: "config-drive", owner: launchers},
	{key: "connection-type", owner: launchers},
	{key: "connection-port", owner: launchers},
}

// providers reads the providers list. Only openstack providers (the default
// driver) are kept; the others belong to nodepool's launcher and are left
// alone once they are known to be named mappings.
func (p *parser) providers(top *mapping, names imageNames) []Provider {
	items, ok := top.list(keyProviders, keyProviders, "[{name: cloud-a, cloud: mycloud}]")
	if !ok {
		return nil
	}
	var out []Provider
	seen := map[string]int{}
	for i, item := range items {
		path := indexPath(top.sub(keyProviders), i)
		if !p.isOpenStack(item, path) {
			continue
		}
		m, ok := p.readMapping(item, path, "a provider", keys(providerTable), true)
		if !ok {
			continue
		}
		pr := p.provider(m, names)
		if pr.Name == "" {
			continue
		}
		n, _ := m.get(keyName)
		if line, dup := seen[pr.Name]; dup {
			p.errorf(n, m.sub(keyName), "provider %q is defined twice (first on line %d); give each provider its own name", pr.Name, line)
			continue
		}
		seen[pr.Name] = n.Line
		out = append(out, pr)
	}
	return out
}

// isOpenStack reports whether a providers entry uses the openstack driver.
// Entries of other drivers are checked only for being mappings with a name.
func (p *parser) isOpenStack(item *yaml.Node, path string) bool {
	// A scratch parser peeks at the driver so that nothing is reported twice.
	known := keysWhere(providerTable, readByBuilder)
	peek, ok := (&parser{file: p.file}).readMapping(item, path, "a provider", known, false)
	if !ok {
		p.readMapping(item, path, "a provider", known, false)
		return false
	}
	if n, ok := peek.get(keyDriver); !ok || n.Kind == yaml.ScalarNode && n.Value == "openstack" {
		return true
	}
	m, _ := p.readMapping(item, path, "a provider", []string{keyName, keyDriver}, false)
	m.str(keyDriver)
	name, _ := specOf(providerTable, keyName)
	if m.require(keyName, name.need) {
		m.str(keyName)
	}
	return false
}

// provider reads an openstack provider; an older nodepool's key is warned of.
func (p *parser) provider(m *mapping, names imageNames) Provider {
	for _, key := range keysWhere(providerTable, func(s spec[providerEntry]) bool { return s.owner == older }) {
		if f, ok := m.fields[key]; ok {
			p.warnf(f.key, m.sub(key), "is an older nodepool's key: nodepool 10 reads it nowhere, and its config-validate "+
				"refuses it (\"extra keys not allowed\"); the builder ignores it too: remove it")
		}
	}
	e := defaults(providerTable)
	e.names = names
	readInto(m, providerTable, &e)
	return e.Provider
}

// providerImages reads a provider's diskimages list, whose names must be
// images this builder makes.
func (p *parser) providerImages(r reader, names imageNames) []ProviderImage {
	items, _ := r.m.list(r.key, "images", "[{name: debian-bookworm}]")
	var out []ProviderImage
	seen := map[string]int{}
	for i, item := range items {
		im, ok := p.readMapping(item, indexPath(r.path(), i), "a provider diskimages entry", keys(providerImageTable), true)
		if !ok {
			continue
		}
		var pi ProviderImage
		errs := len(p.errs)
		if readInto(im, providerImageTable[:1], &pi); len(p.errs) > errs {
			continue
		}
		readInto(im, providerImageTable[1:], &pi)
		n, _ := im.get(keyName)
		at := im.sub(keyName)
		def, known := names[pi.Name]
		switch {
		case !known:
			p.errorf(n, at, "%q is not a diskimage; define it under diskimages (where a zuul-image is declared too, as a diskimage of its name with pause: true), or fix the name", pi.Name)
			continue
		case def.kind == "abstract diskimage":
			p.errorf(n, at, "%q is an abstract diskimage, which is never built; list an image that has it as parent", pi.Name)
			continue
		}
		if line, dup := seen[pi.Name]; dup {
			p.errorf(n, at, "%q is listed twice in this provider (first on line %d); keep one entry", pi.Name, line)
			continue
		}
		seen[pi.Name] = n.Line
		out = append(out, pi)
	}
	return out
}

// checkNameFormat checks an image-name-format template: Python format syntax
// with "{{" and "}}" for literal braces, and only the placeholders we fill in.
func checkNameFormat(s string) error {
	known := "{" + strings.Join(nameFormatFields, "}, {") + "}"
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '{':
			if i+1 < len(s) && s[i+1] == '{' {
				i++
				continue
			}
			end := strings.IndexByte(s[i:], '}')
			if end < 0 {
				return fmt.Errorf("%q has a '{' without a closing '}'; write {{ for a literal brace", s)
			}
			field := s[i+1 : i+end]
			if !slices.Contains(nameFormatFields, field) {
				return fmt.Errorf("%q uses {%s}, which is not a placeholder; use %s", s, field, known)
			}
			i += end
		case '}':
			if i+1 < len(s) && s[i+1] == '}' {
				i++
				continue
			}
			return fmt.Errorf("%q has a '}' without an opening '{'; write }} for a literal brace", s)
		}
	}
	return nil
}
