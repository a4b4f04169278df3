package config

import (
	"fmt"
	"iter"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// parser walks a YAML node tree and collects every problem it finds, so that
// one run of config-validate reports them all.
type parser struct {
	file  string
	errs  Errors
	warns []string // what loads but should change, each as an Error prints
	// hideValues keeps the file's values out of its problems: the secure
	// file's hold secrets, and a value written where another key belongs is
	// quoted nowhere.
	hideValues bool
}

func (p *parser) errorf(n *yaml.Node, path, format string, args ...any) {
	p.errs = append(p.errs, p.problem(n, path, format, args...))
}

// warnf records what loads but should change, located as errors are.
func (p *parser) warnf(n *yaml.Node, path, format string, args ...any) {
	p.warns = append(p.warns, p.problem(n, path, format, args...).Error())
}

func (p *parser) problem(n *yaml.Node, path, format string, args ...any) *Error {
	line := 0
	if n != nil {
		line = n.Line
	}
	return &Error{File: p.file, Line: line, Path: path, Msg: fmt.Sprintf(format, args...)}
}

// resolve follows aliases, so that an anchored value reads like the original.
func resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && i < 100; i++ {
		n = n.Alias
	}
	return n
}

// isNull reports whether n is absent or an explicit null: like nodepool, a key
// with no value counts as not set.
func isNull(n *yaml.Node) bool {
	n = resolve(n)
	return n == nil || n.Kind == 0 || n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// isSequence reports whether n holds a non-empty list.
func isSequence(n *yaml.Node) bool {
	n = resolve(n)
	return n != nil && n.Kind == yaml.SequenceNode && len(n.Content) > 0
}

// describe names what a node holds, for "expected X, not Y" messages.
func (p *parser) describe(n *yaml.Node) string {
	n = resolve(n)
	switch {
	case isNull(n):
		return "an empty value"
	case n.Kind == yaml.MappingNode:
		return "a mapping"
	case n.Kind == yaml.SequenceNode:
		return "a list"
	}
	switch tag := n.ShortTag(); {
	case p.hideValues && tag == "!!bool":
		return "a boolean"
	case p.hideValues && (tag == "!!int" || tag == "!!float"):
		return "a number"
	case p.hideValues:
		return "a string"
	case tag == "!!bool":
		return "the boolean " + n.Value
	case tag == "!!int" || tag == "!!float":
		return "the number " + n.Value
	default:
		return strconv.Quote(n.Value)
	}
}

// quote is a value of the file as a message shows it: quoted, or "the
// value" in a file whose values are kept out of messages.
func (p *parser) quote(s string) string {
	if p.hideValues {
		return "the value"
	}
	return strconv.Quote(s)
}

func childPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func indexPath(path string, i int) string {
	return fmt.Sprintf("%s[%d]", path, i)
}

// field is one key of a mapping with its value.
type field struct {
	key *yaml.Node
	val *yaml.Node
}

// mapping is a YAML mapping whose known keys are read one by one with typed
// getters; each getter reports a wrong value at its own line.
type mapping struct {
	p      *parser
	node   *yaml.Node
	path   string
	fields map[string]field
	// known are the keys the mapping may hold: the only ones worth reading.
	known []string
}

// unlistedRead, when set, is told of a key read from a mapping whose known
// keys do not list it: a reader's mistake, which reads nothing. The tests set
// it; a key is to be listed in its section's table before it is read.
var unlistedRead func(path, key string)

// maxMergeDepth bounds "<<" merges that refer to each other.
const maxMergeDepth = 32

// readMapping reads n as a mapping. known lists the keys it may hold: those
// the caller reads and, in nodepool's sections, the rest of nodepool's schema
// for it; each may appear only once. With strict, any other key is an error,
// as nodepool's schema makes it, naming the known key most likely meant.
// Without it other keys are ignored: only for mappings whose schema is not
// ours to check (providers of other drivers). what names the mapping in
// messages.
func (p *parser) readMapping(n *yaml.Node, path, what string, known []string, strict bool) (*mapping, bool) {
	n = resolve(n)
	m := &mapping{p: p, node: n, path: path, fields: map[string]field{}, known: known}
	if n == nil || n.Kind != yaml.MappingNode {
		p.errorf(n, path, "expected %s (a mapping of keys like %s), not %s", what, strings.Join(known[:min(2, len(known))], ", "), p.describe(n))
		return m, false
	}
	merged := map[string]field{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.ShortTag() == "!!merge" {
			p.collectMerge(v, merged, 0)
			continue
		}
		name := k.Value
		if !slices.Contains(known, name) {
			if strict {
				p.errorf(k, childPath(path, name), "%s", unknownKeyMsg(name, what, known))
			}
			continue
		}
		if prev, dup := m.fields[name]; dup {
			p.errorf(k, childPath(path, name), "appears twice in %s (first on line %d); keep one", what, prev.key.Line)
			continue
		}
		m.fields[name] = field{key: k, val: v}
	}
	// Keys merged in with "<<" are defaults: keys written in the mapping win.
	for name, f := range merged {
		if _, explicit := m.fields[name]; explicit {
			continue
		}
		if !slices.Contains(known, name) {
			if strict {
				p.errorf(f.key, childPath(path, name), "%s", unknownKeyMsg(name, what, known))
			}
			continue
		}
		m.fields[name] = f
	}
	return m, true
}

// collectMerge gathers the keys of a "<<" value: a mapping or a list of them,
// where earlier mappings win, as YAML's merge key specifies.
func (p *parser) collectMerge(v *yaml.Node, into map[string]field, depth int) {
	v = resolve(v)
	if v == nil || depth > maxMergeDepth {
		return
	}
	switch v.Kind {
	case yaml.SequenceNode:
		for _, item := range v.Content {
			p.collectMerge(item, into, depth+1)
		}
	case yaml.MappingNode:
		inner := map[string]field{}
		for i := 0; i+1 < len(v.Content); i += 2 {
			k, val := v.Content[i], v.Content[i+1]
			if k.ShortTag() == "!!merge" {
				p.collectMerge(val, inner, depth+1)
				continue
			}
			if _, ok := inner[k.Value]; !ok {
				inner[k.Value] = field{key: k, val: val}
			}
		}
		for name, f := range inner {
			if _, ok := into[name]; !ok {
				into[name] = f
			}
		}
	}
}

// sub is the key path of one of the mapping's keys.
func (m *mapping) sub(key string) string { return childPath(m.path, key) }

// get returns the value of key, or false when the key is absent or empty.
func (m *mapping) get(key string) (*yaml.Node, bool) {
	if unlistedRead != nil && !slices.Contains(m.known, key) {
		unlistedRead(m.path, key)
	}
	f, ok := m.fields[key]
	if !ok || isNull(f.val) {
		return nil, false
	}
	return resolve(f.val), true
}

// has reports whether key is present with a value.
func (m *mapping) has(key string) bool {
	_, ok := m.get(key)
	return ok
}

// require reports key as missing when it has no value.
func (m *mapping) require(key, hint string) bool {
	if m.has(key) {
		return true
	}
	at := m.node
	if f, ok := m.fields[key]; ok {
		at = f.key
	}
	m.p.errorf(at, m.sub(key), "is required; %s", hint)
	return false
}

func (m *mapping) str(key string) (string, bool) {
	n, ok := m.get(key)
	if !ok {
		return "", false
	}
	return m.p.scalarString(n, m.sub(key))
}

// scalarString accepts only YAML strings: a number where a name is
// expected is more likely a mistake than a name.
func (p *parser) scalarString(n *yaml.Node, path string) (string, bool) {
	if n.Kind != yaml.ScalarNode {
		p.errorf(n, path, "expected a string, not %s", p.describe(n))
		return "", false
	}
	if n.ShortTag() != "!!str" {
		if p.hideValues {
			p.errorf(n, path, "expected a string, not %s; quote it if it is meant as text", p.describe(n))
		} else {
			p.errorf(n, path, "expected a string, not %s; quote it if it is meant as text: '%s'", p.describe(n), n.Value)
		}
		return "", false
	}
	return n.Value, true
}

// textValue accepts any scalar and returns its text, as nodepool does for
// values that end up in the environment or in image properties.
func (p *parser) textValue(n *yaml.Node, path, example string) (string, bool) {
	n = resolve(n)
	if isNull(n) {
		p.errorf(n, path, "has no value; write '' for an empty string")
		return "", false
	}
	if n.Kind != yaml.ScalarNode {
		p.errorf(n, path, "expected a string like %s, not %s", example, p.describe(n))
		return "", false
	}
	return n.Value, true
}

// yaml11Bools are the booleans that PyYAML (and so nodepool) reads but YAML
// 1.2 treats as strings; an existing nodepool.yaml may use them.
var yaml11Bools = map[string]bool{"yes": true, "on": true, "no": false, "off": false}

func (m *mapping) boolean(key string) (bool, bool) {
	n, ok := m.get(key)
	if !ok {
		return false, false
	}
	if n.Kind == yaml.ScalarNode {
		if n.ShortTag() == "!!bool" {
			var b bool
			if err := n.Decode(&b); err == nil {
				return b, true
			}
		}
		if b, ok := yaml11Bools[strings.ToLower(n.Value)]; ok && n.Style == 0 {
			return b, true
		}
	}
	m.p.errorf(n, m.sub(key), "expected true or false, not %s", m.p.describe(n))
	return false, false
}

// integer reads a whole number from lowest to highest; rule says what is allowed.
func (m *mapping) integer(key string, lowest, highest int, rule string) (int, bool) {
	n, ok := m.get(key)
	if !ok {
		return 0, false
	}
	var v int
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" || n.Decode(&v) != nil {
		m.p.errorf(n, m.sub(key), "must be %s, not %s", rule, m.p.describe(n))
		return 0, false
	}
	if v < lowest || v > highest {
		m.p.errorf(n, m.sub(key), "must be %s, not %d", rule, v)
		return 0, false
	}
	return v, true
}

