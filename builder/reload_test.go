package builder

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// zuulImage is a config with one zuul-image polled every {{EVERY}} seconds
// from the stand-in Zuul at {{ZUUL}}; it needs raw, so every poll asks Zuul.
const zuulImage = `images-dir: %s
zuul-images:
  - name: zimg
    api-url: {{ZUUL}}
    tenant: example
    project: org/images
    job: build-zimg
    poll-interval: {{EVERY}}
    formats: [raw]
`

// TestReloadAppliesPollIntervalAtOnce: a zuul-image polled every hour whose
// poll-interval a reload (the Reload signal: it is a setting of the builder's
// own) lowers is polled again the new interval after its last poll, not at the
// end of the hour.
func TestReloadAppliesPollIntervalAtOnce(t *testing.T) {
	zuul := zuultest.NewServer(zuultest.ServerOptions{})
	t.Cleanup(zuul.Close)
	text := func(every string) string {
		return strings.NewReplacer("{{ZUUL}}", zuul.URL(), "{{EVERY}}", every).Replace(zuulImage)
	}
	r := newRig(t, text("3600"))
	polls := func() int { return len(zuul.BuildsCalls()) }
	r.run()
	testenv.WaitFor(t, 10*time.Second, "the first poll", func() bool { return polls() == 1 })

	r.confirm(strings.Replace(text("0.2"), "%s", r.st.Dir(), 1))
	testenv.WaitFor(t, 10*time.Second, "the reload", func() bool { return r.b.Config().ZuulImage("zimg").PollInterval == 200*time.Millisecond })
	testenv.WaitFor(t, 10*time.Second, "a poll at the new interval", func() bool { return polls() >= 3 })

	// Raised again: the loop waits the new interval after its last poll.
	r.confirm(strings.Replace(text("3600"), "%s", r.st.Dir(), 1))
	testenv.WaitFor(t, 10*time.Second, "the second reload", func() bool { return r.b.Config().ZuulImage("zimg").PollInterval == time.Hour })
	settled := polls()
	r.confirm(strings.Replace(text("3599"), "%s", r.st.Dir(), 1))
	testenv.WaitFor(t, 10*time.Second, "the third reload", func() bool { return r.b.Config().ZuulImage("zimg").PollInterval == 3599*time.Second })
	if n := polls(); n > settled+1 {
		t.Errorf("%d polls after poll-interval went back to an hour, want at most the one under way", n-settled)
	}
}

// logBuffer holds what a logger wrote, safe for the loops and the test.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuffer) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), s)
}

// TestHeldBackBuildIsLoggedOnce: the daemon's loop of a diskimage whose build
// failed says once that the next build is held back, not on every check, and
// does not call it a failed step.
func TestHeldBackBuildIsLoggedOnce(t *testing.T) {
	script, err := filepath.Abs(filepath.Join("..", "dib", "testdata", "fake-disk-image-create"))
	if err != nil {
		t.Fatal(err)
	}
	logs := &logBuffer{}
	r := newRig(t, `images-dir: %s
build-log-dir: `+filepath.Join(t.TempDir(), "logs")+`
diskimages:
  - name: dimg
    dib-cmd: `+strconv.Quote("bash '"+script+"'")+`
    elements: [e]
    formats: [raw]
    env-vars: {FAKE_DIB_EXIT: "1"}
`, func(o *Options) {
		o.Logger = slog.New(slog.NewTextHandler(logs, nil))
		o.Intervals.DIBCheck = 10 * time.Millisecond
	})
	r.run()
	testenv.WaitFor(t, 20*time.Second, "the build to fail and the next to be held back", func() bool {
		return logs.count(`msg="image not built"`) == 1
	})
	// Many checks later, it has said so once, and the one failed step was the build.
	passes := func() time.Time {
		r.b.loops.mu.Lock()
		defer r.b.loops.mu.Unlock()
		return r.b.loops.byName["dib image dimg"].ended
	}
	for range 20 {
		last := passes()
		testenv.WaitFor(t, 10*time.Second, "another check of the image", func() bool { return passes().After(last) })
	}
	if n, failed := logs.count(`msg="image not built"`), logs.count(`msg="step failed"`); n != 1 || failed != 1 {
		t.Errorf("after 20 checks in the backoff: %d lines say the build is held back and %d a step failed; want 1 and 1 (the build)", n, failed)
	}
	if logs.count("next attempt after") == 0 {
		t.Errorf("the log does not say when the image is next built")
	}
}

