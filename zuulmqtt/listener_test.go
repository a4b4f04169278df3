package zuulmqtt

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
)

// rig is a listener running against a real broker, with what it told its caller.
type rig struct {
	t   *testing.T
	m   *testenv.Mosquitto
	l   *Listener
	log *testenv.Buffer

	mu       sync.Mutex
	hints    []string
	connects int

	cancel context.CancelFunc
	done   chan error
}

// brokerConfig is the zuul-mqtt section for m, as config would make it.
func brokerConfig(m *testenv.Mosquitto) config.ZuulMQTT {
	cfg := config.ZuulMQTT{URL: m.URL, Host: m.Host, Port: m.Port, TLS: m.TLS, Topics: []string{"zuul/#"}}
	if m.TLS {
		cfg.CACert, cfg.Username, cfg.PasswordFile = m.CA, m.Username, m.PasswordFile
		cfg.ClientCert, cfg.ClientKey = m.ClientCert, m.ClientKey
	}
	return cfg
}

// testImages are the zuul-images reports are matched against: debian is
// zuulReport's; sentinel's reports mark that the ones before them were read.
func testImages() []config.ZuulImage {
	sentinel := debianImage()
	sentinel.Name, sentinel.JobName = "sentinel", "build-sentinel"
	ubuntu := debianImage()
	ubuntu.Name, ubuntu.JobName = "ubuntu", "build-ubuntu"
	return []config.ZuulImage{debianImage(), ubuntu, sentinel}
}

// startRig runs a listener for cfg until the test ends. An opts.Hint is
// called before a hint is recorded.
func startRig(t *testing.T, m *testenv.Mosquitto, cfg config.ZuulMQTT, opts Options) *rig {
	t.Helper()
	r := &rig{t: t, m: m, log: &testenv.Buffer{}, done: make(chan error, 1)}
	opts.Images = testImages
	before := opts.Hint
	opts.Hint = func(image string) {
		if before != nil {
			before(image)
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		r.hints = append(r.hints, image)
	}
	opts.OnConnect = func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.connects++
	}
	opts.Logger = slog.New(slog.NewTextHandler(r.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	l, err := New(cfg, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	r.l = l
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- l.Run(ctx) }()
	t.Cleanup(func() { r.stop() })
	return r
}

// stop cancels Run and waits for it to return; it may be called twice.
func (r *rig) stop() {
	r.t.Helper()
	r.cancel()
	select {
	case err, ok := <-r.done:
		if ok && err != nil {
			r.t.Errorf("Run: %v", err)
		}
		if ok {
			close(r.done)
		}
	case <-time.After(5 * time.Second):
		r.t.Fatalf("Run did not return 5s after its context ended\n%s", r.show())
	}
}

func (r *rig) hinted() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.hints)
}

func (r *rig) connected() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.connects
}

func (r *rig) count(image string) int {
	n := 0
	for _, h := range r.hinted() {
		if h == image {
			n++
		}
	}
	return n
}

func (r *rig) show() string {
	return fmt.Sprintf("hints %v, connects %d, state %+v\nlistener log:\n%s\nbroker log:\n%s",
		r.hinted(), r.connected(), r.l.State(), r.log.String(), tail(r.m.LogFile))
}

func tail(path string) string {
	data, _ := os.ReadFile(path)
	if len(data) > 3000 {
		data = data[len(data)-3000:]
	}
	return string(data)
}

// waitSubscribed waits until the listener has subscribed and called OnConnect n times.
func (r *rig) waitSubscribed(n int, timeout time.Duration) {
	r.t.Helper()
	testenv.WaitFor(r.t, timeout, fmt.Sprintf("connect number %d", n), func() bool {
		return r.l.State().Connected && r.connected() >= n
	}, r.show)
}

// sentinel publishes a report for the sentinel image and waits for its hint:
// once it came, every message published before it has been read.
func (r *rig) sentinel() {
	r.t.Helper()
	before := r.count("sentinel")
	r.m.Publish(r.t, "zuul/example/post/org/images", zuulReport(func(rep, b map[string]any) { b["job_name"] = "build-sentinel" }))
	testenv.WaitFor(r.t, 5*time.Second, "the sentinel's hint", func() bool { return r.count("sentinel") > before }, r.show)
}

