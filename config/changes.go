package config

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
)

// ownSettings decodes the builder's own sections (ownTable) that settings
// holds, for OwnSettingsChanged. A section that does not decode (the parser
// has refused it already) is kept as the error, which differs from any value.
func ownSettings(settings *mapping) map[string]any {
	out := map[string]any{}
	for _, key := range keys(ownTable) {
		f, ok := settings.fields[key]
		if !ok {
			continue
		}
		var v any
		if err := f.val.Decode(&v); err != nil {
			v = err.Error()
		}
		out[key] = v
	}
	return out
}

// OwnSettingsChanged lists the builder's own settings, those of the
// zuul-images and builder sections, that differ from c to next, wherever each
// config read them from: the builder's own file, or nodepool.yaml in a
// one-file config. Each is a key path, as builder.keep-builds or
// zuul-images[debian].branch; a zuul-image that comes or goes is
// zuul-images[debian]. Values are never named: they may be secrets. A key
// written with its default value differs from one left out, and comments and
// the layout of the text make no difference. A key is listed when its row in
// the section's table says a reload holds its changes.
func (c *Config) OwnSettingsChanged(next *Config) []string {
	var out []string
	for _, key := range keys(ownTable) {
		a, b := c.own[key], next.own[key]
		if key == keyZuulImages {
			out = append(out, changedImages(key, a, b)...)
			continue
		}
		if a == nil {
			a = map[string]any{}
		}
		if b == nil {
			b = map[string]any{}
		}
		out = append(out, changedValues(key, heldOnly(builderTable, a), heldOnly(builderTable, b))...)
	}
	return out
}

// HeldChanges lists what differs from c to next that a file change alone
// does not apply: the reload signal must confirm it. It is what
// OwnSettingsChanged lists, and a key of a provider of both taken away when
// its row holds that, as providers[cloud-a].post-upload-hook.
func (c *Config) HeldChanges(next *Config) []string {
	out := c.OwnSettingsChanged(next)
	for _, p := range c.Providers {
		np := next.Provider(p.Name)
		if np == nil {
			continue
		}
		old, now := &providerEntry{Provider: p}, &providerEntry{Provider: *np}
		for _, s := range providerTable {
			if s.reload == heldRemoved && s.changed(old, now) {
				out = append(out, fmt.Sprintf("providers[%s].%s", p.Name, s.key))
			}
		}
	}
	return out
}

// Restarts says what changed from c to next that the running daemon keeps
// until it restarts, one sentence for each key.
func (c *Config) Restarts(next *Config) []string {
	return restarts(builderTable, &c.Builder, &next.Builder)
}

// changedImages lists what differs between two zuul-images lists, entries
// matched by name. Lists that are not of named entries differ whole.
func changedImages(path string, a, b any) []string {
	as, aok := byName(a)
	bs, bok := byName(b)
	if !aok || !bok {
		if reflect.DeepEqual(a, b) {
			return nil
		}
		return []string{path}
	}
	var out []string
	names := slices.Collect(maps.Keys(as))
	for name := range bs {
		if _, ok := as[name]; !ok {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		ia, ina := as[name]
		ib, inb := bs[name]
		at := fmt.Sprintf("%s[%s]", path, name)
		if !ina || !inb {
			out = append(out, at)
			continue
		}
		out = append(out, changedValues(at, heldOnly(zuulImageTable, ia), heldOnly(zuulImageTable, ib))...)
	}
	return out
}

// byName indexes a list of mappings by their name key; ok is false when v is
// something else, or a name is missing or repeated. An absent list is empty.
func byName(v any) (map[string]any, bool) {
	out := map[string]any{}
	if v == nil {
		return out, true
	}
	items, ok := v.([]any)
	if !ok {
		return nil, false
	}
	for _, item := range items {
		m, ok := item.(map[string]any)
		if !ok {
			return nil, false
		}
		name, ok := m[keyName].(string)
		if _, seen := out[name]; !ok || seen {
			return nil, false
		}
		out[name] = m
	}
	return out, true
}

// changedValues lists the key paths under path where a and b differ: the keys
// of two mappings one by one, anything else whole.
func changedValues(path string, a, b any) []string {
	ma, aok := a.(map[string]any)
	mb, bok := b.(map[string]any)
	if !aok || !bok {
		if reflect.DeepEqual(a, b) {
			return nil
		}
		return []string{path}
	}
	keys := slices.Collect(maps.Keys(ma))
	for k := range mb {
		if _, ok := ma[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var out []string
	for _, k := range keys {
		va, ina := ma[k]
		vb, inb := mb[k]
		at := path + "." + k
		if ina != inb {
			out = append(out, at)
			continue
		}
		out = append(out, changedValues(at, va, vb)...)
	}
	return out
}
