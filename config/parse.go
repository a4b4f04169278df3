package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"gopkg.in/yaml.v3"
)

// Defaults of top-level keys, as in nodepool.
const (
	DefaultBuildLogDir       = "/var/log/nodepool/builds"
	DefaultBuildLogRetention = 7
	// DefaultWebappPort and DefaultWebappAddress are nodepool-launcher's,
	// for its webapp section.
	DefaultWebappPort    = 8005
	DefaultWebappAddress = "0.0.0.0"
)

// Parse validates the text of a one-file config: nodepool.yaml holding the
// builder's own settings too, as configs did before the builder's own file.
// file names it in errors. Every %(NODEPOOL_FOO) in the text is first replaced
// by getenv("NODEPOOL_FOO"), as nodepool does; a nil getenv reads the process
// environment. On failure the error is an Errors holding every problem found.
func Parse(file string, data []byte, getenv func(string) (string, bool)) (*Config, error) {
	return ParseFiles(Text{Name: file, Data: data}, nil, nil, getenv)
}

// ParseFiles validates nodepool.yaml, the builder's own file (nil when there
// is none) and nodepool's secure file (nil when there is none) as Parse
// validates one file; the secure file's settings are laid over nodepool.yaml's
// as nodepool's loadSecureConfig does (see secure). The errors name the file
// each is in, nodepool.yaml's first.
func ParseFiles(nodepool Text, own, secure *Text, getenv func(string) (string, bool)) (*Config, error) {
	if getenv == nil {
		getenv = os.LookupEnv
	}
	const restore = "restore it from where it is managed (a builder file meant to hold nothing can be removed)"
	np := &parser{file: nodepool.Name}
	npRoot, ok := np.document(nodepool.Data, getenv, restore)
	bp := &parser{}
	var ownRoot *yaml.Node
	if own != nil {
		bp.file = own.Name
		var ownOK bool
		ownRoot, ownOK = bp.document(own.Data, getenv, restore)
		ok = ok && ownOK
	}
	// The secure file's values are secrets: its problems quote none of them.
	sp := &parser{hideValues: true}
	var secureRoot *yaml.Node
	if secure != nil {
		sp.file = secure.Name
		var secureOK bool
		secureRoot, secureOK = sp.document(secure.Data, getenv, "restore it from where it is managed (without a secure file, leave out -s)")
		ok = ok && secureOK
	}
	var cfg *Config
	if ok {
		cfg = assemble(np, npRoot, bp, ownRoot, own != nil, sp, secureRoot)
		cfg.Path = nodepool.Name
		if own != nil {
			cfg.BuilderPath = own.Name
		}
		if secure != nil {
			cfg.SecurePath = secure.Name
		}
	}
	if errs := slices.Concat(np.errs.sorted(), bp.errs.sorted(), sp.errs.sorted()); len(errs) > 0 {
		return nil, errs
	}
	return cfg, nil
}

// document substitutes the environment into one file's text and decodes it.
// false means it could not be read; its problems are recorded. emptyHint says
// what to do about a file that holds nothing.
func (p *parser) document(data []byte, getenv func(string) (string, bool), emptyHint string) (*yaml.Node, bool) {
	text, unset := substitute(data, getenv)
	lines := strings.Split(string(text), "\n")
	root, err := decode(text)
	if err != nil {
		for _, u := range unset {
			p.errorf(&yaml.Node{Line: u.line}, sectionAt(lines, u.line), "%s", u.msg())
		}
		var ed extraDocument
		if errors.As(err, &ed) {
			p.errorf(&yaml.Node{Line: ed.line}, "", "a second YAML document starts here, but a config is one document; remove the '---' line and merge the documents")
		} else {
			p.syntaxError(text, lines, err)
		}
		return nil, false
	}
	if isNull(root) {
		// What a file cut short by a full disk or an interrupted write looks
		// like: taken as a config without images, it would have every upload
		// of theirs deleted; a secure file taken so would drop the ZooKeeper
		// servers it names, and the state with them.
		p.errorf(&yaml.Node{Line: 1}, "", "holds no config (it is empty, or only comments or a null document), which is what a file "+
			"cut short looks like; %s", emptyHint)
		return nil, false
	}
	if len(unset) > 0 {
		// The rest of the file was read with the variables left empty, so its
		// problems would be echoes of these ones.
		for _, u := range unset {
			path := pathAtLine(root, u.line)
			if path == "" {
				path = sectionAt(lines, u.line)
			}
			p.errorf(&yaml.Node{Line: u.line}, path, "%s", u.msg())
		}
		return nil, false
	}
	return root, true
}