const topic = "zuul/example/post/org/images"

// TestHintWithinASecond: Zuul's report of a successful build of a zuul-image's
// job makes the listener hint at that image, and that one only, within a second:
// whether the report gives the build's result, or its job's success-message in
// its place.
func TestHintWithinASecond(t *testing.T) {
	for _, tt := range []struct {
		name string
		edit func(r, b map[string]any)
	}{
		{"SUCCESS", nil},
		{"a job's success-message", func(r, b map[string]any) { b["result"] = "Image built, see the log." }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := testenv.NewMosquitto(t, testenv.MosquittoOptions{})
			r := startRig(t, m, brokerConfig(m), Options{})
			r.waitSubscribed(1, 10*time.Second)

			start := time.Now()
			m.Publish(t, topic, zuulReport(tt.edit))
			testenv.WaitFor(t, time.Second, "a hint for debian", func() bool { return r.count("debian") == 1 }, r.show)
			t.Logf("hint %s after mosquitto_pub started", time.Since(start).Round(time.Millisecond))
			r.sentinel()
			if got := r.hinted(); !slices.Equal(got, []string{"debian", "sentinel"}) {
				t.Errorf("hints %v, want [debian sentinel]", got)
			}
			st := r.l.State()
			if st.Used != 2 || st.Hints != 2 || st.LastMessage.Before(start) || !st.Connected || st.Since.After(start) {
				t.Errorf("state %+v: want 2 used, 2 hints, a last message after %v, connected before it", st, start)
			}
			if !strings.Contains(r.log.String(), "polling a zuul-image now") {
				t.Errorf("the log does not say a report triggered a poll:\n%s", r.log.String())
			}
		})
	}
}

// TestIgnored: reports that are not of a successful build a zuul-image could
// fetch, and messages that are no report, give no hint, and are counted.
func TestIgnored(t *testing.T) {
	m := testenv.NewMosquitto(t, testenv.MosquittoOptions{})
	r := startRig(t, m, brokerConfig(m), Options{})
	r.waitSubscribed(1, 10*time.Second)

	// Terminal escapes in a payload, a bidirectional override in a topic
	// (brokers refuse control characters there).
	control, bidi := "\x1b]0;owned\x07", "\u202e"
	messages := []struct {
		name    string
		payload []byte
		reason  string
	}{
		{"another job", zuulReport(func(rep, b map[string]any) { b["job_name"] = "build-fedora" }), IgnoredNoMatch},
		{"a failed build", zuulReport(func(rep, b map[string]any) { b["result"] = "FAILURE" }), IgnoredNoMatch},
		{"a failure-message in a failure report", zuulReport(func(rep, b map[string]any) {
			rep["action"], rep["buildset"].(map[string]any)["result"] = "failure", "FAILURE"
			b["result"] = "Image build broke."
		}), IgnoredNoMatch},
		{"a start report", zuulReport(func(rep, b map[string]any) { rep["action"] = "start" }), IgnoredUnfinished},
		{"an unmerged change in check", zuulReport(func(rep, b map[string]any) {
			rep["pipeline"] = "check"
			b["change"].(map[string]any)["change"] = 4711
		}), IgnoredNoMatch},
		{"an unmerged change in post", zuulReport(func(rep, b map[string]any) { b["change"].(map[string]any)["change"] = 4711 }), IgnoredNoMatch},
		{"another tenant", zuulReport(func(rep, b map[string]any) { rep["tenant"] = "other" }), IgnoredNoMatch},
		{"malformed JSON", []byte(`{"action": "success", "tenant": "example", ` + control), IgnoredMalformed},
		{"a list", []byte(`[1, 2]`), IgnoredMalformed},
		{"just over 1 MiB", append(zuulReport(nil), bytes.Repeat([]byte(" "), MaxMessageSize)...), IgnoredTooLarge},
		{"2 MiB", append(zuulReport(nil), bytes.Repeat([]byte(" "), 2<<20)...), IgnoredTooLarge},
	}
	want := map[string]uint64{}
	for _, msg := range messages {
		m.Publish(t, topic+"/"+bidi, msg.payload)
		want[msg.reason]++
	}
	r.sentinel()
	if got := r.hinted(); !slices.Equal(got, []string{"sentinel"}) {
		t.Errorf("hints %v, want only the sentinel's", got)
	}
	// Messages too large were dropped without losing the connection.
	if n := r.connected(); n != 1 {
		t.Errorf("%d connects, want the one: a message dropped the connection", n)
	}
	st := r.l.State()
	if !mapsEqual(st.Ignored, want) || st.Used != 1 {
		t.Errorf("ignored %v, used %d; want %v and 1 (the sentinel)", st.Ignored, st.Used, want)
	}
	log := r.log.String()
	if strings.ContainsAny(log, "\x1b\x07"+bidi) {
		t.Errorf("the log holds control characters of a message:\n%q", log)
	}
	if !strings.Contains(log, "reason=malformed") || !strings.Contains(log, `org/images/\u202e`) {
		t.Errorf("the log does not show the malformed message's topic, escaped:\n%s", log)
	}
	if strings.Contains(log, "evil.example.com") {
		t.Errorf("the log holds a message's content:\n%s", log)
	}
}

