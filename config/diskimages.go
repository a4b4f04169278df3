package config

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode"

	"gopkg.in/yaml.v3"
)

// Defaults of diskimages keys, as in nodepool.
const (
	DefaultRebuildAge   = 86400 * time.Second
	DefaultBuildTimeout = 28800 * time.Second
	DefaultDIBCmd       = "disk-image-create"
	DefaultUsername     = "zuul"
	DefaultPythonPath   = "auto"
)

// imageNames records where each image name was defined, so that names are
// unique across diskimages and zuul-images and references can be checked.
type imageNames map[string]imageDef

type imageDef struct {
	kind string // "diskimage", "abstract diskimage" or "zuul-image"
	file string
	line int
	path string // the key path of the name
	// declared is the line of a zuul-image's declaration in nodepool.yaml; 0
	// while there is none.
	declared int
}

// where says where a name was defined, for a message of p's file.
func (d imageDef) where(p *parser) string {
	if d.file == p.file {
		return fmt.Sprintf("on line %d", d.line)
	}
	return fmt.Sprintf("at %s:%d", d.file, d.line)
}

// claim records an image name, reporting a bad or repeated one.
func (p *parser) claim(names imageNames, n *yaml.Node, path, name, kind string) bool {
	if strings.ContainsFunc(name, func(r rune) bool { return r == '/' || unicode.IsSpace(r) || unicode.IsControl(r) }) ||
		name == "." || name == ".." {
		p.errorf(n, path, "%q cannot be an image name: image names are part of file names, so use no '/' or spaces", name)
		return false
	}
	if prev, dup := names[name]; dup {
		p.errorf(n, path, "%q is defined twice (first %s as a %s); image names must be unique across diskimages and zuul-images, so rename or remove one", name, prev.where(p), prev.kind)
		return false
	}
	names[name] = imageDef{kind: kind, file: p.file, line: n.Line, path: path}
	return true
}

// diskImageKeys are the keys of a diskimages entry: every key of nodepool 10's
// schema for it (its Configuration documentation, diskimages), all read here.
var diskImageKeys = []string{
	"name", "abstract", "parent", "elements", "env-vars", "formats", "keep-formats",
	"delete-after-upload", "release", "rebuild-age", "build-timeout", "pause",
	"dib-cmd", "username", "python-path", "shell-type", "metadata",
}

// diskImageEntry is one diskimages entry as written, before inheritance.
type diskImageEntry struct {
	own        DiskImage       // the values written in this entry
	set        map[string]bool // which keys were written
	abstract   bool
	path       string
	nameNode   *yaml.Node
	parentNode *yaml.Node
}

// diskImages reads the diskimages list and applies parent/abstract
// inheritance. Abstract images are left out of the result, and so are the
// entries named after a zuul-image: those declare it to nodepool, and are
// recorded on it.
func (p *parser) diskImages(top *mapping, names imageNames, zuul []ZuulImage) []DiskImage {
	items, ok := top.list("diskimages", "diskimages", "[{name: debian, elements: [debian-minimal]}]")
	if !ok {
		return nil
	}
	var entries []*diskImageEntry
	byName := map[string]*diskImageEntry{}
	for i, item := range items {
		e := p.diskImageEntry(item, indexPath(top.sub("diskimages"), i))
		if e == nil {
			continue
		}
		if def, ok := names[e.own.Name]; ok && def.kind == "zuul-image" {
			if zi := zuulImageNamed(zuul, e.own.Name); zi != nil {
				p.declaration(e, zi, names)
			}
			continue
		}
		entries = append(entries, e)
		if e.own.Name == "" {
			continue
		}
		kind := "diskimage"
		if e.abstract {
			kind = "abstract diskimage"
		}
		if p.claim(names, e.nameNode, childPath(e.path, "name"), e.own.Name, kind) {
			byName[e.own.Name] = e
		}
	}
	return p.inherit(entries, byName, names)
}

func zuulImageNamed(zuul []ZuulImage, name string) *ZuulImage {
	for i := range zuul {
		if zuul[i].Name == name {
			return &zuul[i]
		}
	}
	return nil
}

// declarationKeys are the keys a zuul-image's declaration may hold: its name,
// nodepool's pause, and how nodepool-launcher connects to the nodes it boots
// from the image, which the upload records carry to it.
var declarationKeys = []string{"name", "pause", "username", "python-path", "shell-type"}