// number reads an integer or decimal number of at least zero.
func (m *mapping) number(key, rule string) (float64, bool) {
	n, ok := m.get(key)
	if !ok {
		return 0, false
	}
	var v float64
	tag := n.ShortTag()
	if n.Kind != yaml.ScalarNode || (tag != "!!int" && tag != "!!float") || n.Decode(&v) != nil ||
		math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		m.p.errorf(n, m.sub(key), "must be %s, not %s", rule, m.p.describe(n))
		return 0, false
	}
	return v, true
}

// byteSize reads a size in bytes: a whole number, or one with a binary unit
// (K, M, G, T, optionally followed by iB or B: 64G, 64GiB and 64 GiB are the same).
func (m *mapping) byteSize(key string) (int64, bool) {
	n, ok := m.get(key)
	if !ok {
		return 0, false
	}
	const rule = "a size in bytes, like 68719476736, or with a unit, like 64G"
	bad := func() (int64, bool) {
		m.p.errorf(n, m.sub(key), "must be %s, not %s", rule, m.p.describe(n))
		return 0, false
	}
	if n.Kind != yaml.ScalarNode {
		return bad()
	}
	text := strings.ToUpper(strings.ReplaceAll(strings.TrimSpace(n.Value), " ", ""))
	text = strings.TrimSuffix(strings.TrimSuffix(text, "B"), "I")
	shift := 0
	if i := strings.IndexAny(text, "KMGT"); i >= 0 && i == len(text)-1 {
		shift = 10 * (1 + strings.IndexByte("KMGT", text[i]))
		text = text[:i]
	}
	v, err := strconv.ParseInt(text, 10, 64)
	if err != nil || v <= 0 || v > math.MaxInt64>>shift {
		return bad()
	}
	return v << shift, true
}