func mapsEqual(a, b map[string]uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestFlood: 200 reports for one image give a handful of hints, not 200; and
// the one held back is given once the bound allows.
func TestFlood(t *testing.T) {
	m := testenv.NewMosquitto(t, testenv.MosquittoOptions{})
	const interval = 2 * time.Second
	r := startRig(t, m, brokerConfig(m), Options{HintInterval: interval})
	r.waitSubscribed(1, 10*time.Second)

	lines := make([]string, 200)
	for i := range lines {
		lines[i] = string(zuulReport(nil))
	}
	start := time.Now()
	m.PublishLines(t, topic, lines)
	r.sentinel()
	n := r.count("debian")
	if n < 1 || n > DefaultHintBurst+int(time.Since(start)/interval)+1 {
		t.Fatalf("200 reports in %s gave %d hints for debian, want 1 to %d", time.Since(start), n, DefaultHintBurst+1)
	}
	st := r.l.State()
	if st.Ignored[IgnoredRateLimited] < uint64(200-n) {
		t.Errorf("ignored %v, want %d rate-limited", st.Ignored, 200-n)
	}
	// The held hint comes when a token is back, once.
	testenv.WaitFor(t, 3*interval, "the held hint", func() bool { return r.count("debian") == n+1 }, r.show)
}

// TestTLSPassword: over TLS, with the password read from a file (and a client
// certificate), the listener logs in and hears reports; with a wrong password
// its state says the broker refused the login, and shows no password.
func TestTLSPassword(t *testing.T) {
	for _, clientCert := range []bool{false, true} {
		t.Run(fmt.Sprintf("client cert %t", clientCert), func(t *testing.T) {
			m := testenv.NewMosquitto(t, testenv.MosquittoOptions{TLS: true, ClientCert: clientCert})
			r := startRig(t, m, brokerConfig(m), Options{})
			r.waitSubscribed(1, 10*time.Second)
			m.Publish(t, topic, zuulReport(nil))
			testenv.WaitFor(t, time.Second, "a hint for debian", func() bool { return r.count("debian") == 1 }, r.show)
		})
	}

	t.Run("a broker no trusted CA vouches for", func(t *testing.T) {
		m := testenv.NewMosquitto(t, testenv.MosquittoOptions{TLS: true})
		cfg := brokerConfig(m)
		cfg.CACert = "" // the system roots only
		r := startRig(t, m, cfg, Options{})
		testenv.WaitFor(t, 10*time.Second, "the certificate error in the state", func() bool {
			return strings.Contains(r.l.State().LastError, "set ca-cert to the CA that signed it")
		}, r.show)
		t.Logf("last error: %s", r.l.State().LastError)
		if r.connected() != 0 {
			t.Errorf("OnConnect called without a trusted connection")
		}
	})

	t.Run("wrong password", func(t *testing.T) {
		m := testenv.NewMosquitto(t, testenv.MosquittoOptions{TLS: true})
		cfg := brokerConfig(m)
		cfg.PasswordFile = filepath.Join(t.TempDir(), "pw")
		const wrong = "wrong-password-17"
		if err := os.WriteFile(cfg.PasswordFile, []byte(wrong+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		r := startRig(t, m, cfg, Options{})
		testenv.WaitFor(t, 10*time.Second, "the refused login in the state", func() bool {
			return strings.Contains(r.l.State().LastError, "refused the login")
		}, r.show)
		st := r.l.State()
		t.Logf("last error: %s", st.LastError)
		if st.Connected || st.LastErrorAt.IsZero() || !strings.Contains(st.LastError, `as "nodepool"`) ||
			!strings.Contains(st.LastError, "check username and the password in password-file") {
			t.Errorf("state %+v: want not connected, and an error that says whose login and what to check", st)
		}
		for _, secret := range []string{wrong, m.Password} {
			if strings.Contains(st.LastError, secret) || strings.Contains(r.log.String(), secret) {
				t.Errorf("a password shows in the state or the log:\n%+v\n%s", st, r.log.String())
			}
		}
		// The file is read at each connect: the right password gets in.
		if err := os.WriteFile(cfg.PasswordFile, []byte(m.Password+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		r.waitSubscribed(1, 15*time.Second)
	})
}

// TestReconnect: the broker stopped and started again on its port, the
// listener connects again within the backoff's bound, calls OnConnect again,
// and hears the next report.
func TestReconnect(t *testing.T) {
	m := testenv.NewMosquitto(t, testenv.MosquittoOptions{})
	r := startRig(t, m, brokerConfig(m), Options{})
	r.waitSubscribed(1, 10*time.Second)
	m.Publish(t, topic, zuulReport(nil))
	testenv.WaitFor(t, time.Second, "a hint for debian", func() bool { return r.count("debian") == 1 }, r.show)

	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "the lost connection in the state", func() bool {
		st := r.l.State()
		return !st.Connected && strings.Contains(st.LastError, "lost")
	}, r.show)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	r.waitSubscribed(2, 12*time.Second)
	// The first report after quiet goes through at once.
	m.Publish(t, topic, zuulReport(func(rep, b map[string]any) { b["uuid"] = strings.Repeat("b", 32) }))
	testenv.WaitFor(t, time.Second, "a hint for debian after the reconnect", func() bool { return r.count("debian") == 2 }, r.show)
}

// TestCancel: Run returns soon after its context ends, connected, waiting to
// reconnect, or in the middle of a connect to a broker that never answers,
// and leaves no goroutine behind.
func TestCancel(t *testing.T) {
	m := testenv.NewMosquitto(t, testenv.MosquittoOptions{})
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	var held []net.Conn
	var heldMu sync.Mutex
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			heldMu.Lock()
			held = append(held, c) // accepted, never answered
			heldMu.Unlock()
		}
	}()
	defer func() {
		heldMu.Lock()
		defer heldMu.Unlock()
		for _, c := range held {
			c.Close()
		}
	}()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().(*net.TCPAddr)
	closed.Close()
	silentAddr := silent.Addr().(*net.TCPAddr)

	cases := []struct {
		name  string
		cfg   config.ZuulMQTT
		ready func(r *rig)
	}{
		{"connected", brokerConfig(m), func(r *rig) { r.waitSubscribed(1, 10*time.Second) }},
		{"waiting to reconnect", config.ZuulMQTT{URL: "mqtt://x", Host: "127.0.0.1", Port: closedAddr.Port}, func(r *rig) {
			testenv.WaitFor(t, 5*time.Second, "a failed connect", func() bool { return r.l.State().LastError != "" }, r.show)
		}},
		{"connecting to a broker that does not answer", config.ZuulMQTT{URL: "mqtt://x", Host: "127.0.0.1", Port: silentAddr.Port}, func(r *rig) {
			testenv.WaitFor(t, 5*time.Second, "a connection to the silent broker", func() bool {
				heldMu.Lock()
				defer heldMu.Unlock()
				return len(held) > 0
			}, r.show)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := runtime.NumGoroutine()
			r := startRig(t, m, tc.cfg, Options{})
			r.t = t
			tc.ready(r)
			start := time.Now()
			r.cancel()
			select {
			case <-r.done:
				close(r.done)
			case <-time.After(2 * time.Second):
				t.Fatalf("Run did not return 2s after its context ended\n%s", r.show())
			}
			t.Logf("Run returned %s after cancel", time.Since(start).Round(time.Millisecond))
			if r.l.State().Connected {
				t.Errorf("the state says connected after Run returned")
			}
			testenv.WaitFor(t, 2*time.Second, "the goroutines to end", func() bool { return runtime.NumGoroutine() <= before }, func() string {
				buf := make([]byte, 1<<16)
				return string(buf[:runtime.Stack(buf, true)])
			})
		})
	}
}

// TestBacklog: while the caller is slow to take a hint, reports wait, up to a
// bound in bytes; what is over it is dropped and counted, not held in memory.
func TestBacklog(t *testing.T) {
	m := testenv.NewMosquitto(t, testenv.MosquittoOptions{})
	release := make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	blocked := make(chan struct{}, 1)
	gate := func(image string) {
		if image == "debian" {
			select {
			case blocked <- struct{}{}:
			default:
			}
			<-release
		}
	}
	r := startRig(t, m, brokerConfig(m), Options{Hint: gate})
	r.waitSubscribed(1, 10*time.Second)
	m.Publish(t, topic, zuulReport(nil))
	select {
	case <-blocked:
	case <-time.After(5 * time.Second):
		t.Fatalf("no hint for debian\n%s", r.show())
	}
	// 24 messages of almost 1 MiB: 16 MiB wait, the rest is over the bound.
	big := string(append(zuulReport(nil), bytes.Repeat([]byte(" "), MaxMessageSize-2000)...))
	lines := make([]string, 24)
	for i := range lines {
		lines[i] = big
	}
	m.PublishLines(t, topic, lines)
	testenv.WaitFor(t, 10*time.Second, "messages dropped as backlog", func() bool { return r.l.State().Ignored[IgnoredBacklog] >= 1 }, r.show)
	unblock()
	r.sentinel()
	// Every message is accounted for: the first report, the 24, the sentinel.
	st := r.l.State()
	total := st.Used
	for _, n := range st.Ignored {
		total += n
	}
	if total != 26 || st.Ignored[IgnoredBacklog] == 0 || st.Ignored[IgnoredBacklog] > 24-queueBytes/MaxMessageSize+1 {
		t.Errorf("used %d, ignored %v; want 26 messages in all, 1 to %d of the large ones dropped as backlog",
			st.Used, st.Ignored, 24-queueBytes/MaxMessageSize+1)
	}
}

// TestBombThenReport: a forged report of a megabyte, published to a real
// broker, hints at nothing and holds up nothing: the real report published
// right after it still gives its hint within a second.
func TestBombThenReport(t *testing.T) {
	m := testenv.NewMosquitto(t, testenv.MosquittoOptions{})
	r := startRig(t, m, brokerConfig(m), Options{})
	r.waitSubscribed(1, 10*time.Second)

	m.Publish(t, topic, bomb(false))
	start := time.Now()
	m.Publish(t, topic, zuulReport(nil))
	testenv.WaitFor(t, time.Second, "the real report's hint", func() bool { return r.count("debian") == 1 }, r.show)
	t.Logf("hint %s after the real report was published", time.Since(start).Round(time.Millisecond))
	if got := r.hinted(); !slices.Equal(got, []string{"debian"}) {
		t.Errorf("hints %v, want [debian]", got)
	}
	if st := r.l.State(); st.Ignored[IgnoredNoMatch] != 1 || st.Used != 1 {
		t.Errorf("state %+v: want the bomb ignored as matching nothing, the report used", st)
	}
}
