package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/nodepool-builder/nodepool-builder/builder"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// Why an image is paused, as image-status shows it.
const (
	pausedByConfig  = "config"      // pause: true in nodepool.yaml
	pausedByCommand = "image-pause" // image-pause at run time
)

// imageState is one image-status row.
type imageState struct {
	image    string
	source   store.Source
	pausedBy []string   // pausedByConfig, pausedByCommand
	request  *time.Time // when a build was requested, if one is pending
	// building says the request is being honoured: a build of the image started
	// after it was made is in progress.
	building bool
	newest   *store.Build // the newest ready build
	// cursor is, for a zuul-image, the newest Zuul build settled and how.
	cursor *store.Cursor
}

// imageStatusJSON is an image-status row in --json output. The first four fields
// are nodepool's, except that the request's time is RFC 3339 like every time in
// our --json output (nodepool gives build_request_age in epoch seconds); absent
// values are null.
type imageStatusJSON struct {
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
}

// requestState is the Build Request column: "pending", "building" or empty.
func (s imageState) requestState() string {
	switch {
	case s.request == nil:
		return ""
	case s.building:
		return "building"
	default:
		return "pending"
	}
}

// json is the row in --json form.
func (s imageState) json() imageStatusJSON {
	row := imageStatusJSON{Image: s.image, Paused: len(s.pausedBy) > 0, Source: string(s.source), PausedBy: s.pausedBy}
	if row.PausedBy == nil {
		row.PausedBy = []string{}
	}
	if s.request != nil {
		state, at := s.requestState(), s.request.Format(time.RFC3339)
		row.BuildRequest, row.BuildRequestTime = &state, &at
	}
	if s.newest != nil {
		name, at := s.newest.Name(), s.newest.StateTime.Format(time.RFC3339)
		row.NewestBuild, row.NewestBuildTime = &name, &at
	}
	if c := s.cursor; c != nil {
		row.LastZuulBuild, row.LastZuulOutcome = &c.ZuulUUID, &c.Outcome
		if c.Reason != "" {
			row.LastZuulReason = &c.Reason
		}
	}
	return row
}

// states returns the image-status rows of every image in the config: diskimages,
// then zuul-images, in file order.
func (a *adminSession) states(c *cli.Context) ([]imageState, error) {
	ctx := c.Context
	paused, err := a.st.Paused(ctx)
	if err != nil {
		return nil, withCode(exitFailed, err)
	}
	requests, err := a.st.BuildRequests(ctx)
	if err != nil {
		return nil, withCode(exitFailed, err)
	}
	ready, err := a.st.Builds(ctx, store.BuildFilter{State: store.Ready})
	if err != nil {
		return nil, withCode(exitFailed, err)
	}
	building, err := a.st.Builds(ctx, store.BuildFilter{State: store.Building})
	if err != nil {
		return nil, withCode(exitFailed, err)
	}
	var out []imageState
	for _, name := range a.cfg.ImageNames() {
		s := imageState{image: name}
		if di := a.cfg.DiskImage(name); di != nil {
			s.source = store.SourceDIB
			if di.Pause {
				s.pausedBy = append(s.pausedBy, pausedByConfig)
			}
		} else {
			s.source = store.SourceZuul
			if a.cfg.ZuulImage(name).Pause {
				s.pausedBy = append(s.pausedBy, pausedByConfig)
			}
			cur, err := a.st.Cursor(ctx, name)
			if err != nil {
				return nil, withCode(exitFailed, err)
			}
			if cur.ZuulUUID != "" {
				s.cursor = &cur
			}
		}
		if _, ok := paused[name]; ok {
			s.pausedBy = append(s.pausedBy, pausedByCommand)
		}
		if t, ok := requests[name]; ok {
			s.request = &t
			for _, b := range building {
				if b.Image == name && !b.Created.Before(t) {
					s.building = true
				}
			}
		}
		// Builds come newest first.
		for i := range ready {
			if ready[i].Image == name {
				s.newest = &ready[i]
				break
			}
		}
		out = append(out, s)
	}
	return out, nil
}

