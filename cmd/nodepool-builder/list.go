package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/nodepool-builder/nodepool-builder/store"
)

// uploadJSON is an image-list row in --json output.
type uploadJSON struct {
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
}

// buildJSON is a dib-image-list row in --json output.
type buildJSON struct {
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
}

// newBuildJSON is a build as dib-image-list --json shows it.
func newBuildJSON(b store.Build) buildJSON {
	formats := b.Formats()
	if formats == nil {
		formats = []string{}
	}
	return buildJSON{b.Name(), b.Image, b.ID, string(b.Source), b.BuilderID, formats,
		string(b.State), b.StateTime.Format(time.RFC3339), b.Zuul.UUID, b.Reason}
}

// newUploadJSON is an upload as image-list --json shows it.
func newUploadJSON(u store.Upload) uploadJSON {
	return uploadJSON{u.BuildID, u.ID, u.Provider, u.Image, u.ExternalName, u.ExternalID,
		u.Format, string(u.State), u.StateTime.Format(time.RFC3339), uploadReason(u)}
}

// uploadReason is why an upload failed; empty unless it did.
func uploadReason(u store.Upload) string {
	if u.State != store.Failed {
		return ""
	}
	return u.LastError
}

// reasonWidth bounds the Reason column of a table; --json has the whole text.
const reasonWidth = 80

// shorten fits s in n characters, keeping its start (what was being done) and
// its end (the cause, in a chain of wrapped errors).
func shorten(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	head := n / 3
	return string(r[:head]) + "..." + string(r[len(r)-(n-head-3):])
}

func imageList(c *cli.Context) error {
	a, err := openAdmin(c, store.ReadOnly)
	if err != nil {
		return err
	}
	defer a.close()
	ups, err := a.st.Uploads(c.Context, store.UploadFilter{})
	if err != nil {
		return withCode(exitFailed, err)
	}
	if c.Bool("json") {
		rows := make([]uploadJSON, 0, len(ups))
		for _, u := range ups {
			rows = append(rows, newUploadJSON(u))
		}
		return writeJSON(c.App.Writer, rows)
	}
	t := table{header: []string{"Build ID", "Upload ID", "Provider", "Image", "Provider Image Name", "Provider Image ID", "Format", "State", "Age", "Reason"}}
	for _, u := range ups {
		t.add(u.BuildID, u.ID, u.Provider, u.Image, u.ExternalName, u.ExternalID, u.Format, string(u.State), age(u.StateTime),
			shorten(uploadReason(u), reasonWidth))
	}
	t.write(c.App.Writer)
	return nil
}

func dibImageList(c *cli.Context) error {
	a, err := openAdmin(c, store.ReadOnly)
	if err != nil {
		return err
	}
	defer a.close()
	builds, err := a.st.Builds(c.Context, store.BuildFilter{})
	if err != nil {
		return withCode(exitFailed, err)
	}
	if c.Bool("json") {
		rows := make([]buildJSON, 0, len(builds))
		for _, b := range builds {
			rows = append(rows, newBuildJSON(b))
		}
		return writeJSON(c.App.Writer, rows)
	}
	t := table{header: []string{"ID", "Image", "Builder", "Formats", "State", "Age"}}
	for _, b := range builds {
		t.add(b.Name(), b.Image, b.BuilderID, strings.Join(b.Formats(), ","), string(b.State), age(b.StateTime))
	}
	t.write(c.App.Writer)
	return nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return withCode(exitFailed, err)
	}
	return nil
}

// age formats how long ago t was as nodepool does: DD:HH:MM:SS.
func age(t time.Time) string {
	d := time.Since(t)
	if d < 0 {
		d = 0
	}
	s := int64(d.Seconds())
	return fmt.Sprintf("%02d:%02d:%02d:%02d", s/86400, s/3600%24, s/60%60, s%60)
}

// table prints rows as nodepool's listings do: a boxed ASCII table.
type table struct {
	header []string
	rows   [][]string
}

func (t *table) add(cells ...string) { t.rows = append(t.rows, cells) }

func (t *table) write(w io.Writer) {
	widths := make([]int, len(t.header))
	for i, h := range t.header {
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
	line(t.header)
	fmt.Fprintln(w, rule.String())
	for _, r := range t.rows {
		line(r)
	}
	fmt.Fprintln(w, rule.String())
}
