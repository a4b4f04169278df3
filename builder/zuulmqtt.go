package builder

import (
	"context"
	"log/slog"
	"os"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/metrics"
	"github.com/nodepool-builder/nodepool-builder/poller"
	"github.com/nodepool-builder/nodepool-builder/status"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/zuulmqtt"
)

// newListener makes the listener of builder.zuul-mqtt: a report of a build a
// zuul-image could fetch wakes that image's loop, whose next step, the one a
// timer would start, polls Zuul now; a connect wakes the loop of every
// zuul-image no connect woke within its poll-interval. It reads the files the
// settings name, and connects to nothing.
func (b *Builder) newListener(z config.ZuulMQTT) (*zuulmqtt.Listener, error) {
	missed := &missedPolls{b: b, last: map[string]time.Time{}}
	return zuulmqtt.New(z, zuulmqtt.Options{
		// The config of now, so that a reload counts at the next report.
		Images:    b.zuulImagesAsPolled,
		Hint:      b.pollNow,
		OnConnect: func() { missed.poll(time.Now()) },
		Logger:    b.log.With("part", "zuul-mqtt"),
	})
}

// zuulImagesAsPolled are the zuul-images of the config of now, each with the
// project its polls ask Zuul for: a report matches a zuul-image as its poll's
// answer does.
func (b *Builder) zuulImagesAsPolled() []config.ZuulImage {
	p := b.cur.Load()
	images := slices.Clone(p.cfg.ZuulImages)
	if pl, ok := p.sources[store.SourceZuul].(*poller.Poller); ok {
		for i := range images {
			images[i].Project = pl.Project(images[i])
		}
	}
	return images
}

// pollNow wakes the loop of a zuul-image: it polls Zuul now, or right after
// the step it runs.
func (b *Builder) pollNow(image string) {
	if s := b.sup.Load(); s == nil || !s.wake(loopKey{store.SourceZuul, image}) {
		b.log.Debug("no loop runs for the zuul-image a Zuul report named; nothing polled", "image", image)
	}
}

// missedPolls are the polls connects to the broker ask for: reports published
// while there was no connection are never delivered, so a connect polls every
// zuul-image, but a connect again polls each at most once per its
// poll-interval, so that a broker that comes and goes, or another client that
// takes over the client id, costs no more polls than the timers make. The
// first connect is not counted: it covers the time before the listener
// started, as the daemon's first polls do, and a broker that restarts once
// after it still has the build made while it was down fetched at once. Its
// listener calls poll from one goroutine.
type missedPolls struct {
	b         *Builder
	connected bool                 // a first connect was made
	last      map[string]time.Time // by zuul-image: when a connect again last polled it
}

// poll wakes, at now, the loop of every zuul-image of the config that no
// connect again woke within its poll-interval.
func (m *missedPolls) poll(now time.Time) {
	s := m.b.sup.Load()
	if s == nil {
		return
	}
	if !m.connected {
		m.connected = true
		images := m.b.Config().ZuulImages
		for _, zi := range images {
			s.wake(loopKey{store.SourceZuul, zi.Name})
		}
		m.b.log.Info("connected to Zuul's MQTT broker: polling every zuul-image now, for the reports missed while not connected",
			"zuul_images", len(images))
		return
	}
	due := m.due(m.b.Config().ZuulImages, now)
	for _, image := range due {
		s.wake(loopKey{store.SourceZuul, image})
	}
	if held := len(m.last) - len(due); held > 0 {
		m.b.log.Info("connected to Zuul's MQTT broker again: polling now, for the reports missed while not connected, "+
			"only the zuul-images no connect polled within their poll-interval", "zuul_images", len(due), "not_polled_again", held)
		return
	}
	m.b.log.Info("connected to Zuul's MQTT broker again: polling every zuul-image now, for the reports missed while not connected",
		"zuul_images", len(due))
}

// due returns the images a connect at now polls, and counts them polled at
// now; images gone from the config are forgotten.
func (m *missedPolls) due(images []config.ZuulImage, now time.Time) []string {
	var due []string
	last := make(map[string]time.Time, len(images))
	for _, zi := range images {
		if at, ok := m.last[zi.Name]; ok && now.Sub(at) < zi.PollInterval {
			last[zi.Name] = at
			continue
		}
		last[zi.Name] = now
		due = append(due, zi.Name)
	}
	m.last = last
	return due
}

// mqttService runs the listener of the current config's builder.zuul-mqtt
// while the daemon runs, and keeps its status file. A reload that changes the
// settings stops the listener and starts one with the new settings.
type mqttService struct {
	b   *Builder
	ctx context.Context // the daemon's
	log *slog.Logger

	mu  sync.Mutex
	cur *runningListener // nil while the config has no zuul-mqtt
	// last is the state of the last listener stopped, and stopped the counts
	// of every listener stopped, so that counts go on across restarts.
	last    *zuulmqtt.State
	stopped zuulmqtt.State

	file    *status.File
	writing bool // the status file is kept
	wg      sync.WaitGroup
}

