// Package metrics owns what the builder tells monitoring: the Prometheus
// registry served at /metrics, and nodepool's statsd names sent over UDP.
//
// Events (a DIB build finished, a download, an upload, a poll, a failure, a
// leaked image) are recorded where they happen through a *Metrics; a nil
// *Metrics takes every call and does nothing. Counts of builds and uploads and
// connection states are read at each scrape, so they are those of now.
//
// The statsd names and types are nodepool's builder's (dib_image_build.<image>
// status.rc, status.duration, status.last_build and <format>.size after DIB
// runs; image_update.<image>.<provider> timer and counter per ready upload;
// nothing for a failed upload; and nodepool 11's gauges of what the builder
// is doing with each image, sent in one batch by SendImageStates), from
// STATSD_HOST and STATSD_PORT (default 8125). nodepool has no name for
// fetching a Zuul-built image: to its gauges, a fetch is this builder building
// the image. STATSD_PREFIX, which nodepool does not set, prefixes every name
// with a dot. docs/monitoring.md lists every name.
package metrics

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/nodepool-builder/nodepool-builder/internal/fqdn"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// Options configure Metrics.
type Options struct {
	// Getenv reads STATSD_HOST, STATSD_PORT and STATSD_PREFIX (os.Getenv in the
	// program); nil, or STATSD_HOST empty: no statsd.
	Getenv func(string) string
	Logger *slog.Logger
	// Hostname names this host in the statsd names that have one; default
	// its fully qualified name as nodepool's builder takes it (fqdn.Name).
	Hostname string
}

// StateReader reads every build and upload of the state.
type StateReader func(ctx context.Context) ([]store.Build, []store.Upload, error)

// Link is the connection to one server.
type Link struct {
	Server    string
	Connected bool
}

// Metrics records what the builder does. A nil *Metrics does nothing.
type Metrics struct {
	log    *slog.Logger
	reg    *prometheus.Registry
	statsd *statsd // nil: statsd off
	// hostname is this host in the statsd names; act the builds and uploads
	// running now, for the gauges of nodepool 11's builder.
	hostname string
	act      activity

	buildDuration    *prometheus.HistogramVec
	downloadDuration *prometheus.HistogramVec
	uploadDuration   *prometheus.HistogramVec
	downloadedBytes  *prometheus.CounterVec
	uploadedBytes    *prometheus.CounterVec
	failures         *prometheus.CounterVec
	lastPoll         *prometheus.GaugeVec
	leaksFound       *prometheus.CounterVec
	leaksDeleted     *prometheus.CounterVec

	mu        sync.Mutex
	state     StateReader
	gearman   func() []Link
	zookeeper func() bool
	zuulMQTT  func() (ZuulMQTT, bool)
}

// ZuulMQTT is what the metrics show of the listener to Zuul's MQTT reports.
type ZuulMQTT struct {
	Connected bool
	// LastMessage is when the last message arrived; zero before the first.
	LastMessage time.Time
	// Used counts the messages that made zuul-images be polled, Polls the
	// polls they asked for, Ignored the other messages by reason; every
	// reason a message can be ignored for is there, zeros included.
	Used, Polls uint64
	Ignored     map[string]uint64
}

// hostnameTimeout bounds the lookups of the host's fully qualified name.
const hostnameTimeout = 10 * time.Second

// durationBuckets suit work that takes minutes to hours: 30 s to 8 h.
var durationBuckets = []float64{30, 60, 120, 300, 600, 900, 1200, 1800, 2700, 3600, 5400, 7200, 10800, 14400, 21600, 28800}