// seconds reads a duration written as a number of seconds; zero is allowed
// only with allowZero.
func (m *mapping) seconds(key string, allowZero bool) (time.Duration, bool) {
	rule := "a positive number of seconds, like 3600"
	if allowZero {
		rule = "zero or a positive number of seconds, like 3600"
	}
	v, ok := m.number(key, rule)
	if !ok {
		return 0, false
	}
	if v == 0 && !allowZero || v > float64(math.MaxInt64/int64(time.Second)) {
		n, _ := m.get(key)
		m.p.errorf(n, m.sub(key), "must be %s, not %s", rule, m.p.describe(n))
		return 0, false
	}
	return time.Duration(v * float64(time.Second)), true
}

// list reads a sequence; what and example shape the message when it is not one.
func (m *mapping) list(key, what, example string) ([]*yaml.Node, bool) {
	n, ok := m.get(key)
	if !ok {
		return nil, false
	}
	if n.Kind != yaml.SequenceNode {
		m.p.errorf(n, m.sub(key), "expected a list of %s like %s, not %s", what, example, m.p.describe(n))
		return nil, false
	}
	return n.Content, true
}

// mappings reads a list of mappings (what and example as for list) and
// yields each item that is a mapping with known keys only, read as it is
// yielded; item names one in messages.
func (m *mapping) mappings(key, what, example, item string, known []string) iter.Seq[*mapping] {
	items, _ := m.list(key, what, example)
	return func(yield func(*mapping) bool) {
		for i, n := range items {
			im, ok := m.p.readMapping(n, indexPath(m.sub(key), i), item, known, true)
			if ok && !yield(im) {
				return
			}
		}
	}
}

