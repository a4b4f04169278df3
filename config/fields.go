package config

import (
	"time"

	"gopkg.in/yaml.v3"
)

// keyName is the key that names an entry of a list, in every section that
// has one; the checks that a name is given once look it up by it.
const keyName = "name"

// Keys spelt alike in more than one section, or named by code beside a
// table: each is written here once, and the rows and the checks name it.
const (
	keyPort         = "port"          // builder.webapp, webapp, gearman and ZooKeeper servers
	keyPause        = "pause"         // diskimages, a provider's diskimages, zuul-images
	keyMetadata     = "metadata"      // diskimages, zuul-images
	keyFormats      = "formats"       // diskimages, zuul-images
	keyUsername     = "username"      // diskimages, builder.zuul-mqtt
	keyCACert       = "ca-cert"       // zuul-images, builder.zuul-mqtt
	keyPollInterval = "poll-interval" // builder, zuul-images
	keyEnvVars      = "env-vars"      // diskimages, the secure file's diskimages
	keyWebapp       = "webapp"        // the top level, builder
	keyProviders    = "providers"     // the top level, builder
	keyDiskImages   = "diskimages"    // the top level, a provider, the secure file
)

// A spec is one key of a section whose entries are read into a T: a row of
// the section's table. The table is the one place a key is spelt, or a
// constant its row and the code beside it name: the keys a mapping may hold,
// the defaults, the reading, the inheritance of diskimages, what a reload
// does with a change and the docs test all go by it. Checks that span keys
// stay as code beside the table. TestKeysWrittenOnce finds a key written twice.
type spec[T any] struct {
	key   string
	owner owner
	// need, for a required key, says what to write when it is missing.
	need string
	// init sets the key's default, where an entry starts; nil when the
	// default is the zero value.
	init func(v *T)
	// read reads the key, when it has a value, into v with its check; a
	// wrong value is reported and leaves v as it was. nil for nodepool's keys
	// the builder accepts and ignores, and for a key the code beside the
	// table reads, in the order its checks ask.
	read func(r reader, v *T)
	// lay lays an entry's value of the key over the value it inherits
	// (diskimages' parents), when the entry sets the key; nil for a key that
	// is not inherited.
	lay func(into, own *T)
	// declares tells a key a diskimage that declares a zuul-image to
	// nodepool may hold.
	declares bool
	reload   reload
	// restart, for a key the running daemon keeps until it restarts, is what
	// a reload that changes it says; changed tells whether it did.
	restart string
	changed func(old, next *T) bool
}

// owner says whose schema a key is of.
type owner uint8

const (
	// ours is a key of the builder's own: nodepool's schema has none like it.
	ours owner = iota
	// nodepools is a key of nodepool's schema that the builder reads.
	nodepools
	// launchers is a key of nodepool's schema that only nodepool's launcher
	// reads: accepted and ignored.
	launchers
	// older is an older nodepool's key, which nodepool 10 reads nowhere
	// and its config-validate refuses: accepted with a warning, as a file
	// that older nodepools read may still hold it.
	older
)

// reload says what a reload does with a changed key.
type reload uint8

const (
	// applied: a reload applies the change.
	applied reload = iota
	// held: a file change alone does not apply the change; the reload
	// signal must confirm it. A key written with its default value differs
	// from one left out.
	held
	// heldRemoved: the key taken away (changed says when) is held as held is.
	heldRemoved
)

// hostPortRows are the rows of a server's host, required (need says how to
// name it), and its port, defaultPort when it has none: gearman's servers and
// ZooKeeper's are written alike. at gives where an entry keeps the two.
func hostPortRows[T any](o owner, need string, defaultPort int, at func(v *T) (host *string, port *int)) []spec[T] {
	return []spec[T]{
		{key: "host", owner: o, need: need,
			read: func(r reader, v *T) {
				host, _ := at(v)
				r.str(host)
			}},
		{key: keyPort, owner: o,
			init: func(v *T) {
				_, port := at(v)
				*port = defaultPort
			},
			read: func(r reader, v *T) {
				_, port := at(v)
				r.port(port)
			}},
	}
}

// keys lists the keys of a table, in its order: the keys a mapping of the
// section may hold, as messages name them.
func keys[T any](table []spec[T]) []string {
	out := make([]string, len(table))
	for i, s := range table {
		out[i] = s.key
	}
	return out
}

// keysWhere lists the keys of a table for which keep is true.
func keysWhere[T any](table []spec[T], keep func(spec[T]) bool) []string {
	var out []string
	for _, s := range table {
		if keep(s) {
			out = append(out, s.key)
		}
	}
	return out
}