// New makes the registry and, when the environment names a statsd host, the
// statsd socket. It fails only for a STATSD_PORT that is not a port; a host
// that cannot be resolved is logged and statsd stays off.
func New(opts Options) (*Metrics, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	m := &Metrics{log: opts.Logger, reg: prometheus.NewRegistry(), hostname: opts.Hostname,
		act: activity{building: map[string]int{}, uploading: map[imageProvider]int{}}}
	if opts.Getenv != nil {
		s, err := newStatsd(opts.Getenv("STATSD_HOST"), opts.Getenv("STATSD_PORT"), opts.Getenv("STATSD_PREFIX"), opts.Logger)
		if err != nil {
			return nil, err
		}
		m.statsd = s
	}
	if m.statsd != nil && m.hostname == "" {
		// A resolver that does not answer must not hold up the start for long.
		ctx, cancel := context.WithTimeout(context.Background(), hostnameTimeout)
		m.hostname = fqdn.Name(ctx)
		cancel()
	}
	const ns = "nodepool_builder"
	m.buildDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "build_duration_seconds",
		Help: "How long DIB builds took, by image and outcome (ready, failed).", Buckets: durationBuckets}, []string{"image", "state"})
	m.downloadDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "download_duration_seconds",
		Help: "How long downloads of Zuul-built image files took, by image and outcome.", Buckets: durationBuckets}, []string{"image", "state"})
	m.uploadDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "upload_duration_seconds",
		Help: "How long upload attempts took, by image, provider and outcome.", Buckets: durationBuckets}, []string{"image", "provider", "state"})
	m.downloadedBytes = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "downloaded_bytes_total",
		Help: "Bytes of Zuul artifacts fetched over the network, by image."}, []string{"image"})
	m.uploadedBytes = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "uploaded_bytes_total",
		Help: "Bytes of image files of the uploads that became ready, by image and provider."}, []string{"image", "provider"})
	m.failures = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "failures_total",
		Help: "Failures by step (build, download, upload, delete, poll, sweep) and reason class."}, []string{"step", "reason"})
	m.lastPoll = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "last_successful_poll_timestamp_seconds",
		Help: "Unix time Zuul last answered a poll of the zuul-image."}, []string{"image"})
	m.leaksFound = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "leaked_images_found_total",
		Help: "Cloud images tagged by this builder but unknown to the state, counted when the leak sweep first sees them."}, []string{"provider"})
	m.leaksDeleted = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "leaked_images_deleted_total",
		Help: "Leaked cloud images the leak sweep deleted."}, []string{"provider"})
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.buildDuration, m.downloadDuration, m.uploadDuration, m.downloadedBytes, m.uploadedBytes,
		m.failures, m.lastPoll, m.leaksFound, m.leaksDeleted,
		stateCollector{m}, linkCollector{m},
	)
	return m, nil
}

// Handler serves the registry in Prometheus's exposition formats; on a nil
// Metrics it answers 404.
func (m *Metrics) Handler() http.Handler {
	if m == nil {
		return http.NotFoundHandler()
	}
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorLog: slogPrinter{m.log}})
}

// Close closes the statsd socket.
func (m *Metrics) Close() error {
	if m == nil || m.statsd == nil {
		return nil
	}
	return m.statsd.close()
}

// WatchState has the counts of builds and uploads read through read at every scrape.
func (m *Metrics) WatchState(read StateReader) {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.state = read
	m.mu.Unlock()
}

// WatchGearman has the gearman connections read through servers at every scrape.
func (m *Metrics) WatchGearman(servers func() []Link) {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.gearman = servers
	m.mu.Unlock()
}

// WatchZooKeeper has the ZooKeeper connection read through connected at every scrape.
func (m *Metrics) WatchZooKeeper(connected func() bool) {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.zookeeper = connected
	m.mu.Unlock()
}

// WatchZuulMQTT has the listener to Zuul's MQTT reports read through read at
// every scrape; read says false while no listener runs.
func (m *Metrics) WatchZuulMQTT(read func() (ZuulMQTT, bool)) {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.zuulMQTT = read
	m.mu.Unlock()
}

// DIBBuild is a finished DIB build.
type DIBBuild struct {
	Image string
	// Ran says DIB's process ran (or failed to start) and ExitCode is its exit
	// code; false when the build failed before DIB started.
	Ran      bool
	ExitCode int
	TimedOut bool // build-timeout killed it
	Duration time.Duration
	// Err is why the build failed; nil for a ready build.
	Err error
	// Files holds, by format, the paths of a ready build's files.
	Files map[string]string
}

