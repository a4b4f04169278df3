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

// mdTable is a Markdown table: its header cells and its rows' cells, trimmed.
type mdTable struct {
	header []string
	rows   [][]string
}

// markdownTables returns the tables of a Markdown text (fenced code left out):
// a header line of cells, a |---| line, and the rows that follow it.
func markdownTables(text string) []mdTable {
	var out []mdTable
	lines := strings.Split(stripCode(text), "\n")
	for i := 0; i+1 < len(lines); i++ {
		if !strings.HasPrefix(lines[i], "|") || !strings.HasPrefix(lines[i+1], "|---") {
			continue
		}
		tb := mdTable{header: tableCells(lines[i])}
		j := i + 2
		for ; j < len(lines) && strings.HasPrefix(lines[j], "|"); j++ {
			tb.rows = append(tb.rows, tableCells(lines[j]))
		}
		out = append(out, tb)
		i = j - 1
	}
	return out
}

// tableCells splits a table row into its cells, trimmed: on the | that stand
// outside code spans and are not escaped.
func tableCells(line string) []string {
	var cells []string
	var cell strings.Builder
	code := false
	line = strings.TrimSpace(line)
	line = strings.TrimPrefix(strings.TrimSuffix(line, "|"), "|")
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == '\\' && i+1 < len(line) && line[i+1] == '|':
			cell.WriteByte('|')
			i++
		case c == '`':
			code = !code
			cell.WriteByte(c)
		case c == '|' && !code:
			cells = append(cells, strings.TrimSpace(cell.String()))
			cell.Reset()
		default:
			cell.WriteByte(c)
		}
	}
	return append(cells, strings.TrimSpace(cell.String()))
}

// codeSpanRE finds the code spans of a line of Markdown.
var codeSpanRE = regexp.MustCompile("`([^`]+)`")

// troubleshootingPrograms are the programs other than the builder whose
// command lines docs/troubleshooting.md may give as what shows a symptom.
var troubleshootingPrograms = []string{
	"nodepool", "openstack", "journalctl", "systemctl", "sudo", "ls", "cat", "df", "ss", "openssl",
	"curl", "command", "getent", "findmnt",
}

// builderCommand returns the command a nodepool-builder command line runs:
// the first word that is not a flag or a flag's value; "" for none (--version).
func builderCommand(args []string) string {
	for i := 0; i < len(args); i++ {
		switch a := args[i]; {
		case a == "-c" || a == "--config" || a == "-s" || a == "--secure" || a == "--builder-config":
			i++
		case strings.HasPrefix(a, "-"):
		default:
			return a
		}
	}
	return ""
}

// TestDocsTroubleshootingNamesCommands keeps docs/troubleshooting.md a table
// of symptom, command and fix: every table has a "command" column, and each
// row names in it, as code, a command line an operator can run: one of the
// builder's commands, which must exist, or one of the other programs the page
// uses (nodepool's CLI, openstack, journalctl, ...).
func TestDocsTroubleshootingNamesCommands(t *testing.T) {
	app := newApp(io.Discard, io.Discard)
	tables := markdownTables(readDoc(t, "docs/troubleshooting.md"))
	if len(tables) < 6 {
		t.Fatalf("docs/troubleshooting.md has %d tables; want one per kind of trouble, six or more", len(tables))
	}
	rows := 0
	for _, tb := range tables {
		col := slices.Index(tb.header, "command")
		if col < 0 {
			t.Errorf("docs/troubleshooting.md: the table with columns %q has no column \"command\"", tb.header)
			continue
		}
		for _, row := range tb.rows {
			rows++
			if len(row) != len(tb.header) {
				t.Errorf("docs/troubleshooting.md: row %q has %d cells, its table %d", row, len(row), len(tb.header))
				continue
			}
			spans := codeSpanRE.FindAllStringSubmatch(row[col], -1)
			if len(spans) == 0 {
				t.Errorf("docs/troubleshooting.md: the row of %q names no command (write it as code in the command column)", row[0])
				continue
			}
			for _, m := range spans {
				words := strings.Fields(m[1])
				switch prog := words[0]; {
				case prog == "nodepool-builder":
					name := builderCommand(words[1:])
					if name == "" && !slices.Contains(words, "--version") {
						t.Errorf("docs/troubleshooting.md: the row of %q runs %q, which names no command", row[0], m[1])
					} else if name != "" && app.Command(name) == nil {
						t.Errorf("docs/troubleshooting.md: the row of %q runs %q: the builder has no command %s", row[0], m[1], name)
					}
				case !slices.Contains(troubleshootingPrograms, prog):
					t.Errorf("docs/troubleshooting.md: the row of %q runs %q: %s is neither nodepool-builder nor one of %q",
						row[0], m[1], prog, troubleshootingPrograms)
				}
			}
		}
	}
	if rows < 40 {
		t.Errorf("docs/troubleshooting.md has %d symptom rows; the tables were not read whole", rows)
	}
}

// TestDocsDifferencesNameRefusedFlags keeps the table of differences from
// nodepool's builder, in docs/beside-nodepool.md, true to the flags the
// builder refuses: each has its row, whose last cell says it is refused, and
// no other row says a flag is.
func TestDocsDifferencesNameRefusedFlags(t *testing.T) {
	const heading = "## Differences from nodepool's builder"
	sec, ok := testenv.MarkdownSection(readDoc(t, "docs/beside-nodepool.md"), heading)
	if !ok {
		t.Fatalf("docs/beside-nodepool.md has no heading %q", heading)
	}
	tables := markdownTables(sec)
	if len(tables) != 1 {
		t.Fatalf("docs/beside-nodepool.md, %s: %d tables, want one", heading, len(tables))
	}
	said := map[string]bool{} // flags whose row says they are refused
	for _, row := range tables[0].rows {
		refusedHere := strings.HasPrefix(row[len(row)-1], "refused")
		for _, m := range codeSpanRE.FindAllStringSubmatch(row[0], -1) {
			if !strings.HasPrefix(m[1], "-") {
				continue
			}
			name := strings.TrimLeft(m[1], "-")
			_, isRefused := refused[name]
			switch {
			case refusedHere && !isRefused:
				t.Errorf("docs/beside-nodepool.md, %s: the row of %s says it is refused; the builder does not refuse it", heading, m[1])
			case isRefused && !refusedHere:
				t.Errorf("docs/beside-nodepool.md, %s: the row of %s does not begin its last cell with \"refused\"", heading, m[1])
			}
			said[name] = refusedHere
		}
	}
	for name := range refused {
		spelt := "--" + name
		if len(name) == 1 {
			spelt = "-" + name
		}
		if !said[name] {
			t.Errorf("docs/beside-nodepool.md, %s: no row says that nodepool's %s is refused (write it as `%s` in the first cell)", heading, spelt, spelt)
		}
	}
}