// declaration checks a diskimages entry named after a zuul-image, which
// declares it to nodepool: it holds no diskimage-builder settings, and pause:
// true keeps every Python nodepool-builder reading the file from building it.
// Its connection settings are recorded on the zuul-image.
func (p *parser) declaration(e *diskImageEntry, zi *ZuulImage, names imageNames) {
	def := names[zi.Name]
	at := childPath(e.path, "name")
	if def.declared != 0 {
		p.errorf(e.nameNode, at, "zuul-image %q is declared twice (first on line %d); keep one entry", zi.Name, def.declared)
		return
	}
	def.declared = e.nameNode.Line
	names[zi.Name] = def
	var dib []string
	for _, key := range diskImageKeys {
		if e.set[key] && !slices.Contains(declarationKeys, key) {
			dib = append(dib, key)
		}
	}
	if len(dib) > 0 {
		p.errorf(e.nameNode, at, "%q is a zuul-image (defined %s), so this entry declares it to nodepool, but it also holds "+
			"diskimage-builder settings (%s): whether the image is built here or fetched from Zuul would be unclear. "+
			"Remove them (a zuul-image's formats and metadata are set on the zuul-image), or rename one of the two",
			zi.Name, def.where(p), strings.Join(dib, ", "))
	}
	if !e.own.Pause {
		p.errorf(e.nameNode, at, "declares zuul-image %q to nodepool, and needs pause: true so that a Python "+
			"nodepool-builder reading this file never builds it with diskimage-builder; add pause: true (the "+
			"zuul-image's own pause is its key in %s, or image-pause)", zi.Name, def.file)
	}
	d := baseDiskImage()
	e.applyTo(&d)
	zi.Declared = true
	zi.Username, zi.PythonPath, zi.ShellType = d.Username, d.PythonPath, d.ShellType
}

func (p *parser) diskImageEntry(item *yaml.Node, path string) *diskImageEntry {
	m, ok := p.readMapping(item, path, "a diskimage", diskImageKeys, true)
	if !ok {
		return nil
	}
	e := &diskImageEntry{path: path, set: map[string]bool{}}
	d := &e.own
	if m.require("name", "give every diskimage a name") {
		d.Name, _ = m.str("name")
		e.nameNode, _ = m.get("name")
	}
	e.abstract, _ = m.boolean("abstract")
	if n, ok := m.get("parent"); ok {
		d.Parent, _ = m.str("parent")
		e.parentNode = n
	}
	d.Elements, _ = m.strList("elements", "diskimage-builder elements", "[debian-minimal, vm]")
	d.EnvVars, _ = m.strMap("env-vars", "DIB_RELEASE: bookworm")
	d.Formats, _ = m.formats("formats")
	d.KeepFormats, _ = m.formats("keep-formats")
	d.DeleteAfterUpload, _ = m.boolean("delete-after-upload")
	d.Release, _ = p.release(m)
	d.RebuildAge, _ = m.seconds("rebuild-age", true)
	d.BuildTimeout, _ = m.seconds("build-timeout", false)
	d.Pause, _ = m.boolean("pause")
	d.DIBCmd, _ = m.str("dib-cmd")
	d.Username, _ = m.str("username")
	d.PythonPath, _ = m.str("python-path")
	if v, ok := m.str("shell-type"); ok {
		d.ShellType = v
		n, _ := m.get("shell-type")
		p.warnf(n, m.sub("shell-type"), "nodepool's launcher reads it, but nodepool 10's config-validate refuses it "+
			"(its schema lacks the key): leave it out where that check runs on this file")
	}
	d.Metadata, _ = m.strMap("metadata", "os_distro: debian")
	// A key with a bad value counts as set: its error already fails the load.
	for _, key := range diskImageKeys {
		if m.has(key) {
			e.set[key] = true
		}
	}
	return e
}

// release accepts a name or a number, as nodepool does: "release: 9" is
// common and must reach DIB_RELEASE as the text 9.
func (p *parser) release(m *mapping) (string, bool) {
	n, ok := m.get("release")
	if !ok {
		return "", false
	}
	tag := n.ShortTag()
	if n.Kind != yaml.ScalarNode || (tag != "!!str" && tag != "!!int" && tag != "!!float") {
		p.errorf(n, m.sub("release"), "expected a release name or number like bookworm or 12, not %s", p.describe(n))
		return "", false
	}
	return n.Value, true
}