// DIBBuilt records a finished DIB build.
func (m *Metrics) DIBBuilt(b DIBBuild) {
	if m == nil {
		return
	}
	state := "ready"
	if b.Err != nil {
		state = "failed"
		reason := Classify(StepBuild, b.Err)
		switch {
		case b.TimedOut:
			reason = ReasonTimeout
		case b.Ran && b.ExitCode != 0 && reason != ReasonCancelled:
			reason = ReasonExit
		}
		m.failures.WithLabelValues(string(StepBuild), string(reason)).Inc()
	}
	m.buildDuration.WithLabelValues(b.Image, state).Observe(b.Duration.Seconds())
	// A build the builder killed as it stopped says nothing of the image: no
	// exit code to report, as nodepool, which lets DIB finish, never has one.
	if m.statsd == nil || !b.Ran || errors.Is(b.Err, context.Canceled) {
		return
	}
	base := "nodepool.dib_image_build." + key(b.Image)
	if b.Err == nil {
		for format, path := range b.Files {
			if size, ok := diskSize(path); ok {
				m.statsd.gauge(base+"."+key(format)+".size", size)
			}
		}
	}
	m.statsd.gauge(base+".status.rc", int64(b.ExitCode))
	m.statsd.timing(base+".status.duration", b.Duration)
	m.statsd.gauge(base+".status.last_build", time.Now().Unix())
}

// Downloaded records a download of a Zuul-built image file: bytes is what came
// over the network, err why it failed (nil: it is in place).
func (m *Metrics) Downloaded(image string, bytes int64, d time.Duration, err error) {
	if m == nil {
		return
	}
	state := "ready"
	if err != nil {
		state = "failed"
		m.Failed(StepDownload, err)
	}
	if bytes > 0 {
		m.downloadedBytes.WithLabelValues(image).Add(float64(bytes))
	}
	m.downloadDuration.WithLabelValues(image, state).Observe(d.Seconds())
}

// Uploaded records an upload attempt: bytes is the file's size, err why it
// failed (nil: the upload is ready).
func (m *Metrics) Uploaded(image, provider string, bytes int64, d time.Duration, err error) {
	if m == nil {
		return
	}
	if err != nil {
		m.Failed(StepUpload, err)
		m.uploadDuration.WithLabelValues(image, provider, "failed").Observe(d.Seconds())
		return
	}
	m.uploadedBytes.WithLabelValues(image, provider).Add(float64(bytes))
	m.uploadDuration.WithLabelValues(image, provider, "ready").Observe(d.Seconds())
	if m.statsd != nil {
		name := "nodepool.image_update." + key(image) + "." + key(provider)
		m.statsd.timing(name, d)
		m.statsd.count(name, 1)
	}
}

// Polled records that Zuul answered a poll of a zuul-image.
func (m *Metrics) Polled(image string) {
	if m == nil {
		return
	}
	m.lastPoll.WithLabelValues(image).Set(float64(time.Now().Unix()))
}

// Failed counts a failure of a step, by the class of err.
func (m *Metrics) Failed(step Step, err error) {
	if m == nil || err == nil {
		return
	}
	m.failures.WithLabelValues(string(step), string(Classify(step, err))).Inc()
}

// LeakFound counts a leaked image the sweep saw for the first time.
func (m *Metrics) LeakFound(provider string) {
	if m == nil {
		return
	}
	m.leaksFound.WithLabelValues(provider).Inc()
}

// LeakDeleted counts a leaked image the sweep deleted.
func (m *Metrics) LeakDeleted(provider string) {
	if m == nil {
		return
	}
	m.leaksDeleted.WithLabelValues(provider).Inc()
}

// slogPrinter lets promhttp log its errors through slog.
type slogPrinter struct{ log *slog.Logger }

func (p slogPrinter) Println(v ...any) { p.log.Warn("serving metrics", "error", v) }
