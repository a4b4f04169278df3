package listing

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/diskimage"
	"github.com/nodepool-builder/nodepool-builder/status"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// CursorRefused is the outcome shown for a zuul-image whose poll cursor the
// store refused as it read it (see store.CheckCursor); its reason says why.
const CursorRefused = "refused"

// ImageRow is one image-status row.
type ImageRow struct {
	Name     string
	Source   store.SourceName
	PausedBy []string   // store.PausedByConfig, store.PausedByCommand
	Request  *time.Time // when a build was requested, if one is pending
	// Building says the request is being honoured: a build of the image started
	// after it was made is in progress.
	Building bool
	Newest   *store.Build // the newest ready build
	// Cursor is, for a zuul-image, the newest Zuul build settled and how, and
	// what the newest waits for.
	Cursor *store.Cursor
	// Failure is, for a diskimage, its newest build since the newest ready
	// one if that failed: what holds its next build back, and until when.
	Failure *diskimage.Failure
}

// ImageJSON is an image-status row in --json output. The first four fields
// are nodepool's, except that the request's time is RFC 3339 like every time in
// our --json output (nodepool gives build_request_age in epoch seconds); absent
// values are null.
type ImageJSON struct {
	Image            string   `json:"image"`
	Paused           bool     `json:"paused"`
	BuildRequest     *string  `json:"build_request"`      // "pending" or "building"
	BuildRequestTime *string  `json:"build_request_time"` // RFC 3339
	Source           string   `json:"source"`             // "dib" or "zuul"
	PausedBy         []string `json:"paused_by"`          // "config", "image-pause"
	NewestBuild      *string  `json:"newest_build"`       // <image>-<build_id> of the newest ready build
	NewestBuildTime  *string  `json:"newest_build_time"`  // RFC 3339: when it became ready
	// The newest Zuul build the poller settled, for zuul-images: its uuid, whether
	// it was fetched ("ready") or refused for good ("failed"), and why.
	LastZuulBuild   *string `json:"last_zuul_build"`
	LastZuulOutcome *string `json:"last_zuul_outcome"`
	LastZuulReason  *string `json:"last_zuul_reason"`
	// LastZuulID is that build's _id; ZuulBehindID, when not null, the _id of
	// Zuul's newest build, which is behind it (below it and ended no later):
	// Zuul's database was rebuilt or restored, or an answer was hostile.
	// zuul-cursor-reset makes the next poll fetch Zuul's newest build.
	LastZuulID   *int64 `json:"last_zuul_id"`
	ZuulBehindID *int64 `json:"zuul_behind_id"`
	// ZuulWaiting, when not null, says why Zuul's newest build, due, is not
	// fetched: an artifact of it is on a host the zuul-image does not allow,
	// which its artifact-hosts would; it is fetched once that host is allowed.
	ZuulWaiting *string `json:"zuul_waiting"`
	// For a diskimage whose newest build failed: that build
	// (<image>-<build_id>), when and why it failed, its build log (null when
	// there is none), and when the image is next built (RFC 3339; null while
	// it is paused or a build request is pending).
	LastFailure       *string `json:"last_failure"`
	LastFailureTime   *string `json:"last_failure_time"`
	LastFailureReason *string `json:"last_failure_reason"`
	LastFailureLog    *string `json:"last_failure_log"`
	NextAttempt       *string `json:"next_attempt"`
}

// RequestState is the Build Request column: "pending", "building" or empty.
func (s ImageRow) RequestState() string {
	switch {
	case s.Request == nil:
		return ""
	case s.Building:
		return "building"
	default:
		return "pending"
	}
}

// NextAttempt is when a diskimage whose last build failed is next built: nil
// when no failure holds it back, while it is paused (it is built once it is
// unpaused), and while a build request is pending (it is built at once).
func (s ImageRow) NextAttempt() *time.Time {
	if s.Failure == nil || len(s.PausedBy) > 0 || s.Request != nil {
		return nil
	}
	t := s.Failure.NextAttempt
	return &t
}

