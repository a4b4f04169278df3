package webapp

import (
	"bytes"
	"context"
	"embed"
	"fmt"
	"html/template"
	"net/http"
	"strings"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/listing"
	"github.com/nodepool-builder/nodepool-builder/status"
	"github.com/nodepool-builder/nodepool-builder/store"
)

//go:embed page.html
var pageFS embed.FS

var pageTmpl = template.Must(template.New("page.html").Funcs(template.FuncMap{
	"stateClass": stateClass,
}).ParseFS(pageFS, "page.html"))

// maxFailures bounds each list of failures on the page: the newest are what
// a person acts on, and the listings have them all.
const maxFailures = 50

// pageData is what the page shows.
type pageData struct {
	Now      when
	Builder  string
	Metrics  bool // /metrics is served
	Images   []imageRow
	Failures []failureRow
	Running  []runningRow
	// MQTT is the listener to Zuul's MQTT reports, with builder.zuul-mqtt.
	MQTT *mqttRow
}

// mqttRow is what the daemon last said of its listener to Zuul's MQTT reports.
type mqttRow struct {
	// NoStatus: the daemon has said nothing yet; Stale: it no longer listens.
	NoStatus, Stale bool
	URL, Topics     string
	Connected       bool
	Since           *when
	LastMessage     *when // nil: no message yet
	Used, Polls     uint64
	Ignored         string
	LastError       string
	LastErrorAt     *when
}

type imageRow struct {
	Name, Source string
	Paused       []string
	Request      string // "pending" or "building", empty when none
	Newest       string // the newest ready build
	NewestAt     *when
	Building     bool // a build of it is in progress
	Uploads      []uploadCell
	Zuul         string // the newest Zuul build settled, and how
	ZuulOutcome  string
	// Waiting says why Zuul's newest build is not fetched: an artifact host
	// the zuul-image does not allow.
	Waiting string
	// Failed is when the newest build of a diskimage failed, FailedLog its
	// build log, and Next when the image is next built (nil while paused or
	// requested).
	Failed    *when
	FailedLog string
	Next      *when
}

type uploadCell struct {
	Provider, State, Build, ExternalID string
	At                                 *when // nil: no upload
}

type failureRow struct {
	What, Subject, Reason string
	At                    when
}

type runningRow struct {
	Kind, Subject, Summary string
	Done, Total            int64 // Total 0: not known
	Started                when
}

// when is a time as the page shows it: an age ("3m 2s ago"), and RFC 3339 in
// a title.
type when struct {
	Age, RFC3339 string
}

func at(t, now time.Time) when {
	if t.IsZero() {
		return when{Age: "unknown"}
	}
	return when{Age: humanAge(now.Sub(t)) + " ago", RFC3339: t.UTC().Format(time.RFC3339)}
}

// ahead is a time to come as the page shows it: "in 7m 3s", or "due now" once
// it has passed.
func ahead(t, now time.Time) when {
	w := when{Age: "due now", RFC3339: t.UTC().Format(time.RFC3339)}
	if d := t.Sub(now); d >= time.Second {
		w.Age = "in " + humanAge(d)
	}
	return w
}

// humanAge is a duration in its two largest units: "45s", "12m 3s", "3h 20m", "2d 4h".
func humanAge(d time.Duration) string {
	s := int64(max(d, 0) / time.Second)
	switch {
	case s < 60:
		return fmt.Sprintf("%ds", s)
	case s < 3600:
		return fmt.Sprintf("%dm %ds", s/60, s%60)
	case s < 86400:
		return fmt.Sprintf("%dh %dm", s/3600, s/60%60)
	default:
		return fmt.Sprintf("%dd %dh", s/86400, s/3600%24)
	}
}

// stateClass is the CSS class that colours a state.
func stateClass(state string) string {
	switch state {
	case string(store.Ready):
		return "ok"
	case string(store.Failed):
		return "bad"
	case string(store.Building), string(store.Uploading), "pending":
		return "busy"
	}
	return "other"
}

