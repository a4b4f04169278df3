package progress

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"time"

	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
)

// barsEvery is how often the bars are brought in line with the running tasks.
const barsEvery = 250 * time.Millisecond

// Bars draws the running tasks of a tracker as bars on a terminal, one a task:
// bytes, rate and ETA for a transfer, the time and step for a build. Lines
// written to Bars go above the bars while they are drawn, so that a logger
// writing there does not tear them; before Run and after it they go straight
// to the terminal.
type Bars struct {
	t     *Tracker
	out   io.Writer
	every time.Duration
	p     atomic.Pointer[mpb.Progress]
	rows  map[uint64]*row // owned by Run
}

// row is the bar of one task, with the words it shows.
type row struct {
	bar  *mpb.Bar
	text atomic.Pointer[string]
}

// NewBars returns bars for t's tasks, to be drawn on out by Run.
func NewBars(t *Tracker, out io.Writer) *Bars {
	return &Bars{t: t, out: out, every: barsEvery, rows: map[uint64]*row{}}
}

// Write writes p above the bars while they are drawn, else to the terminal.
func (b *Bars) Write(p []byte) (int, error) {
	if c := b.p.Load(); c != nil {
		if n, err := c.Write(p); !errors.Is(err, mpb.ErrDone) {
			return n, err
		}
	}
	return b.out.Write(p)
}

// Run draws the bars until ctx ends, adding one as a task starts and removing
// it as the task ends, then removes them all and stops drawing.
func (b *Bars) Run(ctx context.Context) {
	b.start()
	defer b.stop()
	t := time.NewTicker(b.every)
	defer t.Stop()
	for {
		b.reconcile()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (b *Bars) start() {
	// Refreshed even when out is not a terminal, so that what is drawn can be seen
	// in a buffer too.
	b.p.Store(mpb.New(mpb.WithOutput(b.out), mpb.WithAutoRefresh(), mpb.WithRefreshRate(b.every)))
}

func (b *Bars) stop() {
	for id, r := range b.rows {
		r.bar.Abort(true)
		delete(b.rows, id)
	}
	b.p.Load().Wait()
}

// reconcile brings the bars in line with the tasks that run now: one step,
// level-triggered, so a missed start or end costs nothing.
func (b *Bars) reconcile() {
	running := b.t.Running()
	live := make(map[uint64]bool, len(running))
	for _, s := range running {
		live[s.ID] = true
		r, ok := b.rows[s.ID]
		if !ok {
			if r = b.add(s); r == nil {
				continue
			}
			b.rows[s.ID] = r
		}
		text := s.Summary()
		r.text.Store(&text)
		if s.Total > 0 {
			// Total 0 at the start keeps mpb from completing the bar itself: the
			// task ends it.
			r.bar.SetTotal(s.Total, false)
			r.bar.SetCurrent(min(s.Done, s.Total))
		}
	}
	for id, r := range b.rows {
		if !live[id] {
			r.bar.Abort(true)
			delete(b.rows, id)
		}
	}
}

// add makes the bar of a task: a bar for bytes, a spinner for a build.
func (b *Bars) add(s Status) *row {
	r := &row{}
	empty := ""
	r.text.Store(&empty)
	style := mpb.BarStyle().Build()
	if s.Kind == Build {
		style = mpb.SpinnerStyle().Build()
	}
	bar, err := b.p.Load().Add(0, style,
		mpb.PrependDecorators(decor.Name(string(s.Kind)+" "+s.Subject+" ", decor.WCSyncSpaceR)),
		mpb.AppendDecorators(decor.Any(func(decor.Statistics) string { return " " + *r.text.Load() })))
	if err != nil {
		return nil // drawing stopped
	}
	r.bar = bar
	return r
}