// status returns one image's image-status row.
func (a *adminSession) status(c *cli.Context, name string) (imageState, error) {
	states, err := a.states(c)
	if err != nil {
		return imageState{}, err
	}
	for _, s := range states {
		if s.image == name {
			return s, nil
		}
	}
	return imageState{}, withCode(exitUsage, fmt.Errorf("no image %q in %s", name, a.cfg.Path))
}

// imageStatus prints nodepool's image-status columns, then ours.
func imageStatus(c *cli.Context) error {
	if c.NArg() > 0 {
		return withCode(exitUsage, fmt.Errorf("image-status takes no arguments, not %q", c.Args().First()))
	}
	a, err := openAdmin(c, store.ReadOnly)
	if err != nil {
		return err
	}
	defer a.close()
	states, err := a.states(c)
	if err != nil {
		return err
	}
	if c.Bool("json") {
		rows := make([]imageStatusJSON, 0, len(states))
		for _, s := range states {
			rows = append(rows, s.json())
		}
		return writeJSON(c.App.Writer, rows)
	}
	t := table{header: []string{"Image", "Paused", "Build Request", "Build Request Age",
		"Source", "Paused By", "Newest Ready Build", "Build Age", "Last Zuul Build"}}
	for _, s := range states {
		// Paused is printed as nodepool prints it.
		paused, reqAge, newest, newestAge, zuul := "False", "", "", "", ""
		if len(s.pausedBy) > 0 {
			paused = "True"
		}
		if s.request != nil {
			reqAge = age(*s.request)
		}
		if s.newest != nil {
			newest, newestAge = s.newest.Name(), age(s.newest.StateTime)
		}
		if s.cursor != nil {
			// The reason of a refusal is long: image-status --json carries it.
			zuul = s.cursor.ZuulUUID + " (" + s.cursor.Outcome + ")"
		}
		t.add(s.image, paused, s.requestState(), reqAge, string(s.source), strings.Join(s.pausedBy, ","), newest, newestAge, zuul)
	}
	t.write(c.App.Writer)
	if len(a.cfg.Builder.GearmanServers) > 0 {
		gs, err := builder.ReadGearmanStatus(a.st)
		if err != nil {
			return withCode(exitFailed, err)
		}
		writeGearmanStatus(c.App.Writer, gs, time.Now())
	}
	return nil
}

// writeGearmanStatus prints what the daemon last said of its gearman worker.
func writeGearmanStatus(w io.Writer, gs *builder.GearmanStatus, now time.Time) {
	fmt.Fprintln(w)
	if gs == nil {
		fmt.Fprintln(w, "Gearman: no status yet; the daemon writes it once it runs with gearman-servers.")
		return
	}
	if gs.Stale(now) {
		fmt.Fprintf(w, "Gearman: the daemon is not running; what it last said, %s ago:\n", age(gs.Updated))
	} else {
		fmt.Fprintf(w, "Gearman (daemon pid %d, %d functions, %d jobs served, %d failed):\n", gs.PID, gs.Functions, gs.Served, gs.Failed)
	}
	t := table{header: []string{"Server", "Connected", "Since", "Functions", "Last Error"}}
	for _, s := range gs.Servers {
		connected := "no"
		if s.Connected {
			connected = "yes"
		}
		t.add(s.Address, connected, age(s.Since), fmt.Sprint(s.Registered), s.LastError)
	}
	t.write(w)
	if len(gs.Running) > 0 {
		fmt.Fprintln(w)
		t := table{header: []string{"Running Job", "Server", "Age"}}
		for _, j := range gs.Running {
			t.add(j.Function, j.Server, age(j.Started))
		}
		t.write(w)
	}
	if len(gs.Recent) > 0 {
		fmt.Fprintln(w)
		t := table{header: []string{"Recent Job", "Age", "Took", "Answered", "Result"}}
		for i := len(gs.Recent) - 1; i >= 0; i-- {
			j := gs.Recent[i]
			result, answered := j.Result, "yes"
			if j.Error != "" {
				result = "failed: " + j.Error
			}
			if !j.Delivered {
				answered = "no (connection lost)"
			}
			t.add(j.Function, age(j.Ended), j.Ended.Sub(j.Started).Round(time.Second).String(), answered, result)
		}
		t.write(w)
	}
}