// extraDocument reports a second YAML document in the file, which nodepool's
// loader refuses too.
type extraDocument struct{ line int }

func (e extraDocument) Error() string { return "more than one YAML document" }

// decode parses the one YAML document in text and returns its root node,
// nil for an empty file.
func decode(text []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(text))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, err
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case errors.Is(err, io.EOF):
	case err != nil:
		return nil, err
	default:
		return nil, extraDocument{line: extra.Line}
	}
	if len(doc.Content) == 0 {
		return nil, nil
	}
	return doc.Content[0], nil
}

// envRE matches nodepool's substitution syntax. Only NODEPOOL_ variables are
// substituted, so that the rest of the environment cannot leak into the file.
var envRE = regexp.MustCompile(`%\((NODEPOOL_[A-Za-z0-9_]*)\)`)

type unsetVar struct {
	name string
	line int
}

func (u unsetVar) msg() string {
	return fmt.Sprintf("environment variable %s is not set; export it before starting, or write the value in place of %%(%s)", u.name, u.name)
}

// substitute replaces %(NODEPOOL_FOO) by the variable's value. An unset
// variable becomes empty and is returned with its line. Line numbers of
// later text shift if a value holds newlines; nodepool has the same effect.
func substitute(data []byte, getenv func(string) (string, bool)) ([]byte, []unsetVar) {
	var unset []unsetVar
	var out bytes.Buffer
	last := 0
	for _, loc := range envRE.FindAllSubmatchIndex(data, -1) {
		out.Write(data[last:loc[0]])
		last = loc[1]
		name := string(data[loc[2]:loc[3]])
		v, ok := getenv(name)
		if !ok {
			unset = append(unset, unsetVar{name: name, line: 1 + bytes.Count(data[:loc[0]], []byte("\n"))})
			continue
		}
		out.WriteString(v)
	}
	out.Write(data[last:])
	return out.Bytes(), unset
}

// pathAtLine finds the key path of the deepest value that starts on line.
func pathAtLine(n *yaml.Node, line int) string {
	var found string
	var walk func(n *yaml.Node, path string, depth int)
	walk = func(n *yaml.Node, path string, depth int) {
		if n == nil || depth > 64 {
			return
		}
		switch n.Kind {
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i], n.Content[i+1]
				p := childPath(path, k.Value)
				if k.Line == line || v.Line == line {
					found = p
				}
				walk(v, p, depth+1)
			}
		case yaml.SequenceNode:
			for i, item := range n.Content {
				p := indexPath(path, i)
				if item.Line == line && item.Kind == yaml.ScalarNode {
					found = p
				}
				walk(item, p, depth+1)
			}
		}
	}
	walk(n, "", 0)
	return found
}

var (
	yamlLineRE   = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)
	yamlAnchorRE = regexp.MustCompile(`^yaml: unknown anchor '(.*)' referenced$`)
	topKeyRE     = regexp.MustCompile(`^([A-Za-z0-9_.-]+)\s*:`)
)

// parserProblems are the problems yaml.v3's parser (as opposed to its scanner)
// reports; for these it prints a 0-based line, so one is added.
var parserProblems = []string{
	"did not find expected key",
	"did not find expected '-' indicator",
	"did not find expected node content",
	"did not find expected ',' or ']'",
	"did not find expected ',' or '}'",
	"did not find expected <document start>",
	"did not find expected <stream-start>",
	"found undefined tag handle",
	"found duplicate %YAML directive",
	"found incompatible YAML document",
	"found duplicate %TAG directive",
}

// syntaxError turns a YAML error into an Error with the line it is on and the
// top-level section around it.
func (p *parser) syntaxError(text []byte, lines []string, err error) {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	hint := "check the indentation and quoting of this line and the lines just above it"
	line := 1 // yaml.v3 prints no line when both of its marks are on the first
	if m := yamlLineRE.FindStringSubmatch(err.Error()); m != nil {
		line, _ = strconv.Atoi(m[1])
		msg = m[2]
		if slices.Contains(parserProblems, msg) {
			line++
		}
	} else if m := yamlAnchorRE.FindStringSubmatch(err.Error()); m != nil {
		line = lineOf(lines, func(s string) bool { return strings.Contains(s, "*"+m[1]) })
		msg = fmt.Sprintf("alias *%s refers to no anchor", m[1])
		hint = fmt.Sprintf("define &%s before using it", m[1])
	} else if !utf8.Valid(text) {
		line = lineOf(lines, func(s string) bool { return !utf8.ValidString(s) })
		msg, hint = "the file is not valid UTF-8", "save it as UTF-8"
	} else if strings.Contains(msg, "control characters") {
		line = lineOf(lines, func(s string) bool {
			return strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 && r != '\t' && r != '\r' })
		})
		hint = "remove the control character from this line"
	}
	line = min(max(line, 1), len(lines))
	if strings.HasPrefix(strings.TrimLeft(lines[line-1], " "), "\t") {
		hint = "indent with spaces: YAML does not allow tabs there"
	}
	p.errorf(&yaml.Node{Line: line}, sectionAt(lines, line), "YAML syntax error: %s; %s", msg, hint)
}

