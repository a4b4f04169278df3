package config

import (
	"fmt"
	"go/ast"
	goparser "go/parser"
	"go/token"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// sectionTables are the keys of every table of the package, by the name of
// its variable: a table is a package-level variable whose name ends in Table.
func sectionTables() map[string][]string {
	return map[string][]string{
		"topTable":             keys(topTable),
		"ownTable":             keys(ownTable),
		"launcherWebappTable":  keys(launcherWebappTable),
		"diskImageTable":       keys(diskImageTable),
		"providerTable":        keys(providerTable),
		"providerImageTable":   keys(providerImageTable),
		"zkServerTable":        keys(zkServerTable),
		"zkTLSTable":           keys(zkTLSTable),
		"secureDiskImageTable": keys(secureDiskImageTable),
		"zuulImageTable":       keys(zuulImageTable),
		"artifactTable":        keys(artifactTable),
		"builderTable":         keys(builderTable),
		"gearmanServerTable":   keys(gearmanServerTable),
		"builderProviderTable": keys(builderProviderTable),
		"builderWebappTable":   keys(builderWebappTable),
		"zuulMQTTTable":        keys(zuulMQTTTable),
	}
}

// keyWordsAllowed are the string literals, besides a key's one spelling, that
// are exactly a key and stay: a key's word where it is no key. Each names the
// file it is in and why.
var keyWordsAllowed = []struct{ word, file, why string }{
	{"formats", "node.go", "the noun of the message of a wrong list of formats, which keep-formats shares"},
}

// keyConstRE matches the names of the constants that spell a key.
var keyConstRE = regexp.MustCompile(`^key[A-Z]`)

// TestKeysWrittenOnce: every key of the config is written once in the
// package's code, in its table's row or as a constant that the rows and the
// checks beside them name. A constant that spells a key spells one of a
// table, and every table is known here.
func TestKeysWrittenOnce(t *testing.T) {
	tables := sectionTables()
	known := map[string]bool{}
	for _, ks := range tables {
		for _, k := range ks {
			known[k] = true
		}
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	declared := map[string]bool{}  // the tables the code declares
	consts := map[string]string{}  // a key constant's value, by its name
	spelt := map[string][]string{} // where each key is written, as file:line
	allowed := map[string]bool{}   // the allowed literals found, as word@file
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := goparser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok {
				continue
			}
			for _, s := range gd.Specs {
				vs, ok := s.(*ast.ValueSpec)
				if !ok {
					continue
				}
				for i, id := range vs.Names {
					switch {
					case gd.Tok == token.VAR && strings.HasSuffix(id.Name, "Table"):
						declared[id.Name] = true
					case gd.Tok == token.CONST && keyConstRE.MatchString(id.Name) && i < len(vs.Values):
						if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
							consts[id.Name], _ = strconv.Unquote(lit.Value)
						}
					}
				}
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			v, err := strconv.Unquote(lit.Value)
			if err != nil || !known[v] {
				return true
			}
			if slices.ContainsFunc(keyWordsAllowed, func(a struct{ word, file, why string }) bool {
				return a.word == v && a.file == name
			}) {
				allowed[v+"@"+name] = true
				return true
			}
			pos := fset.Position(lit.Pos())
			spelt[v] = append(spelt[v], fmt.Sprintf("%s:%d", pos.Filename, pos.Line))
			return true
		})
	}

	for _, name := range slices.Sorted(maps.Keys(declared)) {
		if _, ok := tables[name]; !ok {
			t.Errorf("%s is a table this test does not know: add it to sectionTables", name)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(tables)) {
		if !declared[name] {
			t.Errorf("sectionTables lists %s, which the code does not declare", name)
		}
	}
	for _, key := range slices.Sorted(maps.Keys(known)) {
		switch at := spelt[key]; {
		case len(at) > 1:
			t.Errorf("key %s is written %d times (%s): write it once, as a constant the rows and checks name", key, len(at), strings.Join(at, ", "))
		case len(at) == 0:
			t.Errorf("key %s of a table is written nowhere that this test reads", key)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(consts)) {
		if !known[consts[name]] {
			t.Errorf("constant %s spells %q, which is a key of no table", name, consts[name])
		}
	}
	for _, a := range keyWordsAllowed {
		if !allowed[a.word+"@"+a.file] {
			t.Errorf("keyWordsAllowed lets %q stay in %s, which no longer holds it: remove the entry", a.word, a.file)
		}
	}
}