// page is the page for people: every image, its uploads, what failed, what runs.
func (h *handler) page(w http.ResponseWriter, r *http.Request) {
	data, err := h.pageData(r.Context())
	if err != nil {
		h.fail(w, r, err)
		return
	}
	var buf bytes.Buffer
	if err := pageTmpl.Execute(&buf, data); err != nil {
		h.fail(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Write(buf.Bytes())
}

// pageData reads the state once: the builds, the uploads, and the image-status
// rows (which read the cursors, pauses and requests).
func (h *handler) pageData(ctx context.Context) (pageData, error) {
	st, cfg, now := h.opts.Store, h.opts.Config(), time.Now()
	builds, err := st.Builds(ctx, store.BuildFilter{})
	if err != nil {
		return pageData{}, fmt.Errorf("list builds: %w", err)
	}
	ups, err := st.Uploads(ctx, store.UploadFilter{})
	if err != nil {
		return pageData{}, fmt.Errorf("list uploads: %w", err)
	}
	images, err := listing.ImageStatusOf(ctx, st, cfg, builds)
	if err != nil {
		return pageData{}, err
	}
	d := pageData{Now: at(now, now), Builder: st.BuilderID(), Metrics: h.opts.Metrics != nil,
		Images: imageRows(images, builds, ups, cfg.Providers, now), Failures: failureRows(images, builds, ups, now)}
	if cfg.Builder.ZuulMQTT != nil {
		ms, err := status.ReadZuulMQTT(st)
		if err != nil {
			return pageData{}, fmt.Errorf("read zuul-mqtt status: %w", err)
		}
		d.MQTT = mqttStatus(ms, now)
	}
	for _, t := range h.opts.Progress.Running() {
		d.Running = append(d.Running, runningRow{Kind: string(t.Kind), Subject: t.Subject, Summary: t.Summary(),
			Done: t.Done, Total: t.Total, Started: at(t.Started, now)})
	}
	return d, nil
}

// imageRows are the page's rows of the images, in the order of images: each
// with its newest build, its cursor, its last failure and the newest upload
// to each provider that has it.
func imageRows(images []listing.ImageRow, builds []store.Build, ups []store.Upload, providers []config.Provider, now time.Time) []imageRow {
	// Uploads come by build, newest first, then by provider, newest first: the
	// first seen of an image in a provider is its newest.
	newestUp := map[[2]string]store.Upload{}
	for _, u := range ups {
		k := [2]string{u.Image, u.Provider}
		if _, ok := newestUp[k]; !ok {
			newestUp[k] = u
		}
	}
	building := map[string]bool{}
	for _, b := range builds {
		if b.State == store.Building {
			building[b.Image] = true
		}
	}
	var rows []imageRow
	for _, s := range images {
		row := imageRow{Name: s.Name, Source: string(s.Source), Paused: s.PausedBy, Request: s.RequestState(),
			Building: building[s.Name]}
		if s.Newest != nil {
			t := at(s.Newest.StateTime, now)
			row.Newest, row.NewestAt = s.Newest.Name(), &t
		}
		if s.Cursor != nil {
			row.Zuul, row.ZuulOutcome, row.Waiting = s.Cursor.ZuulUUID, s.Cursor.Outcome, s.Cursor.Waiting
		}
		if f := s.Failure; f != nil {
			t := at(f.Build.StateTime, now)
			row.Failed, row.FailedLog = &t, f.Log
			if next := s.NextAttempt(); next != nil {
				w := ahead(*next, now)
				row.Next = &w
			}
		}
		for _, p := range providers {
			if p.Entry(s.Name) == nil {
				continue
			}
			cell := uploadCell{Provider: p.Name}
			if u, ok := newestUp[[2]string{s.Name, p.Name}]; ok {
				t := at(u.StateTime, now)
				cell.State, cell.Build, cell.ExternalID, cell.At = string(u.State), store.BuildName(u.Image, u.BuildID), u.ExternalID, &t
			}
			row.Uploads = append(row.Uploads, cell)
		}
		rows = append(rows, row)
	}
	return rows
}

// failureRows are the page's list of what failed: the Zuul builds refused,
// by image, then the first maxFailures failed builds and uploads in the
// store's order (newest first), so that the page stays short when much fails.
func failureRows(images []listing.ImageRow, builds []store.Build, ups []store.Upload, now time.Time) []failureRow {
	var rows []failureRow
	for _, s := range images {
		if c := s.Cursor; c != nil && c.Outcome == string(store.Failed) {
			rows = append(rows, failureRow{What: "Zuul build refused", Subject: s.Name + ": " + c.ZuulUUID,
				Reason: c.Reason, At: at(c.Time, now)})
		}
	}
	n := 0
	for _, b := range builds {
		if b.State == store.Failed && n < maxFailures {
			rows = append(rows, failureRow{What: "build", Subject: b.Name(), Reason: b.Reason, At: at(b.StateTime, now)})
			n++
		}
	}
	n = 0
	for _, u := range ups {
		if u.State == store.Failed && n < maxFailures {
			rows = append(rows, failureRow{What: "upload to " + u.Provider, Subject: store.BuildName(u.Image, u.BuildID) + " upload " + u.ID,
				Reason: listing.UploadReason(u), At: at(u.StateTime, now)})
			n++
		}
	}
	return rows
}

// mqttStatus is the page's row of the listener's status.
func mqttStatus(ms *status.ZuulMQTT, now time.Time) *mqttRow {
	if ms == nil {
		return &mqttRow{NoStatus: true}
	}
	row := &mqttRow{Stale: ms.Stale(now), URL: ms.URL, Topics: strings.Join(ms.Topics, " "), Used: ms.Used, Polls: ms.Polls,
		Ignored: listing.IgnoredCounts(ms.Ignored), LastError: ms.LastError}
	row.Connected = ms.Connected && !row.Stale
	opt := func(t time.Time) *when {
		if t.IsZero() {
			return nil
		}
		w := at(t, now)
		return &w
	}
	row.Since, row.LastMessage, row.LastErrorAt = opt(ms.Since), opt(ms.LastMessage), opt(ms.LastErrorAt)
	return row
}