// lineOf returns the 1-based number of the first line for which match is true, or 0.
func lineOf(lines []string, match func(string) bool) int {
	for i, l := range lines {
		if match(l) {
			return i + 1
		}
	}
	return 0
}

// sectionAt names the top-level key whose block holds line, judged from the
// text since a file with a syntax error has no tree.
func sectionAt(lines []string, line int) string {
	for i := min(line, len(lines)) - 1; i >= 0; i-- {
		if m := topKeyRE.FindStringSubmatch(lines[i]); m != nil {
			return m[1]
		}
	}
	return ""
}

// Top-level keys that code beside the tables names.
const (
	keyImagesDir      = "images-dir"
	keyGearmanServers = "gearman-servers" // the top level, builder
	keyZuulImages     = "zuul-images"
	keyBuilder        = "builder"
)

// topTable is the top level of nodepool.yaml: every key of nodepool 10's
// schema (its Configuration documentation, and the schema of nodepool's
// config-validate), and nodepool's old gearman-servers. Any other key is an
// error, as it is in nodepool. The rows without a reader are read by
// assemble, in the order their sections' checks ask.
var topTable = []spec[Config]{
	{key: keyImagesDir, owner: nodepools,
		read: func(r reader, c *Config) { r.str(&c.ImagesDir) }},
	{key: "build-log-dir", owner: nodepools,
		init: func(c *Config) { c.BuildLogDir = DefaultBuildLogDir },
		read: func(r reader, c *Config) { r.str(&c.BuildLogDir) }},
	{key: "build-log-retention", owner: nodepools,
		init: func(c *Config) { c.BuildLogRetention = DefaultBuildLogRetention },
		read: func(r reader, c *Config) {
			r.integer(&c.BuildLogRetention, -1, math.MaxInt, "-1 (keep all logs) or the number of logs to keep per image")
		}},
	{key: "elements-dir", owner: nodepools,
		read: func(r reader, c *Config) { r.str(&c.ElementsDir) }},
	{key: keyWebapp, owner: nodepools,
		read: func(r reader, c *Config) {
			if n, ok := r.node(); ok {
				c.LauncherWebapp = r.m.p.webapp(n, r.path())
			}
		}},
	{key: keyDiskImages, owner: nodepools},
	{key: keyProviders, owner: nodepools},
	{key: keyZooKeeperServers, owner: nodepools},
	{key: keyZooKeeperTLS, owner: nodepools},
	{key: keyZooKeeperTimeout, owner: nodepools},
	// Read into the builder section's, with a warning.
	{key: keyGearmanServers, owner: older},
	// drivers-dir is an older nodepool's, still in nodepool 10's schema.
	{key: "labels", owner: launchers},
	{key: "max-hold-age", owner: launchers},
	{key: "tenant-resource-limits", owner: launchers},
	{key: "drivers-dir", owner: launchers},
}

// ownTable is the top level of the builder's own file: its settings that
// nodepool's schema has no key for. zuul-images are read by assemble, once
// nodepool.yaml's old gearman-servers are merged into the builder's.
var ownTable = []spec[Config]{
	{key: keyZuulImages},
	{key: keyBuilder,
		read: func(r reader, c *Config) {
			if n, ok := r.node(); ok {
				c.Builder = r.m.p.builder(n, r.path())
			}
		}},
}

