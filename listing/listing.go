// Package listing owns the admin listings: the rows of image-list, dib-image-list
// and image-status read from the state, and their text tables and JSON.
package listing

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/escape"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// Upload is an image-list row, as --json shows it.
type Upload struct {
	BuildID      string `json:"build_id"`
	UploadID     string `json:"upload_id"`
	Provider     string `json:"provider"`
	Image        string `json:"image"`
	ExternalName string `json:"external_name"`
	ExternalID   string `json:"external_id"`
	Format       string `json:"format"`
	State        string `json:"state"`
	StateTime    string `json:"state_time"`
	Reason       string `json:"reason,omitempty"` // why a failed upload failed

	at time.Time // StateTime, whole, for the Age column
}

// Build is a dib-image-list row, as --json shows it.
type Build struct {
	ID            string   `json:"id"`
	Image         string   `json:"image"`
	BuildID       string   `json:"build_id"`
	Source        string   `json:"source"`
	Builder       string   `json:"builder"`
	Formats       []string `json:"formats"`
	State         string   `json:"state"`
	StateTime     string   `json:"state_time"`
	ZuulBuildUUID string   `json:"zuul_build_uuid,omitempty"`
	Reason        string   `json:"reason,omitempty"` // why a failed build failed

	at time.Time
}

// NewBuild is a build as dib-image-list shows it.
func NewBuild(b store.Build) Build {
	formats := b.Formats()
	if formats == nil {
		formats = []string{}
	}
	return Build{b.Name(), b.Image, b.ID, string(b.Source), b.BuilderID, formats,
		string(b.State), b.StateTime.Format(time.RFC3339), b.Zuul.UUID, b.Reason, b.StateTime}
}

// NewUpload is an upload as image-list shows it.
func NewUpload(u store.Upload) Upload {
	return Upload{u.BuildID, u.ID, u.Provider, u.Image, u.ExternalName, u.ExternalID,
		u.Format, string(u.State), u.StateTime.Format(time.RFC3339), UploadReason(u), u.StateTime}
}

// UploadReason is why an upload failed; empty unless it did.
func UploadReason(u store.Upload) string {
	if u.State != store.Failed {
		return ""
	}
	return u.LastError
}

// Uploads reads every upload: by build, newest build first, then by provider,
// newest upload first.
func Uploads(ctx context.Context, st *store.Store) ([]Upload, error) {
	ups, err := st.Uploads(ctx, store.UploadFilter{})
	if err != nil {
		return nil, fmt.Errorf("list uploads: %w", err)
	}
	rows := make([]Upload, 0, len(ups))
	for _, u := range ups {
		rows = append(rows, NewUpload(u))
	}
	return rows, nil
}

// Builds reads every build, newest first.
func Builds(ctx context.Context, st *store.Store) ([]Build, error) {
	builds, err := st.Builds(ctx, store.BuildFilter{})
	if err != nil {
		return nil, fmt.Errorf("list builds: %w", err)
	}
	rows := make([]Build, 0, len(builds))
	for _, b := range builds {
		rows = append(rows, NewBuild(b))
	}
	return rows, nil
}

// ReasonWidth bounds the Reason column of a table; --json has the whole text.
const ReasonWidth = 80

// WriteUploads prints image-list's table.
func WriteUploads(w io.Writer, rows []Upload) {
	t := Table{Header: []string{"Build ID", "Upload ID", "Provider", "Image", "Provider Image Name", "Provider Image ID", "Format", "State", "Age", "Reason"}}
	for _, u := range rows {
		t.Add(u.BuildID, u.UploadID, u.Provider, u.Image, u.ExternalName, u.ExternalID, u.Format, u.State, Age(u.at),
			Shorten(u.Reason, ReasonWidth))
	}
	t.Write(w)
}

// WriteBuilds prints dib-image-list's table.
func WriteBuilds(w io.Writer, rows []Build) {
	t := Table{Header: []string{"ID", "Image", "Builder", "Formats", "State", "Age"}}
	for _, b := range rows {
		t.Add(b.ID, b.Image, b.Builder, strings.Join(b.Formats, ","), b.State, Age(b.at))
	}
	t.Write(w)
}

// WriteJSON prints v as every --json listing does: indented, one value.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write JSON: %w", err)
	}
	return nil
}

// Shorten fits s in n characters, keeping its start (what was being done) and
// its end (the cause, in a chain of wrapped errors).
func Shorten(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	head := n / 3
	return string(r[:head]) + "..." + string(r[len(r)-(n-head-3):])
}

// Age formats how long ago t was as nodepool does: DD:HH:MM:SS.
func Age(t time.Time) string {
	d := time.Since(t)
	if d < 0 {
		d = 0
	}
	s := int64(d.Seconds())
	return fmt.Sprintf("%02d:%02d:%02d:%02d", s/86400, s/3600%24, s/60%60, s%60)
}

// Table prints rows as nodepool's listings do: a boxed ASCII table.
type Table struct {
	Header []string
	rows   [][]string
}

// Add appends a row, one cell per header. Cells hold what Zuul, the clouds and
// the state said, so control characters in them are printed escaped: a cell
// never clears the screen or starts a line of its own.
func (t *Table) Add(cells ...string) {
	row := make([]string, len(cells))
	for i, c := range cells {
		row[i] = escape.Controls(c)
	}
	t.rows = append(t.rows, row)
}

// Write prints the table.
func (t *Table) Write(w io.Writer) {
	widths := make([]int, len(t.Header))
	for i, h := range t.Header {
		widths[i] = len(h)
	}
	for _, r := range t.rows {
		for i, c := range r {
			widths[i] = max(widths[i], len(c))
		}
	}
	var rule strings.Builder
	rule.WriteString("+")
	for _, wd := range widths {
		rule.WriteString(strings.Repeat("-", wd+2) + "+")
	}
	line := func(cells []string) {
		var b strings.Builder
		b.WriteString("|")
		for i, c := range cells {
			b.WriteString(" " + c + strings.Repeat(" ", widths[i]-len(c)) + " |")
		}
		fmt.Fprintln(w, b.String())
	}
	fmt.Fprintln(w, rule.String())
	line(t.Header)
	fmt.Fprintln(w, rule.String())
	for _, r := range t.rows {
		line(r)
	}
	fmt.Fprintln(w, rule.String())
}
