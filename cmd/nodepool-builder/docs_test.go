package main

import (
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
)

// docsRoot is the repository's root, from this package's directory.
var docsRoot = filepath.Join("..", "..")

// readDoc returns a file of the repository as text.
func readDoc(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(docsRoot, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// flagSpellings are the ways a flag is written on the command line: --name,
// or -n for a name of one letter.
func flagSpellings(f cli.Flag) []string {
	var out []string
	for _, name := range f.Names() {
		if len(name) == 1 {
			out = append(out, "-"+name)
		} else {
			out = append(out, "--"+name)
		}
	}
	return out
}

// docFlagRE finds a flag written in code in the docs, alone or at the start
// of a usage line.
var docFlagRE = regexp.MustCompile("`(--?[a-z][a-z-]*)")

// TestDocsNameEveryFlag keeps docs/operation.md and --help from drifting apart:
// every global flag is in "Global flags", every command has a heading of its
// own under which each of its flags is named, and no command's section names a
// flag it does not take.
func TestDocsNameEveryFlag(t *testing.T) {
	doc := readDoc(t, "docs/operation.md")
	app := newApp(io.Discard, io.Discard)
	// urfave/cli adds these to every command and to the app.
	builtin := []string{"--help", "-h", "--version", "-v"}

	global, ok := testenv.MarkdownSection(doc, "## Global flags")
	if !ok {
		t.Fatal(`docs/operation.md has no "## Global flags" heading`)
	}
	var globals []string
	for _, f := range app.Flags {
		for _, s := range flagSpellings(f) {
			globals = append(globals, s)
			if !strings.Contains(global, "`"+s+"`") {
				t.Errorf("docs/operation.md, Global flags: global flag %s is not named (write it as `%s`)", s, s)
			}
		}
	}
	for _, s := range []string{"--help", "--version"} {
		if !strings.Contains(global, "`"+s+"`") {
			t.Errorf("docs/operation.md, Global flags: %s is not named", s)
		}
	}

	commands, ok := testenv.MarkdownSection(doc, "## Commands")
	if !ok {
		t.Fatal(`docs/operation.md has no "## Commands" heading`)
	}
	for _, cmd := range app.Commands {
		if cmd.Name == "help" {
			continue
		}
		heading := "### `" + cmd.Name + "`"
		sec, ok := testenv.MarkdownSection(commands, heading)
		if !ok {
			t.Errorf("docs/operation.md: command %s has no heading %q under Commands", cmd.Name, heading)
			continue
		}
		var own []string
		for _, f := range cmd.Flags {
			for _, s := range flagSpellings(f) {
				own = append(own, s)
				if !strings.Contains(sec, s) {
					t.Errorf("docs/operation.md, %s: its flag %s is not named", cmd.Name, s)
				}
			}
		}
		for _, m := range docFlagRE.FindAllStringSubmatch(sec, -1) {
			f := m[1]
			if !slices.Contains(own, f) && !slices.Contains(globals, f) && !slices.Contains(builtin, f) {
				t.Errorf("docs/operation.md, %s: names %s, which is neither its flag nor a global one", cmd.Name, f)
			}
		}
	}
	// A command heading the program does not know is a command removed or misspelt.
	for _, l := range strings.Split(commands, "\n") {
		name, ok := strings.CutPrefix(l, "### `")
		if !ok {
			continue
		}
		name = strings.TrimSuffix(name, "`")
		if app.Command(name) == nil {
			t.Errorf("docs/operation.md: heading %q names no command of the program", l)
		}
	}
}

// docLinkRE finds the target of an inline Markdown link.
var docLinkRE = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestDocsLinksResolve checks that every relative link of README.md,
// CHANGELOG.md and docs/*.md names a file that exists, and, with a #fragment,
// a heading of that file.
func TestDocsLinksResolve(t *testing.T) {
	pages, err := filepath.Glob(filepath.Join(docsRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, filepath.Join(docsRoot, "README.md"), filepath.Join(docsRoot, "CHANGELOG.md"))
	if len(pages) < 3 {
		t.Fatalf("found only %v", pages)
	}
	for _, page := range pages {
		text, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		name, _ := filepath.Rel(docsRoot, page)
		for _, m := range docLinkRE.FindAllStringSubmatch(stripCode(string(text)), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, frag, _ := strings.Cut(target, "#")
			path := page
			if file != "" {
				path = filepath.Join(filepath.Dir(page), file)
			}
			body, err := os.ReadFile(path)
			if err != nil {
				t.Errorf("%s: link %s: %v", name, target, err)
				continue
			}
			if frag != "" && !slices.Contains(anchors(string(body)), frag) {
				t.Errorf("%s: link %s: %s has no heading with anchor #%s", name, target, file, frag)
			}
		}
	}
}

// stripCode removes fenced code blocks, whose brackets are no links.
func stripCode(text string) string {
	var out []string
	fenced := false
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// anchors returns the anchors GitHub gives a page's headings: lower case,
// punctuation but '-' and '_' dropped, spaces as '-', repeats numbered.
func anchors(text string) []string {
	var out []string
	seen := map[string]int{}
	for _, l := range strings.Split(stripCode(text), "\n") {
		level := testenv.HeadingLevel(l)
		if level == 0 {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(l[level:])) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || 'a' <= r && r <= 'z' || '0' <= r && r <= '9':
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out = append(out, a+"-"+strconv.Itoa(n))
		} else {
			out = append(out, a)
		}
		seen[a]++
	}
	return out
}

// TestDocsNamePackages keeps the package table of docs/architecture.md true to
// the tree: every directory with Go code of the product or its tests is a row,
// and every row is such a directory.
func TestDocsNamePackages(t *testing.T) {
	table, ok := testenv.MarkdownSection(readDoc(t, "docs/architecture.md"), "## Packages")
	if !ok {
		t.Fatal(`docs/architecture.md has no "## Packages" section`)
	}
	rowRE := regexp.MustCompile("(?m)^\\| `([^`]+)` \\|")
	var named []string
	for _, m := range rowRE.FindAllStringSubmatch(table, -1) {
		named = append(named, m[1])
	}
	var tree []string
	err := filepath.WalkDir(docsRoot, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(docsRoot, path)
		if d.IsDir() && rel != "." && (strings.HasPrefix(d.Name(), ".") || rel == "third_party" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		if dir := filepath.ToSlash(filepath.Dir(rel)); !slices.Contains(tree, dir) {
			tree = append(tree, dir)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range tree {
		if !slices.Contains(named, p) {
			t.Errorf("package %s is not in the table of docs/architecture.md", p)
		}
	}
	for _, p := range named {
		if !slices.Contains(tree, p) {
			t.Errorf("docs/architecture.md names package %s, which is not in the tree", p)
		}
	}
}
