// Package zuulmqtt listens to the reports Zuul's MQTT reporter publishes and
// turns those of a successful build a zuul-image could fetch into a hint: "poll
// this zuul-image now". It connects, parses and matches; it never fetches.
package zuulmqtt

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/defaults"
	"github.com/nodepool-builder/nodepool-builder/internal/escape"
	"github.com/nodepool-builder/nodepool-builder/internal/ratelimit"
	"github.com/nodepool-builder/nodepool-builder/internal/reconnect"
)

// MaxMessageSize is the largest report read; a larger message is dropped
// unread. Zuul's reports of a buildset are a few KiB, tens with returned data.
const MaxMessageSize = 1 << 20

// Defaults of the bound on hints per image: DefaultHintBurst at once, then one
// every DefaultHintInterval.
const (
	DefaultHintBurst    = 2
	DefaultHintInterval = 30 * time.Second
)

// Why a message was not used, as State.Ignored counts them.
const (
	// IgnoredTooLarge: over MaxMessageSize.
	IgnoredTooLarge = "too-large"
	// IgnoredMalformed: not a report of Zuul's MQTT reporter.
	IgnoredMalformed = "malformed"
	// IgnoredUnfinished: a report of an item whose builds have not run yet
	// (enqueue, start).
	IgnoredUnfinished = "unfinished"
	// IgnoredNoMatch: no successful build a zuul-image could fetch.
	IgnoredNoMatch = "no-match"
	// IgnoredRateLimited: every image it matched had had its hints for now;
	// one hint per image is held for when the bound allows it.
	IgnoredRateLimited = "rate-limited"
	// IgnoredBacklog: reports came faster than they could be read.
	IgnoredBacklog = "backlog"
)

// IgnoredReasons are the reasons a message is ignored for, in State.Ignored.
var IgnoredReasons = []string{IgnoredTooLarge, IgnoredMalformed, IgnoredUnfinished, IgnoredNoMatch, IgnoredRateLimited, IgnoredBacklog}

const (
	// connectTimeout bounds a connect: TCP, TLS and the broker's answer.
	connectTimeout = 10 * time.Second
	// subscribeTimeout bounds the wait for the broker to accept the subscriptions.
	subscribeTimeout = 10 * time.Second
	// keepAlive is how often an idle connection is checked.
	keepAlive = 30 * time.Second
	// minBackoff and maxBackoff bound the wait before a reconnect, which
	// doubles, with jitter, while connecting keeps failing (reconnect.Streak).
	minBackoff = 500 * time.Millisecond
	maxBackoff = 10 * time.Second
	// queueLen is how many received reports wait to be read, and
	// queueBytes how many bytes they may hold together: a flood of large
	// messages is dropped rather than held.
	queueLen   = 256
	queueBytes = 16 << 20
	// logTopicLen is how much of a topic a log line shows.
	logTopicLen = 200
)

// Options are what a Listener needs besides the broker's settings.
type Options struct {
	// Images returns the zuul-images reports are matched against; it is asked
	// for each report, so a reload takes effect at once.
	Images func() []config.ZuulImage
	// Hint is called with the name of a zuul-image a report says may have a
	// new build: poll it now. OnConnect is called after each connect, once
	// the subscriptions are in place: reports may have been missed while there
	// was no connection, so poll every zuul-image. Both are called from one
	// goroutine, never at once, and should return quickly (queue the poll).
	Hint      func(image string)
	OnConnect func()
	Logger    *slog.Logger
	// HintBurst and HintInterval bound the hints for one image: HintBurst at
	// once, then one every HintInterval. Zero means DefaultHintBurst and
	// DefaultHintInterval.
	HintBurst    int
	HintInterval time.Duration
}

