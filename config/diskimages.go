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

// diskImageTable is a diskimages entry: every key of nodepool 10's schema
// for it (its Configuration documentation, diskimages), all read here. An
// entry is read as written; what it inherits of its parent is laid over by
// each key's row.
var diskImageTable = []spec[diskImageEntry]{
	{key: keyName, owner: nodepools, declares: true, need: "give every diskimage a name",
		read: func(r reader, e *diskImageEntry) {
			r.str(&e.Name)
			e.nameNode, _ = r.node()
		}},
	{key: "abstract", owner: nodepools,
		read: func(r reader, e *diskImageEntry) { r.boolean(&e.abstract) }},
	{key: "parent", owner: nodepools,
		read: func(r reader, e *diskImageEntry) {
			if n, ok := r.node(); ok {
				r.str(&e.Parent)
				e.parentNode, e.parentPath = n, r.path()
			}
		}},
	{key: "elements", owner: nodepools,
		read: func(r reader, e *diskImageEntry) {
			r.strList(&e.Elements, "diskimage-builder elements", "[debian-minimal, vm]")
		},
		lay: func(into, e *diskImageEntry) { into.Elements = append(slices.Clone(into.Elements), e.Elements...) }},
	{key: keyEnvVars, owner: nodepools,
		read: func(r reader, e *diskImageEntry) { r.strMap(&e.EnvVars, "DIB_RELEASE: bookworm") },
		// The entry's variables win over those it inherits.
		lay: func(into, e *diskImageEntry) {
			merged := maps.Clone(into.EnvVars)
			if merged == nil {
				merged = map[string]string{}
			}
			maps.Copy(merged, e.EnvVars)
			into.EnvVars = merged
		}},
	{key: keyFormats, owner: nodepools,
		read: func(r reader, e *diskImageEntry) { r.formats(&e.Formats) },
		lay:  func(into, e *diskImageEntry) { into.Formats = slices.Clone(e.Formats) }},
	{key: "keep-formats", owner: nodepools,
		read: func(r reader, e *diskImageEntry) { r.formats(&e.KeepFormats) },
		lay:  func(into, e *diskImageEntry) { into.KeepFormats = slices.Clone(e.KeepFormats) }},
	{key: "delete-after-upload", owner: nodepools,
		read: func(r reader, e *diskImageEntry) { r.boolean(&e.DeleteAfterUpload) },
		lay:  func(into, e *diskImageEntry) { into.DeleteAfterUpload = e.DeleteAfterUpload }},
	{key: "release", owner: nodepools,
		read: func(r reader, e *diskImageEntry) { r.m.p.release(r, &e.Release) },
		lay:  func(into, e *diskImageEntry) { into.Release = e.Release }},
	{key: "rebuild-age", owner: nodepools,
		init: func(e *diskImageEntry) { e.RebuildAge = DefaultRebuildAge },
		read: func(r reader, e *diskImageEntry) { r.seconds(&e.RebuildAge, true) },
		lay:  func(into, e *diskImageEntry) { into.RebuildAge = e.RebuildAge }},
	{key: "build-timeout", owner: nodepools,
		init: func(e *diskImageEntry) { e.BuildTimeout = DefaultBuildTimeout },
		read: func(r reader, e *diskImageEntry) { r.seconds(&e.BuildTimeout, false) },
		lay:  func(into, e *diskImageEntry) { into.BuildTimeout = e.BuildTimeout }},
	{key: keyPause, owner: nodepools, declares: true,
		read: func(r reader, e *diskImageEntry) { r.boolean(&e.Pause) },
		lay:  func(into, e *diskImageEntry) { into.Pause = e.Pause }},
	{key: "dib-cmd", owner: nodepools,
		init: func(e *diskImageEntry) { e.DIBCmd = DefaultDIBCmd },
		read: func(r reader, e *diskImageEntry) { r.str(&e.DIBCmd) },
		lay:  func(into, e *diskImageEntry) { into.DIBCmd = e.DIBCmd }},
	{key: keyUsername, owner: nodepools, declares: true,
		init: func(e *diskImageEntry) { e.Username = DefaultUsername },
		read: func(r reader, e *diskImageEntry) { r.str(&e.Username) },
		lay:  func(into, e *diskImageEntry) { into.Username = e.Username }},
	{key: "python-path", owner: nodepools, declares: true,
		init: func(e *diskImageEntry) { e.PythonPath = DefaultPythonPath },
		read: func(r reader, e *diskImageEntry) { r.str(&e.PythonPath) },
		lay:  func(into, e *diskImageEntry) { into.PythonPath = e.PythonPath }},
	{key: "shell-type", owner: nodepools, declares: true,
		read: func(r reader, e *diskImageEntry) {
			if v, ok := r.m.str(r.key); ok {
				e.ShellType = v
				r.warnf("nodepool's launcher reads it, but nodepool 10's config-validate refuses it " +
					"(its schema lacks the key): leave it out where that check runs on this file")
			}
		},
		lay: func(into, e *diskImageEntry) { into.ShellType = e.ShellType }},
	{key: keyMetadata, owner: nodepools,
		read: func(r reader, e *diskImageEntry) { r.strMap(&e.Metadata, "os_distro: debian") },
		lay:  func(into, e *diskImageEntry) { into.Metadata = maps.Clone(e.Metadata) }},
}

// diskImageEntry is one diskimages entry as written, before inheritance.
type diskImageEntry struct {
	DiskImage                 // the values written in this entry
	set       map[string]bool // which keys were written
	abstract  bool
	path      string
	nameNode  *yaml.Node
	// parentNode and parentPath are where the parent is named.
	parentNode *yaml.Node
	parentPath string
}