// assemble reads the top-level mappings of nodepool.yaml (np) and of the
// builder's own file (bp; hasOwn tells whether there is one) into a Config,
// then lays nodepool's secure file (sp; secureRoot is nil without one) over
// it. Without the builder's own file, its settings may be in nodepool.yaml, as
// one-file configs have them: they load, with a warning.
func assemble(np *parser, npRoot *yaml.Node, bp *parser, ownRoot *yaml.Node, hasOwn bool, sp *parser, secureRoot *yaml.Node) *Config {
	cfg := new(Config)
	*cfg = defaults(topTable)
	cfg.Builder = defaultBuilder()
	top, ok := np.topMapping(npRoot, "a nodepool config", slices.Concat(keys(topTable), keys(ownTable)))
	if !ok {
		return cfg
	}
	own, ok := bp.ownMapping(ownRoot, np.file)
	if !ok {
		return cfg
	}
	settings, op, oneFile := findBuilderSettings(cfg, np, top, bp, own, hasOwn)
	cfg.own = ownSettings(settings)

	readInto(top, topTable, cfg)
	readInto(settings, ownTable, cfg)
	zk := np.zookeeper(top)
	np.mergeOldGearmanServers(top, &cfg.Builder)

	names := imageNames{}
	cfg.ZuulImages = op.zuulImages(settings, names, cfg.Builder.PollInterval)
	cfg.DiskImages = np.diskImages(top, names, cfg.ZuulImages)
	checkZuulImagesDeclared(cfg, names, np, op, oneFile)
	cfg.Providers = np.providers(top, names)
	checkBuilderProviders(cfg, np, op)
	if secureRoot != nil {
		sp.secure(secureRoot, cfg, zk, names, np.file)
	}
	if len(zk.Servers) > 0 {
		cfg.ZooKeeper = zk
	}

	if cfg.ImagesDir == "" {
		requireImagesDir(np, top, op, settings)
	}
	if cfg.Builder.StateDB == "" && cfg.ImagesDir != "" {
		cfg.Builder.StateDB = filepath.Join(cfg.ImagesDir, "builder.db")
	}
	cfg.Warnings = slices.Concat(cfg.Warnings, np.warns, bp.warns, sp.warns)
	return cfg
}

// findBuilderSettings says where the builder's own settings (ownTable) are
// read from, and by which parser: its own file, or nodepool.yaml in a
// one-file config (oneFile), which loads with a warning in cfg because
// nodepool's config-validate refuses it. Beside an own file, they are an
// error in nodepool.yaml: two places for one setting would hide one.
func findBuilderSettings(cfg *Config, np *parser, top *mapping, bp *parser, own *mapping, hasOwn bool) (settings *mapping, sp *parser, oneFile bool) {
	var inNodepool []string
	for _, key := range keys(ownTable) {
		if _, ok := top.fields[key]; ok {
			inNodepool = append(inNodepool, key)
		}
	}
	switch {
	case len(inNodepool) > 0 && hasOwn:
		for _, key := range inNodepool {
			np.errorf(top.fields[key].key, key, "is a setting of the builder's own, and the builder reads its own file %s: "+
				"move this section there (nodepool's config-validate refuses it in nodepool.yaml)", bp.file)
		}
	case len(inNodepool) > 0:
		cfg.Warnings = append(cfg.Warnings, fmt.Sprintf("%s holds %s, which nodepool's config-validate refuses "+
			"(\"extra keys not allowed\"): move them into %s beside it (or the file --builder-config names), and declare "+
			"each zuul-image in nodepool.yaml as a diskimage of its name with pause: true, so that nodepool-launcher "+
			"and Python nodepool-builders can read the file and labels can name the image",
			np.file, strings.Join(inNodepool, " and "), BuilderFileName))
		return top, np, true
	}
	return own, bp, false
}

// mergeOldGearmanServers adds nodepool's old top-level gearman-servers to
// the builder section's, with a warning: they still work, but nodepool 10's
// config-validate refuses them.
func (p *parser) mergeOldGearmanServers(top *mapping, b *Builder) {
	old := p.gearmanServers(reader{m: top, key: keyGearmanServers})
	if len(old) == 0 {
		return
	}
	p.warnf(top.fields[keyGearmanServers].key, keyGearmanServers, "is an older nodepool's key, which nodepool 10's "+
		"config-validate refuses: move it to builder.gearman-servers in %s", BuilderFileName)
	for _, g := range old {
		if !slices.Contains(b.GearmanServers, g) {
			b.GearmanServers = append(b.GearmanServers, g)
		}
	}
}