// State is what a status page shows of the listener. It holds no secret.
type State struct {
	// URL is the broker, Topics what is subscribed to.
	URL    string
	Topics []string
	// Connected tells whether the listener is connected and subscribed, since
	// when (or since when it is not; zero before the first attempt ends).
	Connected bool
	Since     time.Time
	// LastMessage is when the last message arrived, used or not.
	LastMessage time.Time
	// LastError is why the last connect failed or the connection was lost,
	// and LastErrorAt when; empty when there was none.
	LastError   string
	LastErrorAt time.Time
	// Used counts the messages that gave hints, Hints the hints given (a
	// message may hint at several images, and a held hint is given later),
	// Ignored the other messages by reason (see IgnoredReasons).
	Used    uint64
	Hints   uint64
	Ignored map[string]uint64
}

// Listener keeps a connection to Zuul's MQTT broker and turns reports into hints.
type Listener struct {
	cfg      config.ZuulMQTT
	opts     Options
	log      *slog.Logger
	tls      *tls.Config // nil for mqtt://
	clientID string
	warnings []string

	running atomic.Bool
	queue   chan message
	queued  atomic.Int64 // bytes in queue
	// connected tells the worker that a connect finished: call OnConnect.
	connected chan struct{}

	mu    sync.Mutex
	state State
}

// message is a report as it arrived.
type message struct {
	topic   string
	payload []byte
}

