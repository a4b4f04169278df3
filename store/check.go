package store

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Records are input: in a state shared with other programs (ZooKeeper), other
// builders, older versions, an operator's hand edits or anyone who may write
// the znodes write them. Their names and ids become file names, lock paths and
// gearman function names, so a record that would make any of these say more
// than it should is refused whole on read: it is not acted on, and not deleted
// either, since judging it is not ours.

var (
	// idPattern is what a build or upload id may be: nodepool's uuid hex, an
	// older nodepool's sequence number. No '-': a build's name is
	// <image>-<id>, split at its last '-'.
	idPattern = regexp.MustCompile(`^[0-9A-Za-z][0-9A-Za-z_]{0,63}$`)
	// sourcePattern is the name of a source of builds: dib, zuul, or one
	// added later, which this version does not know and leaves alone.
	sourcePattern = regexp.MustCompile(`^[a-z][a-z0-9]{0,31}$`)
	// formatPattern is a disk image format, as the config takes one.
	formatPattern = regexp.MustCompile(`^` + formatWord + `$`)
)

// formatWord is a format, or the suffix of its file, in a pattern.
const formatWord = `[a-z][a-z0-9]{0,31}`

// maxField bounds a free-form field of a record (an external id, a host name,
// a URL): anything longer is no value nodepool or the clouds write.
const maxField = 2048

// CheckName tells whether s can be an image or provider name: a single part
// of a file name, a lock path and a gearman function name, as the config takes
// image names (no '/', no spaces or control characters, not "." or "..").
func CheckName(s string) error {
	switch {
	case s == "":
		return errors.New("is empty")
	case len(s) > 255:
		return fmt.Errorf("%.40q... is longer than 255 bytes", s)
	case !utf8.ValidString(s):
		return fmt.Errorf("%q is not UTF-8", s)
	case s == "." || s == "..":
		return fmt.Errorf("%q is a relative path", s)
	case strings.ContainsFunc(s, func(r rune) bool {
		return r == '/' || r == '\\' || unicode.IsSpace(r) || unicode.IsControl(r)
	}):
		return fmt.Errorf("%q holds a '/', a space or a control character", s)
	}
	return nil
}

// CheckID tells whether s can be a build or upload id.
func CheckID(s string) error {
	if !idPattern.MatchString(s) {
		return fmt.Errorf("%.80q is not an id (up to 64 letters, digits and '_')", s)
	}
	return nil
}

// CheckFormat tells whether s can be a disk image format.
func CheckFormat(s string) error {
	if !formatPattern.MatchString(s) {
		return fmt.Errorf("%.80q is not a format (a lowercase word such as qcow2 or raw)", s)
	}
	return nil
}

// checkText tells whether a free-form field is one line of bounded length.
func checkText(s string) error {
	switch {
	case len(s) > maxField:
		return fmt.Errorf("%.40q... is longer than %d bytes", s, maxField)
	case !utf8.ValidString(s):
		return fmt.Errorf("%.80q is not UTF-8", s)
	case strings.ContainsFunc(s, unicode.IsControl):
		return fmt.Errorf("%.80q holds a control character", s)
	}
	return nil
}

// ErrRefusedRecord is wrapped by the error of a read that found a record its
// check refuses.
var ErrRefusedRecord = errors.New("refused")

// CheckCursor tells whether a poll cursor read from the state is one the
// poller may go on from; the error says which field is not. Its reason and
// waiting texts are only shown, escaped, and are not checked.
func CheckCursor(c Cursor) error {
	var errs problems
	switch c.Outcome {
	case "", string(Ready), string(Failed), OutcomeLost, OutcomeReset:
	default:
		errs = append(errs, fmt.Errorf("outcome %.40q is not one of ready, failed, lost, reset", c.Outcome))
	}
	if c.ZuulUUID != "" {
		errs.field("zuul_uuid", CheckName(c.ZuulUUID))
	}
	if c.Build != "" {
		errs.field("build_id", CheckID(c.Build))
	}
	if c.ZuulID < 0 || c.BehindID < 0 {
		errs = append(errs, errors.New("a Zuul build id is negative"))
	}
	return errors.Join(errs...)
}

