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

// providerKeys are the openstack provider keys this builder reads.
var providerKeys = []string{
	"name", "driver", "cloud", "region-name", "image-format", "image-name-format",
	"image-upload-timeout", "post-upload-hook", "rate", "diskimages",
}

// providerNodepoolKeys are the rest of nodepool 10's openstack driver schema
// (its OpenStack driver documentation, providers.[openstack], and the schema
// of nodepool's config-validate): the launcher's keys, accepted and ignored;
// and providerOldKeys. What pools and cloud-images hold is the launcher's to
// check.
var providerNodepoolKeys = append([]string{
	"max-concurrency", "priority", "boot-timeout", "launch-timeout", "launch-retries", "nodepool-id",
	"clean-floating-ips", "port-cleanup-interval", "pools", "cloud-images",
}, providerOldKeys...)

// providerOldKeys are older nodepools' provider keys, which nodepool 10 reads
// nowhere and its config-validate refuses: accepted with a warning, as a file
// that older launchers read may still hold them.
var providerOldKeys = []string{"hostname-format", "upload-script"}

// providerImageKeys are the keys of a provider's diskimages entry this
// builder reads.
var providerImageKeys = []string{"name", "pause", "meta"}

// providerImageNodepoolKeys are the rest of nodepool 10's schema for that
// entry (providers.[openstack].diskimages): the launcher's, accepted and ignored.
var providerImageNodepoolKeys = []string{"config-drive", "connection-type", "connection-port"}

// providers reads the providers list. Only openstack providers (the default
// driver) are kept; the others belong to nodepool's launcher and are left
// alone once they are known to be named mappings.
func (p *parser) providers(top *mapping, names imageNames) []Provider {
	items, ok := top.list("providers", "providers", "[{name: cloud-a, cloud: mycloud}]")
	if !ok {
		return nil
	}
	var out []Provider
	seen := map[string]int{}
	for i, item := range items {
		path := indexPath(top.sub("providers"), i)
		if !p.isOpenStack(item, path) {
			continue
		}
		m, ok := p.readMapping(item, path, "a provider", slices.Concat(providerKeys, providerNodepoolKeys), true)
		if !ok {
			continue
		}
		pr := p.provider(m, names)
		if pr.Name == "" {
			continue
		}
		if line, dup := seen[pr.Name]; dup {
			n, _ := m.get("name")
			p.errorf(n, m.sub("name"), "provider %q is defined twice (first on line %d); give each provider its own name", pr.Name, line)
			continue
		}
		n, _ := m.get("name")
		seen[pr.Name] = n.Line
		out = append(out, pr)
	}
	return out
}

// isOpenStack reports whether a providers entry uses the openstack driver.
// Entries of other drivers are checked only for being mappings with a name.
func (p *parser) isOpenStack(item *yaml.Node, path string) bool {
	// A scratch parser peeks at the driver so that nothing is reported twice.
	peek, ok := (&parser{file: p.file}).readMapping(item, path, "a provider", providerKeys, false)
	if !ok {
		p.readMapping(item, path, "a provider", providerKeys, false)
		return false
	}
	if n, ok := peek.get("driver"); !ok || n.Kind == yaml.ScalarNode && n.Value == "openstack" {
		return true
	}
	m, _ := p.readMapping(item, path, "a provider", []string{"name", "driver"}, false)
	m.str("driver")
	if m.require("name", "give every provider a name") {
		m.str("name")
	}
	return false
}

func (p *parser) provider(m *mapping, names imageNames) Provider {
	pr := Provider{
		ImageNameFormat:    DefaultImageNameFormat,
		ImageUploadTimeout: DefaultImageUploadTimeout,
		Rate:               DefaultRate,
	}
	if m.require("name", "give every provider a name") {
		pr.Name, _ = m.str("name")
	}
	if m.require("cloud", "name the clouds.yaml entry of the cloud to upload to, e.g. cloud: mycloud") {
		pr.Cloud, _ = m.str("cloud")
	}
	pr.RegionName, _ = m.str("region-name")
	for _, key := range providerOldKeys {
		if f, ok := m.fields[key]; ok {
			p.warnf(f.key, m.sub(key), "is an older nodepool's key: nodepool 10 reads it nowhere, and its config-validate "+
				"refuses it (\"extra keys not allowed\"); the builder ignores it too: remove it")
		}
	}
	if n, ok := m.get("image-format"); ok {
		pr.ImageFormat, _ = p.checkFormat(n, m.sub("image-format"))
		p.warnf(n, m.sub("image-format"), "is not a key of nodepool 10's providers, and nodepool's config-validate "+
			"refuses it: nodepool's builders and launchers take a provider's format from its cloud's image_format in "+
			"clouds.yaml, which this builder reads too; set it there")
	}
	if s, ok := m.str("image-name-format"); ok {
		if err := checkNameFormat(s); err != nil {
			n, _ := m.get("image-name-format")
			p.errorf(n, m.sub("image-name-format"), "%v", err)
		} else {
			pr.ImageNameFormat = s
		}
	}
	if v, ok := m.seconds("image-upload-timeout", false); ok {
		pr.ImageUploadTimeout = v
	}
	pr.PostUploadHook, _ = m.str("post-upload-hook")
	if v, ok := m.number("rate", "a number of seconds to wait between API calls, like 1.0"); ok {
		pr.Rate = v
	}
	pr.DiskImages = p.providerImages(m, names)
	return pr
}

// providerImages reads a provider's diskimages list, whose names must be
// images this builder makes.
func (p *parser) providerImages(m *mapping, names imageNames) []ProviderImage {
	items, _ := m.list("diskimages", "images", "[{name: debian-bookworm}]")
	var out []ProviderImage
	seen := map[string]int{}
	for i, item := range items {
		path := indexPath(m.sub("diskimages"), i)
		im, ok := p.readMapping(item, path, "a provider diskimages entry", slices.Concat(providerImageKeys, providerImageNodepoolKeys), true)
		if !ok {
			continue
		}
		var pi ProviderImage
		if !im.require("name", "name a diskimage or zuul-image to upload here") {
			continue
		}
		n, _ := im.get("name")
		if pi.Name, ok = im.str("name"); !ok {
			continue
		}
		pi.Pause, _ = im.boolean("pause")
		pi.Meta, _ = im.strMap("meta", "hw_disk_bus: scsi")
		def, known := names[pi.Name]
		switch {
		case !known:
			p.errorf(n, im.sub("name"), "%q is not a diskimage; define it under diskimages (where a zuul-image is declared too, as a diskimage of its name with pause: true), or fix the name", pi.Name)
			continue
		case def.kind == "abstract diskimage":
			p.errorf(n, im.sub("name"), "%q is an abstract diskimage, which is never built; list an image that has it as parent", pi.Name)
			continue
		}
		if line, dup := seen[pi.Name]; dup {
			p.errorf(n, im.sub("name"), "%q is listed twice in this provider (first on line %d); keep one entry", pi.Name, line)
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