// New checks the broker's settings and reads the files they name (ca-cert,
// client-cert and client-key, and password-file, which is read again at each
// connect), so that a problem shows before the daemon runs. It connects to
// nothing: Run does.
func New(cfg config.ZuulMQTT, opts Options) (*Listener, error) {
	if opts.Images == nil || opts.Hint == nil {
		return nil, errors.New("zuul-mqtt: the listener needs Images and Hint")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	opts.HintBurst = defaults.Positive(opts.HintBurst, DefaultHintBurst)
	opts.HintInterval = defaults.Positive(opts.HintInterval, DefaultHintInterval)
	if cfg.Host == "" || cfg.Port == 0 {
		return nil, fmt.Errorf("zuul-mqtt: no broker host and port in %q", cfg.URL)
	}
	if len(cfg.Topics) == 0 {
		cfg.Topics = config.DefaultZuulMQTTTopics
	}
	l := &Listener{
		cfg:       cfg,
		opts:      opts,
		log:       opts.Logger.With("mqtt_broker", cfg.URL),
		queue:     make(chan message, queueLen),
		connected: make(chan struct{}, 1),
		state:     State{URL: cfg.URL, Topics: slices.Clone(cfg.Topics), Ignored: map[string]uint64{}},
	}
	var err error
	if l.tls, err = tlsConfig(cfg); err != nil {
		return nil, err
	}
	if cfg.PasswordFile != "" {
		if _, err := readPassword(cfg.PasswordFile); err != nil {
			return nil, fmt.Errorf("zuul-mqtt: %w", err)
		}
		if !cfg.TLS {
			l.warnings = append(l.warnings, "zuul-mqtt: the password of password-file is sent over plain mqtt:// to "+
				cfg.URL+", where anyone on the way can read it: use an mqtts:// url")
		}
	}
	id := make([]byte, 3)
	if _, err := rand.Read(id); err != nil {
		return nil, fmt.Errorf("zuul-mqtt: client id: %w", err)
	}
	// 23 characters, the most every broker must take. A random part, so that
	// builders sharing a broker do not push each other off.
	l.clientID = "nodepool-builder-" + hex.EncodeToString(id)
	return l, nil
}

// Warnings lists what in the settings puts a credential at risk (a password
// sent over plain mqtt://). Run logs each when it starts.
func (l *Listener) Warnings() []string { return slices.Clone(l.warnings) }

// tlsConfig is the TLS of an mqtts:// broker: the system roots and ca-cert,
// and the client certificate; nil for mqtt://.
func tlsConfig(cfg config.ZuulMQTT) (*tls.Config, error) {
	if !cfg.TLS {
		return nil, nil
	}
	tc := &tls.Config{ServerName: cfg.Host, MinVersion: tls.VersionTLS12}
	if cfg.CACert != "" {
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		pem, err := os.ReadFile(cfg.CACert)
		if err != nil {
			return nil, fmt.Errorf("zuul-mqtt: read ca-cert: %w", err)
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("zuul-mqtt: ca-cert %s holds no PEM certificate", cfg.CACert)
		}
		tc.RootCAs = pool
	}
	if cfg.ClientCert != "" || cfg.ClientKey != "" {
		cert, err := tls.LoadX509KeyPair(cfg.ClientCert, cfg.ClientKey)
		if err != nil {
			return nil, fmt.Errorf("zuul-mqtt: load client-cert %s and client-key %s: %w", cfg.ClientCert, cfg.ClientKey, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// maxPasswordFile bounds what is read of a password file.
const maxPasswordFile = 64 << 10

// readPassword reads a password file; one trailing newline is not part of the
// password. The error names the file, never what it holds.
func readPassword(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("read password-file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxPasswordFile+1))
	if err != nil {
		return "", fmt.Errorf("read password-file %s: %w", path, err)
	}
	if len(data) > maxPasswordFile {
		return "", fmt.Errorf("password-file %s is larger than %d bytes; it should hold the password alone", path, maxPasswordFile)
	}
	s := strings.TrimSuffix(strings.TrimSuffix(string(data), "\n"), "\r")
	if s == "" {
		return "", fmt.Errorf("password-file %s is empty; write the password into it", path)
	}
	return s, nil
}

// State returns a copy of the listener's state.
func (l *Listener) State() State {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.state
	s.Topics = slices.Clone(s.Topics)
	s.Ignored = make(map[string]uint64, len(l.state.Ignored))
	for k, v := range l.state.Ignored {
		s.Ignored[k] = v
	}
	return s
}

// Run connects to the broker, subscribes to the topics and gives hints until
// ctx ends. A lost or failed connection is tried again after a backoff that
// doubles, with jitter, up to 10 s. It returns nil once ctx has ended and
// everything it started has stopped, or an error at once when the listener is
// already running.
func (l *Listener) Run(ctx context.Context) error {
	if !l.running.CompareAndSwap(false, true) {
		return errors.New("zuul-mqtt: Run called while running")
	}
	defer l.running.Store(false)
	for _, w := range l.warnings {
		l.log.Warn(w)
	}
	var wg sync.WaitGroup
	wg.Go(func() { l.work(ctx) })
	l.connectLoop(ctx)
	wg.Wait()
	return nil
}

// connectLoop keeps a connection until ctx ends.
func (l *Listener) connectLoop(ctx context.Context) {
	streak := reconnect.New(minBackoff, maxBackoff)
	for ctx.Err() == nil {
		connectedAt, err := l.session(ctx)
		if ctx.Err() != nil {
			l.setDisconnected(nil)
			return
		}
		var lasted time.Duration
		if !connectedAt.IsZero() {
			lasted = time.Since(connectedAt)
		}
		delay, logIt := streak.Failed(lasted)
		msg := l.setDisconnected(err)
		if logIt {
			l.log.Warn("no connection to Zuul's MQTT broker; reports are not heard until it is back, polls go on",
				"error", msg, "failures", streak.Failures(), "retry_in", delay.Round(time.Millisecond))
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
}

// session makes one connection: connect, subscribe, and wait until it is lost
// or ctx ends. connectedAt is when it was subscribed, zero when it got not so far.
func (l *Listener) session(ctx context.Context) (connectedAt time.Time, err error) {
	var password string
	if l.cfg.PasswordFile != "" {
		if password, err = readPassword(l.cfg.PasswordFile); err != nil {
			return time.Time{}, err
		}
	}
	defer func() { err = redactPassword(err, password) }()
	lost := make(chan error, 1)
	var guard dialGuard
	client := mqtt.NewClient(l.clientOptions(ctx, password, &guard, lost))
	disconnect := func() {
		guard.release()
		// Waits for the client's goroutines; the quiesce bounds the wait for
		// the broker to take the DISCONNECT.
		client.Disconnect(250)
	}

	tok := client.Connect()
	<-tok.Done() // bounded by connectTimeout, and by ctx through the connection
	if err := tok.Error(); err != nil {
		return time.Time{}, l.connectError(err)
	}
	if err := l.subscribe(client); err != nil {
		disconnect()
		return time.Time{}, err
	}
	// Connected: the connection stays open until Disconnect, even if ctx ends.
	guard.release()
	connectedAt = time.Now()
	l.announceConnected(connectedAt)

	select {
	case <-ctx.Done():
		client.Disconnect(250)
		return connectedAt, nil
	case err := <-lost:
		return connectedAt, fmt.Errorf("connection to %s lost: %w", l.cfg.URL, err)
	}
}

// redactPassword takes the password out of err's text. Neither the client's
// errors nor ours quote it; should one ever, it goes no further. A password
// shorter than 4 bytes is left alone: replacing it would mangle the message
// and hide nothing.
func redactPassword(err error, password string) error {
	if err != nil && len(password) >= 4 && strings.Contains(err.Error(), password) {
		return errors.New(strings.ReplaceAll(err.Error(), password, "REDACTED"))
	}
	return err
}

// dialGuard closes the connection when ctx ends while connecting, so that a
// broker that does not answer holds Run up no longer than ctx. The client
// dials from its own goroutine, hence the lock.
type dialGuard struct {
	mu   sync.Mutex
	stop func() bool
}

// watch closes conn when ctx ends, until release.
func (g *dialGuard) watch(ctx context.Context, conn net.Conn) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.stop = context.AfterFunc(ctx, func() { conn.Close() })
}

// release stops watching: a subscribed connection stays open until
// Disconnect, and a failed one is closed by Disconnect.
func (g *dialGuard) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stop != nil {
		g.stop()
	}
}

// clientOptions are the client's settings for one session: it dials through
// l.dial (TLS, the size bound of limitConn, the guard) rather than by itself,
// never reconnects on its own (connectLoop does, with a backoff), and sends
// why the connection was lost to lost.
func (l *Listener) clientOptions(ctx context.Context, password string, guard *dialGuard, lost chan<- error) *mqtt.ClientOptions {
	open := func(*url.URL, mqtt.ClientOptions) (net.Conn, error) {
		conn, err := l.dial(ctx)
		if err != nil {
			return nil, err
		}
		guard.watch(ctx, conn)
		return newLimitConn(conn, maxPacket, l.skipped), nil
	}
	opts := mqtt.NewClientOptions().
		// The scheme and address are not dialled: open is.
		AddBroker("tcp://" + net.JoinHostPort(l.cfg.Host, strconv.Itoa(l.cfg.Port))).
		SetCustomOpenConnectionFn(open).
		SetClientID(l.clientID).
		SetProtocolVersion(4). // MQTT 3.1.1, as Zuul's reporter speaks it
		SetCleanSession(true).
		SetAutoReconnect(false).
		SetConnectRetry(false).
		SetResumeSubs(false).
		SetKeepAlive(keepAlive).
		SetPingTimeout(connectTimeout).
		SetConnectTimeout(connectTimeout).
		SetWriteTimeout(connectTimeout).
		SetOrderMatters(true).
		SetConnectionLostHandler(func(_ mqtt.Client, err error) {
			select {
			case lost <- err:
			default:
			}
		})
	if l.cfg.Username != "" {
		opts.SetUsername(l.cfg.Username)
		opts.SetPassword(password)
	}
	return opts
}

// subscribe subscribes a connected client to the topics, and fails when the
// broker does not answer in subscribeTimeout or refuses a topic: a listener
// that hears nothing should say so rather than seem connected.
func (l *Listener) subscribe(client mqtt.Client) error {
	filters := map[string]byte{}
	for _, t := range l.cfg.Topics {
		// QoS 0: a report lost on the way costs nothing a poll does not make
		// up, and only a QoS 0 message can be skipped unread (limitConn).
		filters[t] = 0
	}
	stok := client.SubscribeMultiple(filters, l.receive)
	select {
	case <-stok.Done():
	case <-time.After(subscribeTimeout):
		return fmt.Errorf("subscribe to %q at %s: no answer from the broker in %s", l.cfg.Topics, l.cfg.URL, subscribeTimeout)
	}
	if err := stok.Error(); err != nil {
		return fmt.Errorf("subscribe to %q at %s: %w", l.cfg.Topics, l.cfg.URL, err)
	}
	if st, ok := stok.(*mqtt.SubscribeToken); ok {
		if topic, refused := refusedTopic(st.Result()); refused {
			return fmt.Errorf("the broker at %s refused the subscription to %q; check that user %q may subscribe to it", l.cfg.URL, topic, l.cfg.Username)
		}
	}
	return nil
}

// subackFailure is the return code of a SUBACK for a refused topic (MQTT
// 3.1.1, 3.9.3).
const subackFailure = 0x80

// refusedTopic returns a topic the broker's SUBACK codes refuse, if any.
func refusedTopic(codes map[string]byte) (string, bool) {
	for topic, code := range codes {
		if code == subackFailure {
			return topic, true
		}
	}
	return "", false
}

// announceConnected records the connection in State, logs it and tells the
// worker to call OnConnect: reports may have been missed while there was none.
func (l *Listener) announceConnected(at time.Time) {
	l.setConnected(at)
	l.log.Info("listening to Zuul's reports", "topics", l.cfg.Topics)
	select {
	case l.connected <- struct{}{}:
	default: // one OnConnect is already due
	}
}

// connectError says what a failed connect means for the operator.
func (l *Listener) connectError(err error) error {
	msg := err.Error()
	lower := strings.ToLower(msg)
	switch {
	case strings.Contains(lower, "not authori") || strings.Contains(lower, "bad user name or password"):
		who := "without a user name"
		if l.cfg.Username != "" {
			who = fmt.Sprintf("as %q", l.cfg.Username)
		}
		fix := "check username and the password in password-file"
		if l.cfg.PasswordFile == "" {
			fix = "set username and password-file to a user the broker knows"
		}
		return fmt.Errorf("the broker at %s refused the login %s (%s); %s", l.cfg.URL, who, msg, fix)
	case strings.Contains(lower, "x509:") || strings.Contains(lower, "tls: failed to verify"):
		return fmt.Errorf("connect to %s: %w; if the broker's certificate is right, set ca-cert to the CA that signed it", l.cfg.URL, err)
	case strings.Contains(lower, "identifier rejected"):
		return fmt.Errorf("the broker at %s refused the client id %s (%s)", l.cfg.URL, l.clientID, msg)
	}
	return fmt.Errorf("connect to %s: %w", l.cfg.URL, err)
}

// dial opens the connection to the broker, with TLS for mqtts://.
func (l *Listener) dial(ctx context.Context) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	d := &net.Dialer{KeepAlive: keepAlive}
	addr := net.JoinHostPort(l.cfg.Host, strconv.Itoa(l.cfg.Port))
	if l.tls == nil {
		return d.DialContext(ctx, "tcp", addr)
	}
	td := &tls.Dialer{NetDialer: d, Config: l.tls}
	return td.DialContext(ctx, "tcp", addr)
}

// receive takes a message from the client. It only queues it: the client
// waits for it before it reads the next.
func (l *Listener) receive(_ mqtt.Client, m mqtt.Message) {
	l.mu.Lock()
	l.state.LastMessage = time.Now()
	l.mu.Unlock()
	payload := m.Payload()
	if len(payload) > MaxMessageSize {
		l.ignore(IgnoredTooLarge, m.Topic(), len(payload), nil)
		return
	}
	if l.queued.Add(int64(len(payload))) > queueBytes {
		l.queued.Add(-int64(len(payload)))
		l.ignore(IgnoredBacklog, m.Topic(), len(payload), nil)
		return
	}
	select {
	case l.queue <- message{topic: m.Topic(), payload: payload}:
	default:
		l.queued.Add(-int64(len(payload)))
		l.ignore(IgnoredBacklog, m.Topic(), len(payload), nil)
	}
}

// skipped counts a message limitConn dropped unread.
func (l *Listener) skipped(topic string, size int) {
	l.mu.Lock()
	l.state.LastMessage = time.Now()
	l.mu.Unlock()
	l.ignore(IgnoredTooLarge, topic, size, nil)
}

// work reads the queued reports and gives hints, held ones too, and calls
// OnConnect after a connect, until ctx ends.
func (l *Listener) work(ctx context.Context) {
	lim := ratelimit.New(l.opts.HintBurst, l.opts.HintInterval)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	release := func() {
		images, next := lim.Release(time.Now())
		slices.Sort(images)
		for _, image := range images {
			l.log.Info("polling a zuul-image now for the Zuul reports over MQTT that were held back", "image", image)
			l.hint(image)
		}
		if !next.IsZero() {
			timer.Reset(time.Until(next))
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.connected:
			if l.opts.OnConnect != nil {
				l.opts.OnConnect()
			}
		case m := <-l.queue:
			l.queued.Add(-int64(len(m.payload)))
			l.handle(m, lim)
			release()
		case <-timer.C:
			release()
		}
	}
}

// handle reads one report and gives a hint for every zuul-image one of its
// builds could be, as far as the bound allows.
func (l *Listener) handle(m message, lim *ratelimit.Limiter) {
	r, err := parseReport(m.payload)
	if err != nil {
		l.ignore(IgnoredMalformed, m.topic, len(m.payload), err)
		return
	}
	if !r.finished() {
		l.ignore(IgnoredUnfinished, m.topic, len(m.payload), nil)
		return
	}
	builds, err := r.builds()
	if err != nil {
		l.ignore(IgnoredMalformed, m.topic, len(m.payload), err)
		return
	}
	images := l.opts.Images()
	hinted, held := 0, 0
	seen := map[string]bool{}
	for _, zb := range builds {
		for i := range images {
			zi := &images[i]
			if seen[zi.Name] || !couldBe(zi, r.Tenant, zb) {
				continue
			}
			seen[zi.Name] = true
			if !lim.Allow(zi.Name, time.Now()) {
				held++
				l.log.Debug("a Zuul report over MQTT names a build of a zuul-image polled just now; the poll waits",
					"image", zi.Name, "zuul_build", zb.UUID)
				continue
			}
			hinted++
			l.log.Info("polling a zuul-image now: Zuul reported a successful build of its job over MQTT",
				"image", zi.Name, "zuul_build", zb.UUID, "job", zi.JobName, "pipeline", clip(zb.Pipeline))
			l.hint(zi.Name)
		}
	}
	switch {
	case hinted > 0:
		l.mu.Lock()
		l.state.Used++
		l.mu.Unlock()
	case held > 0:
		l.ignore(IgnoredRateLimited, m.topic, len(m.payload), nil)
	default:
		l.ignore(IgnoredNoMatch, m.topic, len(m.payload), nil)
	}
}

func (l *Listener) hint(image string) {
	l.mu.Lock()
	l.state.Hints++
	l.mu.Unlock()
	l.opts.Hint(image)
}

// ignore counts a message not used, and logs it at debug: its topic and size,
// never its content.
func (l *Listener) ignore(reason, topic string, size int, err error) {
	l.mu.Lock()
	l.state.Ignored[reason]++
	l.mu.Unlock()
	if !l.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	args := []any{"reason", reason, "topic", clip(topic), "bytes", size}
	if err != nil {
		args = append(args, "error", clip(err.Error()))
	}
	l.log.Debug("ignoring an MQTT message", args...)
}

// clip makes text from a message fit for a log line: control characters
// escaped, and no longer than logTopicLen bytes.
func clip(s string) string {
	if len(s) > logTopicLen {
		s = s[:logTopicLen] + "..."
	}
	return escape.Controls(s)
}

func (l *Listener) setConnected(at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.state.Connected = true
	l.state.Since = at
}

// setDisconnected records that there is no connection, and why; it returns
// the error as State shows it.
func (l *Listener) setDisconnected(err error) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if l.state.Connected || l.state.Since.IsZero() {
		l.state.Since = now
	}
	l.state.Connected = false
	if err == nil {
		return ""
	}
	l.state.LastError = err.Error()
	l.state.LastErrorAt = now
	return l.state.LastError
}