// baseDiskImage holds nodepool's defaults, where an image without a parent starts.
func baseDiskImage() DiskImage {
	return DiskImage{
		RebuildAge:   DefaultRebuildAge,
		BuildTimeout: DefaultBuildTimeout,
		DIBCmd:       DefaultDIBCmd,
		Username:     DefaultUsername,
		PythonPath:   DefaultPythonPath,
	}
}

// cloneDiskImage copies d so that a child's slices and maps are its own.
func cloneDiskImage(d DiskImage) DiskImage {
	d.Elements = slices.Clone(d.Elements)
	d.EnvVars = maps.Clone(d.EnvVars)
	d.Formats = slices.Clone(d.Formats)
	d.KeepFormats = slices.Clone(d.KeepFormats)
	d.Metadata = maps.Clone(d.Metadata)
	return d
}

// applyTo lays the entry over d, which holds its parent's resolved values:
// elements append, env-vars merge with the entry winning, the rest replace.
func (e *diskImageEntry) applyTo(d *DiskImage) {
	d.Name = e.own.Name
	d.Parent = e.own.Parent
	if e.set["elements"] {
		d.Elements = append(slices.Clone(d.Elements), e.own.Elements...)
	}
	if e.set["env-vars"] {
		merged := maps.Clone(d.EnvVars)
		if merged == nil {
			merged = map[string]string{}
		}
		maps.Copy(merged, e.own.EnvVars)
		d.EnvVars = merged
	}
	replace := func(key string, apply func()) {
		if e.set[key] {
			apply()
		}
	}
	replace("formats", func() { d.Formats = slices.Clone(e.own.Formats) })
	replace("keep-formats", func() { d.KeepFormats = slices.Clone(e.own.KeepFormats) })
	replace("delete-after-upload", func() { d.DeleteAfterUpload = e.own.DeleteAfterUpload })
	replace("release", func() { d.Release = e.own.Release })
	replace("rebuild-age", func() { d.RebuildAge = e.own.RebuildAge })
	replace("build-timeout", func() { d.BuildTimeout = e.own.BuildTimeout })
	replace("pause", func() { d.Pause = e.own.Pause })
	replace("dib-cmd", func() { d.DIBCmd = e.own.DIBCmd })
	replace("username", func() { d.Username = e.own.Username })
	replace("python-path", func() { d.PythonPath = e.own.PythonPath })
	replace("shell-type", func() { d.ShellType = e.own.ShellType })
	replace("metadata", func() { d.Metadata = maps.Clone(e.own.Metadata) })
}

// inherit resolves every entry against its parent chain and returns the
// concrete images in file order.
func (p *parser) inherit(entries []*diskImageEntry, byName map[string]*diskImageEntry, names imageNames) []DiskImage {
	const (
		unvisited = iota
		visiting
		done
		failed
	)
	state := map[*diskImageEntry]int{}
	resolved := map[*diskImageEntry]DiskImage{}

	var resolveEntry func(e *diskImageEntry, chain []string) bool
	resolveEntry = func(e *diskImageEntry, chain []string) bool {
		switch state[e] {
		case done:
			return true
		case failed:
			return false
		case visiting:
			cycle := append(chain[slices.Index(chain, e.own.Name):], e.own.Name)
			p.errorf(e.parentNode, childPath(e.path, "parent"), "parents form a cycle (%s); one image in it must have no parent", strings.Join(cycle, " -> "))
			state[e] = failed
			return false
		}
		state[e] = visiting
		d := baseDiskImage()
		if e.own.Parent != "" {
			parent, ok := byName[e.own.Parent]
			if def := names[e.own.Parent]; !ok && def.kind == "zuul-image" {
				p.errorf(e.parentNode, childPath(e.path, "parent"), "%q is a zuul-image, which is fetched from Zuul and cannot be a parent; name a diskimage, or remove parent", e.own.Parent)
				state[e] = failed
				return false
			}
			if !ok {
				p.errorf(e.parentNode, childPath(e.path, "parent"), "%q is not a diskimage; name one defined under diskimages, or remove parent", e.own.Parent)
				state[e] = failed
				return false
			}
			if !resolveEntry(parent, append(chain, e.own.Name)) {
				state[e] = failed
				return false
			}
			d = cloneDiskImage(resolved[parent])
		}
		e.applyTo(&d)
		resolved[e] = d
		state[e] = done
		return true
	}

	var out []DiskImage
	for _, e := range entries {
		if byName[e.own.Name] != e {
			continue // unnamed or a duplicate: already reported
		}
		if resolveEntry(e, nil) && !e.abstract {
			out = append(out, resolved[e])
		}
	}
	return out
}
