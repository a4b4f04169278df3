package dib

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nodepool-builder/nodepool-builder/config"
)

// qemuImgCompat is the qcow2 compatibility level nodepool asks DIB for: some clouds
// cannot read newer qcow2 files, and 0.10 works everywhere.
const qemuImgCompat = "compat=0.10"

// invocation is one disk-image-create run: its argv and its environment.
type invocation struct {
	Args []string // Args[0] is the program
	Env  []string
	// Held are the names of the daemon's variables that Env lacks (see
	// heldBack), sorted: the build log names them, never their values.
	Held []string
}

// command builds the disk-image-create command line that nodepool runs for an
// image: <dib-cmd> -x -t <formats> --checksum --no-tmpfs [--qemu-img-options
// compat=0.10] -o <out> <elements...>. out is the build's path without a format
// suffix. The environment is environ without its OS_* and NODEPOOL_* variables
// (see heldBack), with DIB_RELEASE (when the image has a release),
// DIB_IMAGE_NAME, DIB_IMAGE_FILENAME, ELEMENTS_PATH (when elementsDir is set)
// and then the image's env-vars laid over it, so env-vars win, as in nodepool.
func command(img *config.DiskImage, formats []string, out, elementsDir string, environ []string) (invocation, error) {
	dibCmd := img.DIBCmd
	if dibCmd == "" {
		dibCmd = config.DefaultDIBCmd
	}
	argv, err := splitCommand(dibCmd)
	if err != nil {
		return invocation{}, fmt.Errorf("read dib-cmd of %s: %w", img.Name, err)
	}
	if len(argv) == 0 {
		return invocation{}, fmt.Errorf("read dib-cmd of %s: it names no program", img.Name)
	}
	argv = append(argv, "-x", "-t", strings.Join(formats, ","), "--checksum", "--no-tmpfs")
	if slices.Contains(formats, "qcow2") {
		argv = append(argv, "--qemu-img-options", qemuImgCompat)
	}
	argv = append(argv, "-o", out)
	argv = append(argv, img.Elements...)

	var held []string
	env := newEnv(slices.DeleteFunc(slices.Clone(environ), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		if heldBack(k) {
			held = append(held, k)
			return true
		}
		return false
	}))
	if img.Release != "" {
		env.set("DIB_RELEASE", img.Release)
	}
	env.set("DIB_IMAGE_NAME", img.Name)
	env.set("DIB_IMAGE_FILENAME", out)
	if elementsDir != "" {
		env.set("ELEMENTS_PATH", elementsDir)
	}
	keys := make([]string, 0, len(img.EnvVars))
	for k := range img.EnvVars {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		env.set(k, img.EnvVars[k])
	}
	held = slices.DeleteFunc(held, func(k string) bool { _, set := img.EnvVars[k]; return set })
	slices.Sort(held)
	return invocation{Args: argv, Env: env.list(), Held: slices.Compact(held)}, nil
}

// fileSuffix is the suffix of the file DIB writes for a format. DIB names its
// squashfs output ".squash"; every other format is its own suffix.
func fileSuffix(format string) string {
	if format == "squashfs" {
		return "squash"
	}
	return format
}

// heldBack says whether the daemon's variable name is kept from DIB, so that
// disk-image-create and every element script under it get none of the
// credentials the daemon was started with; a diskimage's env-vars may still
// set one:
//   - OS_*: an OpenStack login's settings, its password, token, application
//     credential or client secret among them. No element of diskimage-builder
//     reads one and nodepool's DIB builds never need a cloud.
//   - NODEPOOL_*: where the configs' %(NODEPOOL_...) substitution takes their
//     secrets from, such as a repository's password meant for one diskimage.
//     nodepool hands DIB its whole environment; here an element that reads
//     one (nodepool-base's NODEPOOL_SCRIPTDIR) gets it when the diskimage's
//     env-vars set it, to '%(NODEPOOL_SCRIPTDIR)' for the daemon's value.
func heldBack(name string) bool {
	return strings.HasPrefix(name, "OS_") || strings.HasPrefix(name, "NODEPOOL_")
}

// environment is an ordered environment where a later set replaces an earlier value.
type environment struct {
	keys   []string
	values map[string]string
}

func newEnv(environ []string) *environment {
	e := &environment{values: map[string]string{}}
	for _, kv := range environ {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			continue
		}
		e.set(k, v)
	}
	return e
}

func (e *environment) set(k, v string) {
	if _, ok := e.values[k]; !ok {
		e.keys = append(e.keys, k)
	}
	e.values[k] = v
}

func (e *environment) list() []string {
	out := make([]string, 0, len(e.keys))
	for _, k := range e.keys {
		out = append(out, k+"="+e.values[k])
	}
	return out
}

// splitCommand splits a command into words the way a POSIX shell does for
// simple quoting (nodepool hands dib-cmd to Python's shlex.split): blanks
// separate words, single quotes keep everything literally, double quotes keep
// everything but a backslash before " \ $ or `, and a backslash outside quotes
// keeps the next character. Expansions and operators are not supported.
func splitCommand(s string) ([]string, error) {
	var (
		words   []string
		cur     strings.Builder
		inWord  bool
		runes   = []rune(s)
		errQuot = errors.New("unterminated quote")
	)
	for i := 0; i < len(runes); i++ {
		r := runes[i]
		switch {
		case r == ' ' || r == '\t' || r == '\n':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case r == '\\':
			inWord = true
			if i+1 < len(runes) {
				i++
				if runes[i] != '\n' { // backslash-newline joins lines
					cur.WriteRune(runes[i])
				}
			}
		case r == '\'':
			inWord = true
			end := slices.Index(runes[i+1:], '\'')
			if end < 0 {
				return nil, fmt.Errorf("split %q: %w", s, errQuot)
			}
			cur.WriteString(string(runes[i+1 : i+1+end]))
			i += end + 1
		case r == '"':
			inWord = true
			closed := false
			for i++; i < len(runes); i++ {
				c := runes[i]
				if c == '"' {
					closed = true
					break
				}
				if c == '\\' && i+1 < len(runes) && strings.ContainsRune("\"\\$`", runes[i+1]) {
					i++
					c = runes[i]
				}
				cur.WriteRune(c)
			}
			if !closed {
				return nil, fmt.Errorf("split %q: %w", s, errQuot)
			}
		default:
			inWord = true
			cur.WriteRune(r)
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}

// quoteCommand renders argv so that a shell would read it back as the same words;
// the build log shows it so that an operator can rerun a build by hand.
func quoteCommand(argv []string) string {
	parts := make([]string, len(argv))
	for i, a := range argv {
		parts[i] = shellQuote(a)
	}
	return strings.Join(parts, " ")
}

func shellQuote(s string) string {
	if s != "" && !strings.ContainsFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=,:+@%", r))
	}) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