// TestReloadRefusesWhatStartRefuses: a reloaded config that the builder would
// refuse at start (here a build-log-dir that is a file) is not taken; the
// running one stays, and the log says why.
func TestReloadRefusesWhatStartRefuses(t *testing.T) {
	logs := &logBuffer{}
	r := newRig(t, twoImages, func(o *Options) { o.Logger = slog.New(slog.NewTextHandler(logs, nil)) })
	defer r.run()()
	notADir := filepath.Join(r.dir, "not-a-dir")
	if err := os.WriteFile(notADir, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	r.write(strings.Replace(fmt.Sprintf(twoImages, r.st.Dir()), "diskimages:\n", "build-log-dir: "+notADir+"\ndiskimages:\n", 1))
	testenv.WaitFor(t, 10*time.Second, "the reload to be refused", func() bool { return logs.count("config not reloaded") == 1 })
	if got := r.b.Config().BuildLogDir; got == notADir {
		t.Fatalf("the refused config was taken: build-log-dir %s", got)
	}
	if logs.count("build-log-dir "+notADir+" is not a directory") != 1 {
		t.Errorf("the log does not say why:\n%s", logs.b.String())
	}
}

// TestConfigFileChangeMustHoldStill: a new content of the config file counts
// once two checks in a row read it, so that a file caught half-written (which
// may load, with images missing) is never reloaded; a file that goes back to
// the running content is no change.
func TestConfigFileChangeMustHoldStill(t *testing.T) {
	snap := func(text string) *config.Snapshot {
		return &config.Snapshot{Nodepool: config.Text{Name: "nodepool.yaml", Data: []byte(text)}}
	}
	text := "images-dir: /var/lib/nodepool\nzuul-images:\n  - name: a\n  - name: b\n"
	running, half, edited := snap(text), snap(text[:len(text)-12]), snap(text+"  - name: c\n")
	f := configFile{last: running}
	for i, c := range []struct {
		read *config.Snapshot
		want bool
	}{
		{running, false},
		{half, false},     // caught mid-write
		{edited, false},   // whole now, but new since the last check
		{edited, true},    // held still: a change
		{edited, false},   // and only once
		{half, false},     // another rewrite, caught mid-write
		{edited, false},   // back to the running content before it settled
		{snap(""), false}, // emptied
		{snap(""), true},  // and it stays empty: a change (the reload refuses it)
	} {
		if got := f.changed(c.read); got != c.want {
			t.Fatalf("check %d (%d bytes): changed %v, want %v", i, len(c.read.Nodepool.Data), got, c.want)
		}
	}
}

// TestReloadLoadsWhatItChecked: the config a reload takes is the text the
// watcher saw hold still, not a later read of the files: here the file changes
// again right after the check, and the first reload takes the checked text.
func TestReloadLoadsWhatItChecked(t *testing.T) {
	logs := &logBuffer{}
	one := "images-dir: %s\ndiskimages:\n  - {name: a, elements: [e], pause: true}\n"
	two := one + "  - {name: b, elements: [e], pause: true}\n"
	three := two + "  - {name: c, elements: [e], pause: true}\n"
	var r *rig
	var checked atomic.Int32
	r = newRig(t, one, func(o *Options) {
		o.Logger = slog.New(slog.NewTextHandler(logs, nil))
		read := o.Read
		o.Read = func() (*config.Snapshot, error) {
			s, err := read()
			// The second check that reads the edit is the one that settles
			// it; the file changes right after it.
			if err == nil && strings.Contains(string(s.Nodepool.Data), "name: b,") && checked.Add(1) == 2 {
				r.write(fmt.Sprintf(three, r.st.Dir()))
			}
			return s, err
		}
	})
	r.run()
	r.write(fmt.Sprintf(two, r.st.Dir()))
	testenv.WaitFor(t, 10*time.Second, "a reload", func() bool { return logs.count("config reloaded") > 0 })
	first := logs.String()[strings.Index(logs.String(), "config reloaded"):]
	if first = first[:strings.IndexByte(first, '\n')]; !strings.Contains(first, "diskimages=2") {
		t.Fatalf("the first reload took %q, want the checked config's 2 diskimages", first)
	}
}

// TestReloadHoldsDropsUntilConfirmed: a change of the file that would release
// a provider's every upload is held, however long it holds still, and says how
// to apply it; the Reload signal applies it.
func TestReloadHoldsDropsUntilConfirmed(t *testing.T) {
	logs := &logBuffer{}
	reload := make(chan struct{}, 1)
	r := newRig(t, twoImages, func(o *Options) {
		o.Logger = slog.New(slog.NewTextHandler(logs, nil))
		o.Reload = reload
	})
	r.run()
	r.build("img-b")
	ready := func() bool { return len(r.uploads(store.UploadFilter{Provider: "pb", State: store.Ready})) == 1 }
	testenv.WaitFor(t, 10*time.Second, "the upload to pb", ready)

	r.write(strings.Replace(fmt.Sprintf(twoImages, r.st.Dir()), "diskimages: [{name: img-b}]", "diskimages: []", 1))
	testenv.WaitFor(t, 10*time.Second, "the change to be held", func() bool { return logs.count("config change held") == 1 }, logs.String)
	// Many checks later, it is still held, and said so once.
	passes := func() time.Time {
		r.b.loops.mu.Lock()
		defer r.b.loops.mu.Unlock()
		return r.b.loops.byName["lifecycle"].ended
	}
	for range 5 {
		last := passes()
		testenv.WaitFor(t, 10*time.Second, "another lifecycle pass", func() bool { return passes().After(last) })
	}
	if !ready() || r.b.Config().Provider("pb").Entry("img-b") == nil || logs.count("config change held") != 1 {
		t.Fatalf("the held change was applied, or said more than once:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), `drops="[provider pb: every upload (it no longer lists img-b) image img-b: every upload (no provider lists it)]"`) ||
		!strings.Contains(logs.String(), "SIGHUP") {
		t.Errorf("the log does not say what the change drops and how to apply it:\n%s", logs.String())
	}

	reload <- struct{}{}
	testenv.WaitFor(t, 10*time.Second, "the confirmed change to release pb's upload", func() bool {
		return len(r.uploads(store.UploadFilter{Provider: "pb"})) == 0
	}, logs.String)
}

// TestReloadKeepsTheStateWhereItIs: a reload that changes the ZooKeeper
// settings (in nodepool.yaml or the secure file alike) is taken, but the state
// stays where the builder opened it until it is restarted, and the log says
// so; a reload that leaves them alone says nothing of them.
func TestReloadKeepsTheStateWhereItIs(t *testing.T) {
	logs := &logBuffer{}
	one := "images-dir: %s\ndiskimages:\n  - {name: a, elements: [e], pause: true}\n"
	two := one + "  - {name: b, elements: [e], pause: true}\n"
	r := newRig(t, one, func(o *Options) { o.Logger = slog.New(slog.NewTextHandler(logs, nil)) })
	r.run()
	const said = "the ZooKeeper settings changed"
	r.write(fmt.Sprintf(two, r.st.Dir()))
	testenv.WaitFor(t, 10*time.Second, "the first reload", func() bool { return logs.count("config reloaded") == 1 }, logs.String)
	if logs.count(said) != 0 {
		t.Fatalf("a reload that leaves ZooKeeper alone says it changed:\n%s", logs.String())
	}
	r.write(fmt.Sprintf(two, r.st.Dir()) + "zookeeper-servers:\n  - host: 127.0.0.1\n    port: 9\n")
	testenv.WaitFor(t, 10*time.Second, "the second reload", func() bool { return logs.count("config reloaded") == 2 }, logs.String)
	if logs.count(said) != 1 || !strings.Contains(logs.String(), "until it is restarted") {
		t.Errorf("the log does not say once that the ZooKeeper change waits for a restart:\n%s", logs.String())
	}
	if _, ok := r.st.SQLite(); !ok || r.b.Config().ZooKeeper == nil {
		t.Errorf("after the reload: state in SQLite %v, config's ZooKeeper %+v; want both", ok, r.b.Config().ZooKeeper)
	}
}