// RefuseCursor returns the error of a read that found c, when CheckCursor
// refuses it: the poller stops at it, and zuul-cursor-reset replaces it.
func RefuseCursor(c Cursor) error {
	if err := CheckCursor(c); err != nil {
		return fmt.Errorf("poll cursor of %s is %w: %w; check who wrote it, then run zuul-cursor-reset %s",
			c.Image, ErrRefusedRecord, err, c.Image)
	}
	return nil
}

// problems gathers what is wrong with a record, field by field.
type problems []error

// field notes err, when there is one, as a problem of the named field.
func (p *problems) field(name string, err error) {
	if err != nil {
		*p = append(*p, fmt.Errorf("%s %w", name, err))
	}
}

// state notes a state that is not one of those the record may be in.
func (p *problems) state(s State, states ...State) {
	if slices.Contains(states, s) {
		return
	}
	names := make([]string, len(states))
	for i, known := range states {
		names[i] = string(known)
	}
	*p = append(*p, fmt.Errorf("state %.40q is not one of %s", s, strings.Join(names, ", ")))
}

// launcher notes the problems of what nodepool records on a build and on its
// uploads for the launcher, which logs in to the nodes with them.
func (p *problems) launcher(username, pythonPath, shellType string) {
	p.field("username", checkText(username))
	p.field("python_path", checkText(pythonPath))
	p.field("shell_type", checkText(shellType))
}

// CheckBuild tells whether a build record read from the state is one the
// builder may act on; the error says which field is not.
func CheckBuild(b Build) error {
	var errs problems
	field := errs.field
	field("image", CheckName(b.Image))
	field("id", CheckID(b.ID))
	errs.state(b.State, Building, Ready, Deleting, Failed)
	if !sourcePattern.MatchString(string(b.Source)) {
		errs = append(errs, fmt.Errorf("source %.40q is not a source's name (a lowercase word, such as dib or zuul)", b.Source))
	}
	field("builder_id", checkText(b.BuilderID))
	field("builder", checkText(b.Hostname))
	errs.launcher(b.Username, b.PythonPath, b.ShellType)
	field("request", checkText(b.Request))
	field("zuul log_url", checkText(b.Zuul.LogURL))
	if b.Zuul.UUID != "" {
		// Part of the names of partial downloads.
		field("zuul uuid", CheckName(b.Zuul.UUID))
	}
	seen := map[string]bool{}
	for _, f := range b.Files {
		field("format", CheckFormat(f.Format))
		if seen[f.Format] {
			errs = append(errs, fmt.Errorf("format %q is listed twice", f.Format))
		}
		seen[f.Format] = true
		field("sha256 of "+f.Format, checkText(f.SHA256))
		field("md5 of "+f.Format, checkText(f.MD5))
		field("url of "+f.Format, checkText(f.URL))
		if f.Size < 0 {
			errs = append(errs, fmt.Errorf("size of %s is negative", f.Format))
		}
	}
	for _, format := range slices.Sorted(maps.Keys(b.Refused)) {
		field("refused format", CheckFormat(format))
	}
	return errors.Join(errs...)
}

// CheckUpload tells whether an upload record read from the state is one the
// builder may act on; the error says which field is not. The external id is
// only bounded here: providers of other drivers write ids of other shapes, and
// the uploader checks it against its cloud before it acts on it.
func CheckUpload(u Upload) error {
	var errs problems
	field := errs.field
	field("image", CheckName(u.Image))
	field("build id", CheckID(u.BuildID))
	field("provider", CheckName(u.Provider))
	field("id", CheckID(u.ID))
	errs.state(u.State, Uploading, Ready, Deleting, Failed)
	if u.Format != "" {
		field("format", CheckFormat(u.Format))
	}
	field("external_id", checkText(u.ExternalID))
	field("external_name", checkText(u.ExternalName))
	errs.launcher(u.Username, u.PythonPath, u.ShellType)
	if u.Attempts < 0 {
		errs = append(errs, errors.New("attempts is negative"))
	}
	return errors.Join(errs...)
}