// JSON is the row in --json form.
func (s ImageRow) JSON() ImageJSON {
	row := ImageJSON{Image: s.Name, Paused: len(s.PausedBy) > 0, Source: string(s.Source), PausedBy: s.PausedBy}
	if row.PausedBy == nil {
		row.PausedBy = []string{}
	}
	if s.Request != nil {
		state, at := s.RequestState(), s.Request.Format(time.RFC3339)
		row.BuildRequest, row.BuildRequestTime = &state, &at
	}
	if s.Newest != nil {
		name, at := s.Newest.Name(), s.Newest.StateTime.Format(time.RFC3339)
		row.NewestBuild, row.NewestBuildTime = &name, &at
	}
	if c := s.Cursor; c != nil {
		switch {
		case c.ZuulUUID != "":
			row.LastZuulBuild, row.LastZuulOutcome, row.LastZuulID = &c.ZuulUUID, &c.Outcome, &c.ZuulID
		case c.Outcome == CursorRefused:
			row.LastZuulOutcome = &c.Outcome
		}
		if c.BehindID != 0 {
			row.ZuulBehindID = &c.BehindID
		}
		if c.Reason != "" {
			row.LastZuulReason = &c.Reason
		}
		if c.Waiting != "" {
			row.ZuulWaiting = &c.Waiting
		}
	}
	if f := s.Failure; f != nil {
		name, at, reason := f.Build.Name(), f.Build.StateTime.Format(time.RFC3339), f.Build.Reason
		row.LastFailure, row.LastFailureTime, row.LastFailureReason = &name, &at, &reason
		if f.Log != "" {
			log := f.Log
			row.LastFailureLog = &log
		}
	}
	if t := s.NextAttempt(); t != nil {
		next := t.Format(time.RFC3339)
		row.NextAttempt = &next
	}
	return row
}

// ImagesJSON is image-status --json: every row in JSON form.
func ImagesJSON(images []ImageRow) []ImageJSON {
	rows := make([]ImageJSON, 0, len(images))
	for _, s := range images {
		rows = append(rows, s.JSON())
	}
	return rows
}

// ImageStatus reads the image-status rows of every image in the config:
// diskimages, then zuul-images, in file order.
func ImageStatus(ctx context.Context, st *store.Store, cfg *config.Config) ([]ImageRow, error) {
	builds, err := st.Builds(ctx, store.BuildFilter{})
	if err != nil {
		return nil, fmt.Errorf("list builds: %w", err)
	}
	return ImageStatusOf(ctx, st, cfg, builds)
}

// ImageStatusOf is ImageStatus on builds already read (every build, newest
// first), for a caller that shows them too.
func ImageStatusOf(ctx context.Context, st *store.Store, cfg *config.Config, builds []store.Build) ([]ImageRow, error) {
	paused, err := st.Paused(ctx)
	if err != nil {
		return nil, fmt.Errorf("read paused images: %w", err)
	}
	requests, err := st.BuildRequests(ctx)
	if err != nil {
		return nil, fmt.Errorf("read build requests: %w", err)
	}
	var out []ImageRow
	for _, name := range cfg.ImageNames() {
		s := ImageRow{Name: name, PausedBy: store.PausedBy(paused, name, cfg.PausedInConfig(name))}
		if di := cfg.DiskImage(name); di != nil {
			s.Source = store.SourceDIB
			s.Failure = diskimage.LastFailure(cfg, name, builds, diskimage.DefaultFailureBackoff)
		} else {
			s.Source = store.SourceZuul
			cur, err := st.Cursor(ctx, name)
			switch {
			case errors.Is(err, store.ErrRefusedRecord):
				// Shown, not failed: the other images' status still reads.
				s.Cursor = &store.Cursor{Image: name, Outcome: CursorRefused, Reason: err.Error()}
			case err != nil:
				return nil, fmt.Errorf("read poll cursor of %s: %w", name, err)
			case cur.ZuulUUID != "" || cur.Waiting != "":
				s.Cursor = &cur
			}
		}
		if t, requested := requests[name]; requested {
			s.Request = &t
			s.Building = store.RequestTaken(builds, name, t)
		}
		// Builds come newest first.
		for i := range builds {
			if b := &builds[i]; b.Image == name && b.State == store.Ready {
				s.Newest = b
				break
			}
		}
		out = append(out, s)
	}
	return out, nil
}