// diskImages reads the diskimages list and applies parent/abstract
// inheritance. Abstract images are left out of the result, and so are the
// entries named after a zuul-image: those declare it to nodepool, and are
// recorded on it.
func (p *parser) diskImages(top *mapping, names imageNames, zuul []ZuulImage) []DiskImage {
	items, ok := top.list(keyDiskImages, keyDiskImages, "[{name: debian, elements: [debian-minimal]}]")
	if !ok {
		return nil
	}
	var entries []*diskImageEntry
	byName := map[string]*diskImageEntry{}
	for i, item := range items {
		e := p.diskImageEntry(item, indexPath(top.sub(keyDiskImages), i))
		if e == nil {
			continue
		}
		if def, ok := names[e.Name]; ok && def.kind == "zuul-image" {
			if zi := zuulImageNamed(zuul, e.Name); zi != nil {
				p.declaration(e, zi, names)
			}
			continue
		}
		entries = append(entries, e)
		if e.Name == "" {
			continue
		}
		kind := "diskimage"
		if e.abstract {
			kind = "abstract diskimage"
		}
		if p.claim(names, e.nameNode, childPath(e.path, keyName), e.Name, kind) {
			byName[e.Name] = e
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

// declaration checks a diskimages entry named after a zuul-image, which
// declares it to nodepool: it holds no diskimage-builder settings, and pause:
// true keeps every Python nodepool-builder reading the file from building it.
// Its connection settings are recorded on the zuul-image.
func (p *parser) declaration(e *diskImageEntry, zi *ZuulImage, names imageNames) {
	def := names[zi.Name]
	at := childPath(e.path, keyName)
	if def.declared != 0 {
		p.errorf(e.nameNode, at, "zuul-image %q is declared twice (first on line %d); keep one entry", zi.Name, def.declared)
		return
	}
	def.declared = e.nameNode.Line
	names[zi.Name] = def
	dib := keysWhere(diskImageTable, func(s spec[diskImageEntry]) bool { return e.set[s.key] && !s.declares })
	if len(dib) > 0 {
		p.errorf(e.nameNode, at, "%q is a zuul-image (defined %s), so this entry declares it to nodepool, but it also holds "+
			"diskimage-builder settings (%s): whether the image is built here or fetched from Zuul would be unclear. "+
			"Remove them (a zuul-image's formats and metadata are set on the zuul-image), or rename one of the two",
			zi.Name, def.where(p), strings.Join(dib, ", "))
	}
	if !e.Pause {
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
	m, ok := p.readMapping(item, path, "a diskimage", keys(diskImageTable), true)
	if !ok {
		return nil
	}
	e := &diskImageEntry{path: path, set: map[string]bool{}}
	readInto(m, diskImageTable, e)
	// A key with a bad value counts as set: its error already fails the load.
	for _, s := range diskImageTable {
		if m.has(s.key) {
			e.set[s.key] = true
		}
	}
	return e
}

// release accepts a name or a number, as nodepool does: "release: 9" is
// common and must reach DIB_RELEASE as the text 9.
func (p *parser) release(r reader, dst *string) {
	n, ok := r.node()
	if !ok {
		return
	}
	tag := n.ShortTag()
	if n.Kind != yaml.ScalarNode || (tag != "!!str" && tag != "!!int" && tag != "!!float") {
		r.errorf("expected a release name or number like bookworm or 12, not %s", p.describe(n))
		return
	}
	*dst = n.Value
}

// baseDiskImage holds nodepool's defaults, where an image without a parent starts.
func baseDiskImage() DiskImage { return defaults(diskImageTable).DiskImage }

// cloneDiskImage copies d so that a child's slices and maps are its own.
func cloneDiskImage(d DiskImage) DiskImage {
	d.Elements = slices.Clone(d.Elements)
	d.EnvVars = maps.Clone(d.EnvVars)
	d.Formats = slices.Clone(d.Formats)
	d.KeepFormats = slices.Clone(d.KeepFormats)
	d.Metadata = maps.Clone(d.Metadata)
	return d
}

// applyTo lays the entry over d, which holds its parent's resolved values,
// as each key's row lays it. The name and the parent are the entry's own.
func (e *diskImageEntry) applyTo(d *DiskImage) {
	into := diskImageEntry{DiskImage: *d}
	into.Name, into.Parent = e.Name, e.Parent
	for _, s := range diskImageTable {
		if s.lay != nil && e.set[s.key] {
			s.lay(&into, e)
		}
	}
	*d = into.DiskImage
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
			cycle := append(chain[slices.Index(chain, e.Name):], e.Name)
			p.errorf(e.parentNode, e.parentPath, "parents form a cycle (%s); one image in it must have no parent", strings.Join(cycle, " -> "))
			state[e] = failed
			return false
		}
		state[e] = visiting
		d := baseDiskImage()
		if e.Parent != "" {
			parent, ok := byName[e.Parent]
			if def := names[e.Parent]; !ok && def.kind == "zuul-image" {
				p.errorf(e.parentNode, e.parentPath, "%q is a zuul-image, which is fetched from Zuul and cannot be a parent; name a diskimage, or remove parent", e.Parent)
				state[e] = failed
				return false
			}
			if !ok {
				p.errorf(e.parentNode, e.parentPath, "%q is not a diskimage; name one defined under diskimages, or remove parent", e.Parent)
				state[e] = failed
				return false
			}
			if !resolveEntry(parent, append(chain, e.Name)) {
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
		if byName[e.Name] != e {
			continue // unnamed or a duplicate: already reported
		}
		if resolveEntry(e, nil) && !e.abstract {
			out = append(out, resolved[e])
		}
	}
	return out
}