// strList reads a list of non-empty strings.
func (m *mapping) strList(key, what, example string) ([]string, bool) {
	items, ok := m.list(key, what, example)
	if !ok {
		return nil, false
	}
	out := make([]string, 0, len(items))
	good := true
	for i, item := range items {
		item = resolve(item)
		path := indexPath(m.sub(key), i)
		if isNull(item) || item.Kind != yaml.ScalarNode || item.ShortTag() != "!!str" || item.Value == "" {
			m.p.errorf(item, path, "expected a list of %s like %s; this entry is %s", what, example, m.p.describe(item))
			good = false
			continue
		}
		out = append(out, item.Value)
	}
	return out, good
}

// formatRE is what a disk image format looks like: DIB and Glance use
// lowercase words such as qcow2, raw, vhd, vmdk or tar.
var formatRE = regexp.MustCompile(`^[a-z][a-z0-9]*$`)

// NormalizeFormat maps spellings of a format to the one used everywhere else
// ("qcow" is qcow2).
func NormalizeFormat(f string) string {
	if f == "qcow" {
		return "qcow2"
	}
	return f
}

// checkFormat validates one format value and returns it normalised.
func (p *parser) checkFormat(n *yaml.Node, path string) (string, bool) {
	n = resolve(n)
	if isNull(n) || n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" || !formatRE.MatchString(n.Value) {
		p.errorf(n, path, "%s is not a format; formats are lowercase words like qcow2, raw, vhd or vmdk", p.describe(n))
		return "", false
	}
	return NormalizeFormat(n.Value), true
}

// formats reads a list of image formats, normalised and without repeats.
func (m *mapping) formats(key string) ([]string, bool) {
	items, ok := m.list(key, "formats", "[qcow2, raw]")
	if !ok {
		return nil, false
	}
	var out []string
	good := true
	for i, item := range items {
		f, ok := m.p.checkFormat(item, indexPath(m.sub(key), i))
		if !ok {
			good = false
			continue
		}
		if !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	return out, good
}

// strMap reads a mapping of names to scalar values, kept as text.
func (m *mapping) strMap(key, example string) (map[string]string, bool) {
	n, ok := m.get(key)
	if !ok {
		return nil, false
	}
	if n.Kind != yaml.MappingNode {
		m.p.errorf(n, m.sub(key), "expected a mapping of names to values like {%s}, not %s", example, m.p.describe(n))
		return nil, false
	}
	out := map[string]string{}
	seen := map[string]int{}
	good := true
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := resolve(n.Content[i]), n.Content[i+1]
		if k.ShortTag() == "!!merge" {
			merged := map[string]field{}
			m.p.collectMerge(v, merged, 0)
			for name, f := range merged {
				if _, set := out[name]; !set {
					if s, ok := m.p.textValue(f.val, childPath(m.sub(key), name), example); ok {
						out[name] = s
					}
				}
			}
			continue
		}
		if k.Kind != yaml.ScalarNode || k.Value == "" {
			m.p.errorf(k, m.sub(key), "expected names as keys like {%s}, not %s", example, m.p.describe(k))
			good = false
			continue
		}
		if line, dup := seen[k.Value]; dup {
			m.p.errorf(k, childPath(m.sub(key), k.Value), "appears twice (first on line %d); keep one", line)
			good = false
			continue
		}
		seen[k.Value] = k.Line
		s, ok := m.p.textValue(v, childPath(m.sub(key), k.Value), example)
		if !ok {
			good = false
			continue
		}
		out[k.Value] = s
	}
	return out, good
}