// WriteImageStatus prints image-status's table: nodepool's columns, then ours;
// under it, when a diskimage's last build failed, that failure and its log.
func WriteImageStatus(w io.Writer, images []ImageRow) {
	t := Table{Header: []string{"Image", "Paused", "Build Request", "Build Request Age",
		"Source", "Paused By", "Newest Ready Build", "Build Age", "Last Zuul Build", "Last Build Failure", "Next Attempt"}}
	failures := Table{Header: []string{"Image", "Failed Build", "Log", "Reason"}}
	behind := Table{Header: []string{"Image", "Cursor Build", "Cursor Id", "Zuul's Newest Id"}}
	waiting := Table{Header: []string{"Image", "Why"}}
	for _, s := range images {
		// Paused is printed as nodepool prints it.
		paused, reqAge, newest, newestAge, zuul, failed, next := "False", "", "", "", "", "", ""
		if len(s.PausedBy) > 0 {
			paused = "True"
		}
		if s.Request != nil {
			reqAge = Age(*s.Request)
		}
		if s.Newest != nil {
			newest, newestAge = s.Newest.Name(), Age(s.Newest.StateTime)
		}
		if c := s.Cursor; c != nil {
			// The reason of a refusal is long: image-status --json carries it.
			switch {
			case c.ZuulUUID != "":
				zuul = c.ZuulUUID + " (" + c.Outcome + ")"
			case c.Outcome == CursorRefused:
				zuul = "poll cursor refused: zuul-cursor-reset " + s.Name
			}
			if c.BehindID != 0 {
				zuul += " Zuul behind"
				behind.Add(s.Name, c.ZuulUUID, fmt.Sprint(c.ZuulID), fmt.Sprint(c.BehindID))
			}
			if c.Waiting != "" {
				zuul = strings.TrimSpace(zuul + " waiting for a host")
				waiting.Add(s.Name, c.Waiting)
			}
		}
		if f := s.Failure; f != nil {
			failed = Age(f.Build.StateTime)
			log := f.Log
			if log == "" {
				log = "(none)"
			}
			failures.Add(s.Name, f.Build.Name(), log, Shorten(f.Build.Reason, ReasonWidth))
		}
		if at := s.NextAttempt(); at != nil {
			next = at.Format(time.RFC3339)
		}
		t.Add(s.Name, paused, s.RequestState(), reqAge, string(s.Source), strings.Join(s.PausedBy, ","), newest, newestAge, zuul, failed, next)
	}
	t.Write(w)
	if len(failures.rows) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "Last build failures (each holds its image's next build back until Next Attempt; image-build <image> builds it at once):")
		failures.Write(w)
	}
	if len(behind.rows) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "Zuul behind the poll cursor (Zuul's newest build has a lower id and ended no later, so it is not fetched; "+
			"if Zuul's database was rebuilt or restored, zuul-cursor-reset <image> fetches Zuul's newest build):")
		behind.Write(w)
	}
	if len(waiting.rows) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "Zuul builds waiting for an artifact host (the newest build's artifacts are on a host the zuul-image "+
			"does not allow; add it to artifact-hosts and reload, and the build is fetched):")
		waiting.Write(w)
	}
}

// WriteImageStatusText prints image-status as the CLI does: the images' table
// and, when the config has gearman-servers, what the daemon last said of its
// gearman worker, and when it has builder.zuul-mqtt, of its listener to Zuul's
// MQTT reports.
func WriteImageStatusText(w io.Writer, st *store.Store, cfg *config.Config, images []ImageRow) error {
	WriteImageStatus(w, images)
	ps, err := status.ReadProgress(st)
	if err != nil {
		return fmt.Errorf("read progress status: %w", err)
	}
	WriteProgress(w, ps, time.Now())
	if len(cfg.Builder.GearmanServers) > 0 {
		gs, err := status.ReadGearman(st)
		if err != nil {
			return fmt.Errorf("read gearman status: %w", err)
		}
		WriteGearmanStatus(w, gs, time.Now())
	}
	if cfg.Builder.ZuulMQTT != nil {
		ms, err := status.ReadZuulMQTT(st)
		if err != nil {
			return fmt.Errorf("read zuul-mqtt status: %w", err)
		}
		WriteZuulMQTTStatus(w, ms, time.Now())
	}
	return nil
}

// WriteZuulMQTTStatus prints what the daemon last said of its listener to
// Zuul's MQTT reports: the broker, the connection, the last message and
// error, and the messages used and ignored.
func WriteZuulMQTTStatus(w io.Writer, ms *status.ZuulMQTT, now time.Time) {
	const part = "Zuul MQTT reports"
	if ms == nil {
		writeNoStatus(w, part, "builder.zuul-mqtt")
		return
	}
	writeHeading(w, part, ms.Stamp, ms.Stale(now), "not listening",
		fmt.Sprintf("%d messages used, %d polls asked for", ms.Used, ms.Polls))
	t := Table{Header: []string{"Broker", "Topics", "Connected", "Since", "Last Message", "Used", "Ignored", "Last Error", "Error Age"}}
	connected, since, last, errAge := "no", "", "never", ""
	if ms.Connected && !ms.Stale(now) {
		connected = "yes"
	}
	if !ms.Since.IsZero() {
		since = Age(ms.Since)
	}
	if !ms.LastMessage.IsZero() {
		last = Age(ms.LastMessage)
	}
	if !ms.LastErrorAt.IsZero() {
		errAge = Age(ms.LastErrorAt)
	}
	t.Add(ms.URL, strings.Join(ms.Topics, " "), connected, since, last, fmt.Sprint(ms.Used), IgnoredCounts(ms.Ignored),
		Shorten(ms.LastError, ReasonWidth), errAge)
	t.Write(w)
}