// runningListener is a listener that runs, with the settings it was made of.
type runningListener struct {
	l    *zuulmqtt.Listener
	cfg  config.ZuulMQTT
	stop context.CancelFunc
	done chan struct{}
}

func newMQTTService(ctx context.Context, b *Builder) *mqttService {
	log := b.log.With("part", "zuul-mqtt")
	return &mqttService{b: b, ctx: ctx, log: log, file: status.NewFile(b.store, status.ZuulMQTTPart, log),
		stopped: zuulmqtt.State{Ignored: map[string]uint64{}}}
}

// apply runs the listener p's config asks for: none, the one running when its
// settings did not change, or p's own, made when p was assembled, in place of
// the one running. It is never called concurrently: Run calls it, then each
// reload in turn.
func (m *mqttService) apply(p *parts) {
	want := p.cfg.Builder.ZuulMQTT
	m.mu.Lock()
	old := m.cur
	m.mu.Unlock()
	if old != nil && want != nil && sameMQTT(old.cfg, *want) {
		return
	}
	if old == nil && (want == nil || p.mqtt == nil) {
		return
	}
	if old != nil {
		if want != nil {
			m.log.Info("builder.zuul-mqtt changed: listening with the new settings", "url", want.URL, "topics", want.Topics)
		} else {
			m.log.Info("builder.zuul-mqtt left the config: no longer listening to Zuul's reports")
		}
		m.stopListener(old)
	}
	if want == nil || p.mqtt == nil {
		m.save()
		return
	}
	ctx, cancel := context.WithCancel(m.ctx)
	r := &runningListener{l: p.mqtt, cfg: *want, stop: cancel, done: make(chan struct{})}
	m.mu.Lock()
	m.cur = r
	startWriter := !m.writing
	m.writing = true
	m.mu.Unlock()
	m.wg.Go(func() {
		defer close(r.done)
		if err := r.l.Run(ctx); err != nil {
			m.log.Error("listener to Zuul's MQTT reports stopped", "error", err)
		}
	})
	if startWriter {
		m.wg.Go(func() {
			m.file.Keep(m.ctx, nil, func() status.Stamped { return m.status() })
		})
	}
}

// stopListener stops a listener and waits for it; its counts stay counted.
func (m *mqttService) stopListener(r *runningListener) {
	r.stop()
	<-r.done
	s := r.l.State()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cur == r {
		m.cur = nil
	}
	m.stopped.Used += s.Used
	m.stopped.Hints += s.Hints
	for k, v := range s.Ignored {
		m.stopped.Ignored[k] += v
	}
	s.Connected = false
	m.last = &s
}

// wait stops the listener, once the daemon's context ended, and says in the
// status file that it no longer listens.
func (m *mqttService) wait() {
	m.mu.Lock()
	r := m.cur
	m.mu.Unlock()
	if r != nil {
		m.stopListener(r)
	}
	m.wg.Wait()
	m.save()
}

// save writes the status file once, when it is kept.
func (m *mqttService) save() {
	m.mu.Lock()
	writing := m.writing
	m.mu.Unlock()
	if writing {
		m.file.Save(m.status())
	}
}

// state is the running listener's state with the counts of those stopped
// before it; running is false when none runs, and the state that of the
// last one stopped, if any.
func (m *mqttService) state() (s zuulmqtt.State, running bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.cur != nil:
		s, running = m.cur.l.State(), true
	case m.last != nil:
		// Its counts are among those stopped.
		s = *m.last
		s.Used, s.Hints, s.Ignored = 0, 0, map[string]uint64{}
	default:
		s.Ignored = map[string]uint64{}
	}
	s.Used += m.stopped.Used
	s.Hints += m.stopped.Hints
	for _, reason := range zuulmqtt.IgnoredReasons {
		s.Ignored[reason] += m.stopped.Ignored[reason]
	}
	return s, running
}

// status is the state as the status file says it.
func (m *mqttService) status() *status.ZuulMQTT {
	s, running := m.state()
	return &status.ZuulMQTT{Stamp: status.Stamp{PID: os.Getpid()}, Listening: running, URL: s.URL,
		Topics: s.Topics, Connected: s.Connected && running, Since: s.Since, LastMessage: s.LastMessage,
		LastError: s.LastError, LastErrorAt: s.LastErrorAt, Used: s.Used, Polls: s.Hints, Ignored: s.Ignored}
}

// metrics is the state as the metrics show it; false while no listener runs.
func (m *mqttService) metrics() (metrics.ZuulMQTT, bool) {
	s, running := m.state()
	if !running {
		return metrics.ZuulMQTT{}, false
	}
	return metrics.ZuulMQTT{Connected: s.Connected, LastMessage: s.LastMessage, Used: s.Used, Polls: s.Hints,
		Ignored: s.Ignored}, true
}

// sameMQTT tells whether two zuul-mqtt settings are the same.
func sameMQTT(a, b config.ZuulMQTT) bool { return reflect.DeepEqual(a, b) }