// readByBuilder tells a key the builder reads: its own, or nodepool's that
// it reads.
func readByBuilder[T any](s spec[T]) bool { return s.owner == ours || s.owner == nodepools }

// defaults is an entry of a table's section before any key is read.
func defaults[T any](table []spec[T]) T {
	var v T
	for _, s := range table {
		if s.init != nil {
			s.init(&v)
		}
	}
	return v
}

// readInto reads every key of the table that m holds into v, in the table's
// order; a required key that is missing is reported.
func readInto[T any](m *mapping, table []spec[T], v *T) {
	for _, s := range table {
		if s.need != "" && !m.require(s.key, s.need) {
			continue
		}
		if s.read != nil {
			s.read(reader{m: m, key: s.key}, v)
		}
	}
}

// specOf is the row of key in table; false when there is none.
func specOf[T any](table []spec[T], key string) (spec[T], bool) {
	for _, s := range table {
		if s.key == key {
			return s, true
		}
	}
	return spec[T]{}, false
}

// restarts lists what a reload says of the keys of table that changed from
// old to next and that the running daemon keeps until it restarts.
func restarts[T any](table []spec[T], old, next *T) []string {
	var out []string
	for _, s := range table {
		if s.restart != "" && s.changed(old, next) {
			out = append(out, s.restart)
		}
	}
	return out
}

// heldOnly is v, a mapping of a section of the table as decoded, without
// the keys whose changes a reload applies: what a change is held for. A key
// no row lists is kept (it does not load), and so is anything but a mapping.
func heldOnly[T any](table []spec[T], v any) any {
	m, ok := v.(map[string]any)
	if !ok {
		return v
	}
	out := map[string]any{}
	for k, val := range m {
		if s, known := specOf(table, k); !known || s.reload != applied {
			out[k] = val
		}
	}
	return out
}

// A reader reads one key of a mapping into a destination, when the key has a
// value and it passes the check; a wrong value is reported at its line and
// leaves the destination as it was.
type reader struct {
	m   *mapping
	key string
}

// node is the key's value; false when it is absent or empty.
func (r reader) node() (*yaml.Node, bool) { return r.m.get(r.key) }

// path is the key path of the key.
func (r reader) path() string { return r.m.sub(r.key) }

// errorf reports a problem of the key's value.
func (r reader) errorf(format string, args ...any) {
	n, _ := r.node()
	r.m.p.errorf(n, r.path(), format, args...)
}

// warnf reports what loads but should change of the key's value.
func (r reader) warnf(format string, args ...any) {
	n, _ := r.node()
	r.m.p.warnf(n, r.path(), format, args...)
}

func (r reader) str(dst *string) {
	if v, ok := r.m.str(r.key); ok {
		*dst = v
	}
}

func (r reader) boolean(dst *bool) {
	if v, ok := r.m.boolean(r.key); ok {
		*dst = v
	}
}

// integer reads a whole number from lowest to highest; rule says what is allowed.
func (r reader) integer(dst *int, lowest, highest int, rule string) {
	if v, ok := r.m.integer(r.key, lowest, highest, rule); ok {
		*dst = v
	}
}

// port reads a TCP port number.
func (r reader) port(dst *int) { r.integer(dst, 1, 65535, "a TCP port number from 1 to 65535") }

func (r reader) number(dst *float64, rule string) {
	if v, ok := r.m.number(r.key, rule); ok {
		*dst = v
	}
}

func (r reader) seconds(dst *time.Duration, allowZero bool) {
	if v, ok := r.m.seconds(r.key, allowZero); ok {
		*dst = v
	}
}

func (r reader) byteSize(dst *int64) {
	if v, ok := r.m.byteSize(r.key); ok {
		*dst = v
	}
}

// strList reads a list of non-empty strings; what and example shape the
// message of a wrong one. The entries that are right are kept.
func (r reader) strList(dst *[]string, what, example string) {
	if _, ok := r.node(); ok {
		*dst, _ = r.m.strList(r.key, what, example)
	}
}

// formats reads a list of image formats; the entries that are right are kept.
func (r reader) formats(dst *[]string) {
	if _, ok := r.node(); ok {
		*dst, _ = r.m.formats(r.key)
	}
}

// strMap reads a mapping of names to values; the entries that are right are kept.
func (r reader) strMap(dst *map[string]string, example string) {
	if _, ok := r.node(); ok {
		*dst, _ = r.m.strMap(r.key, example)
	}
}