// writeNoStatus prints, over the place of a part of the daemon's status, that
// the daemon has not written it: it does once it runs with setting.
func writeNoStatus(w io.Writer, part, setting string) {
	fmt.Fprintln(w)
	fmt.Fprintf(w, "%s: no status yet; the daemon writes it once it runs with %s.\n", part, setting)
}

// writeHeading prints the line over what the daemon last said of one of its
// parts: while it runs the part, its pid and counts; once stale, that it is
// notDoing the part, and how long ago it said what follows.
func writeHeading(w io.Writer, part string, said status.Stamp, stale bool, notDoing, counts string) {
	fmt.Fprintln(w)
	if stale {
		fmt.Fprintf(w, "%s: the daemon is %s; what it last said, %s ago:\n", part, notDoing, Age(said.Updated))
		return
	}
	fmt.Fprintf(w, "%s (daemon pid %d, %s):\n", part, said.PID, counts)
}

// IgnoredCounts says how many messages were ignored and why, as "malformed 2,
// no-match 5"; "0" when none was.
func IgnoredCounts(ignored map[string]uint64) string {
	reasons := make([]string, 0, len(ignored))
	for r, n := range ignored {
		if n > 0 {
			reasons = append(reasons, r)
		}
	}
	if len(reasons) == 0 {
		return "0"
	}
	slices.Sort(reasons)
	parts := make([]string, len(reasons))
	for i, r := range reasons {
		parts[i] = fmt.Sprintf("%s %d", r, ignored[r])
	}
	return strings.Join(parts, ", ")
}

// WriteProgress prints the long work the daemon runs now, as it last said:
// nothing when it runs none, or is not running.
func WriteProgress(w io.Writer, ps *status.Progress, now time.Time) {
	if ps == nil || ps.Stale(now) || len(ps.Tasks) == 0 {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Running now (daemon pid %d):\n", ps.PID)
	t := Table{Header: []string{"Kind", "Subject", "Progress", "Age"}}
	for _, k := range ps.Tasks {
		t.Add(string(k.Kind), k.Subject, k.Summary(), Age(k.Started))
	}
	t.Write(w)
}

// WriteGearmanStatus prints what the daemon last said of its gearman worker.
func WriteGearmanStatus(w io.Writer, gs *status.Gearman, now time.Time) {
	const part = "Gearman"
	if gs == nil {
		writeNoStatus(w, part, "gearman-servers")
		return
	}
	writeHeading(w, part, gs.Stamp, gs.Stale(now), "not running",
		fmt.Sprintf("%d functions, %d jobs served, %d failed", gs.Functions, gs.Served, gs.Failed))
	t := Table{Header: []string{"Server", "Connected", "Since", "Functions", "Last Error"}}
	for _, s := range gs.Servers {
		connected := "no"
		if s.Connected {
			connected = "yes"
		}
		t.Add(s.Address, connected, Age(s.Since), fmt.Sprint(s.Registered), s.LastError)
	}
	t.Write(w)
	if len(gs.Running) > 0 {
		fmt.Fprintln(w)
		t := Table{Header: []string{"Running Job", "Server", "Age"}}
		for _, j := range gs.Running {
			t.Add(j.Function, j.Server, Age(j.Started))
		}
		t.Write(w)
	}
	if len(gs.Recent) > 0 {
		fmt.Fprintln(w)
		t := Table{Header: []string{"Recent Job", "Age", "Took", "Answered", "Result"}}
		for i := len(gs.Recent) - 1; i >= 0; i-- {
			j := gs.Recent[i]
			result, answered := j.Result, "yes"
			if j.Error != "" {
				result = "failed: " + j.Error
			}
			if !j.Delivered {
				answered = "no (connection lost)"
			}
			t.Add(j.Function, Age(j.Ended), j.Ended.Sub(j.Started).Round(time.Second).String(), answered, result)
		}
		t.Write(w)
	}
}