// checkZuulImagesDeclared asks that every zuul-image be declared as a paused
// diskimage in nodepool.yaml, so that nodepool's providers and labels can
// name it: an error with the builder's own file, a warning in a one-file
// config (which nodepool cannot read anyway).
func checkZuulImagesDeclared(cfg *Config, names imageNames, np, sp *parser, oneFile bool) {
	var undeclared []string
	for i := range cfg.ZuulImages {
		zi := &cfg.ZuulImages[i]
		if zi.Declared {
			continue
		}
		if oneFile {
			undeclared = append(undeclared, zi.Name)
			continue
		}
		def := names[zi.Name]
		sp.errorf(&yaml.Node{Line: def.line}, def.path, "%q is not declared in %s: add \"- {name: %s, pause: true}\" under its "+
			"diskimages (and to the nodepool.yaml of every nodepool-launcher and Python nodepool-builder), so that "+
			"nodepool's providers and labels can name it", zi.Name, np.file, zi.Name)
	}
	if len(undeclared) > 0 {
		cfg.Warnings = append(cfg.Warnings, fmt.Sprintf("%s: zuul-images %s are not declared under diskimages, so "+
			"nodepool-launcher cannot boot them, and a Python nodepool-builder deletes their uploads in the providers it "+
			"has: add \"- {name: <image>, pause: true}\" under diskimages for each", np.file, strings.Join(undeclared, ", ")))
	}
}

// requireImagesDir reports a missing or empty images-dir when there are
// images to build or fetch, at the first of their sections (or at an empty
// images-dir): without it there is nowhere to put their files.
func requireImagesDir(np *parser, top *mapping, sp *parser, settings *mapping) {
	for _, key := range []string{keyDiskImages, keyZuulImages} {
		m, mp := top, np
		if key == keyZuulImages {
			m, mp = settings, sp
		}
		if n, ok := m.get(key); ok && isSequence(n) {
			at := m.fields[key].key
			if f, ok := top.fields[keyImagesDir]; ok {
				at, mp = f.key, np // present but empty
			}
			mp.errorf(at, keyImagesDir, "is required when %s are configured; set it in %s to the directory for image "+
				"files and the state database, e.g. /var/lib/nodepool/images", key, np.file)
			return
		}
	}
}

// topMapping reads a file's top-level mapping; an empty file is an empty
// mapping. false means it is not a mapping, which is reported.
func (p *parser) topMapping(root *yaml.Node, what string, known []string) (*mapping, bool) {
	if isNull(root) {
		return &mapping{p: p, fields: map[string]field{}, known: known}, true
	}
	return p.readMapping(root, "", what, known, true)
}

// ownMapping reads the top-level mapping of the builder's own file. A key of
// nodepool's is refused with where it belongs.
func (p *parser) ownMapping(root *yaml.Node, nodepoolFile string) (*mapping, bool) {
	if isNull(root) {
		return &mapping{p: p, fields: map[string]field{}, known: keys(ownTable)}, true
	}
	ownKeys := keys(ownTable)
	m, ok := p.readMapping(root, "", "the builder's config", ownKeys, false)
	if !ok {
		return m, false
	}
	nodepools := keys(topTable)
	for i := 0; i+1 < len(m.node.Content); i += 2 {
		k := m.node.Content[i]
		switch {
		case k.ShortTag() == "!!merge" || slices.Contains(ownKeys, k.Value):
		case slices.Contains(nodepools, k.Value):
			p.errorf(k, k.Value, "is a key of nodepool's, which belongs in %s, not in the builder's own file: "+
				"move it there (this file holds zuul-images and builder)", nodepoolFile)
		default:
			p.errorf(k, k.Value, "%s", unknownKeyMsg(k.Value, "the builder's config", ownKeys))
		}
	}
	return m, true
}

// launcherWebappTable is nodepool-launcher's webapp section: nodepool's
// schema for it, all of it.
var launcherWebappTable = []spec[Webapp]{
	{key: "listen_address", owner: nodepools,
		init: func(w *Webapp) { w.ListenAddress = DefaultWebappAddress },
		read: func(r reader, w *Webapp) { r.str(&w.ListenAddress) }},
	{key: keyPort, owner: nodepools,
		init: func(w *Webapp) { w.Port = DefaultWebappPort },
		read: func(r reader, w *Webapp) { r.port(&w.Port) }},
}

// webapp reads nodepool-launcher's webapp section, checked as nodepool's
// schema says; the builder serves nothing there.
func (p *parser) webapp(n *yaml.Node, path string) *Webapp {
	w := defaults(launcherWebappTable)
	if m, ok := p.readMapping(n, path, "the webapp section", keys(launcherWebappTable), true); ok {
		readInto(m, launcherWebappTable, &w)
	}
	return &w
}
