package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/listing"
	"github.com/nodepool-builder/nodepool-builder/uploader"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// chaosConfig is one zuul-image and one diskimage on two providers, for two
// hosts sharing a ZooKeeper.
const chaosConfig = `images-dir: {{IMAGES}}
build-log-dir: {{LOGS}}
diskimages:
  - name: dib-image
    dib-cmd: {{DIB}}
    elements: [debian-minimal]
    env-vars:
      FAKE_DIB_SLEEP: "1"
zuul-images:
{{DEBIAN}}providers:
  - name: cloud-q
    cloud: {{CLOUD}}
    image-format: qcow2
    diskimages:
      - name: debian
      - name: dib-image
  - name: cloud-r
    cloud: {{CLOUD}}
    image-format: raw
    diskimages:
      - name: debian
      - name: dib-image
builder:
  keep-builds: 2
  keep-uploads: 2
  # uploads are killed and cut off: the attempts are not what is tested
  upload-attempts: 1000
`

// chaosKeepUploads is the config's keep-uploads.
const chaosKeepUploads = 2

// chaosHost is a builder daemon whose log lines can trigger a signal.
type chaosHost struct {
	*host
	mu      sync.Mutex
	trigger string         // a log line to signal on, once
	sig     syscall.Signal // the signal
	fired   chan struct{}  // closed once the trigger fired
	earlier []string       // logs of its daemons that ended
}

// arm makes the next log line holding event send sig to the daemon.
func (c *chaosHost) arm(event string, sig syscall.Signal) chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.trigger, c.sig, c.fired = event, sig, make(chan struct{})
	return c.fired
}

// chaosTrigger passes a host's output on, and sends the host the signal it is
// armed with the moment the output holds the armed event. exec.Cmd makes one
// Write at a time when Stdout and Stderr are the same writer.
type chaosTrigger struct {
	host *chaosHost
	cmd  *exec.Cmd
	out  io.Writer
	tail []byte // a line may come in two writes
}

func (w *chaosTrigger) Write(p []byte) (int, error) {
	n, err := w.out.Write(p)
	c := w.host
	c.mu.Lock()
	if c.trigger != "" {
		seen := append(w.tail, p...)
		if bytes.Contains(seen, []byte(c.trigger)) {
			w.cmd.Process.Signal(c.sig)
			close(c.fired)
			c.trigger, w.tail = "", nil
		} else {
			w.tail = append([]byte(nil), seen[max(0, len(seen)-len(c.trigger)):]...)
		}
	}
	c.mu.Unlock()
	return n, err
}

// start runs the host's daemon (the real main in a child process) and waits
// until it is ready.
func (c *chaosHost) start(t *testing.T) {
	t.Helper()
	d := startChild(t, func(cmd *exec.Cmd, logs io.Writer) io.Writer {
		return &chaosTrigger{host: c, cmd: cmd, out: logs}
	}, "-c", c.cfgPath)
	c.d = d
	testenv.WaitFor(t, 60*time.Second, "host "+c.name+" to be ready", func() bool {
		select {
		case <-d.exited:
			t.Fatalf("host %s exited at start: %v\n%s", c.name, d.err, d.logs.String())
		default:
		}
		return strings.Contains(d.logs.String(), `msg="builder ready"`)
	}, d.logs.String)
}

// kill ends the host's daemon with SIGKILL.
func (c *chaosHost) kill() {
	c.d.cmd.Process.Signal(syscall.SIGKILL)
	c.d.cmd.Process.Signal(syscall.SIGCONT)
	<-c.d.exited
	c.earlier = append(c.earlier, c.d.logs.String())
}

func (c *chaosHost) logs() string {
	s := strings.Join(c.earlier, "\n--- host "+c.name+" restarted:\n")
	if c.d != nil {
		s += "\n--- host " + c.name + " now:\n" + c.d.logs.String()
	}
	return "--- host " + c.name + ":\n" + s
}

// chaosSeed is the seed of the chaos test's random choices: CHAOS_SEED replays one.
func chaosSeed(t *testing.T) int64 {
	if s := os.Getenv("CHAOS_SEED"); s != "" {
		seed, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("CHAOS_SEED=%q: %v", s, err)
		}
		return seed
	}
	return time.Now().UnixNano()
}

// TestZooKeeperChaos runs two builder daemons with their own images-dirs on
// one ZooKeeper serving TLS with client certificates, one Glance and the
// stand-in Zuul. Every round brings a Zuul build and a build request, and a
// fault: a builder (or both) killed with SIGKILL right after a lifecycle event
// or at a random moment, ZooKeeper stopped a few seconds, a builder's session
// expired (SIGSTOP past zookeeper-timeout, then SIGCONT), or expired the
// moment it starts a DIB build, with ZooKeeper up, or down until the builder
// counts its locks as lost. After each round both settle, and the state is
// read with kazoo, as nodepool does, against what must hold.
//
// CHAOS_SEED replays a run; CHAOS_ROUNDS sets the number of rounds (default:
// one of each fault); CHAOS_FAULT=<n> makes every round's fault the n-th kind
// of the switch below.
func TestZooKeeperChaos(t *testing.T) {
	testenv.RequireKazoo(t)
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{TLS: true})
	seed := chaosSeed(t)
	t.Logf("chaos seed %d (CHAOS_SEED=%d replays it)", seed, seed)
	rng := rand.New(rand.NewSource(seed))
	// The faults, one a round, in an order of the seed's.
	const kinds = 7
	faults := rng.Perm(kinds)
	rounds := kinds
	if s := os.Getenv("CHAOS_FAULT"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n >= kinds {
			t.Fatalf("CHAOS_FAULT=%q: want a fault kind from 0 to %d", s, kinds-1)
		}
		faults = []int{n}
	}
	if s := os.Getenv("CHAOS_ROUNDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("CHAOS_ROUNDS=%q: %v", s, err)
		}
		rounds = n
	}

	var hs []*chaosHost
	for _, h := range e.hosts(z, chaosConfig, 2) {
		hs = append(hs, &chaosHost{host: h})
	}
	e.cfgPath = hs[0].cfgPath // the admin commands reach the shared state through host a's config
	for _, h := range hs {
		h.start(t)
	}
	logs := func() string {
		var s []string
		for _, h := range hs {
			s = append(s, h.logs())
		}
		return strings.Join(s, "\n") + "\n--- zookeeper:\n" + testenvLogTail(z)
	}
	restartZK := func(down time.Duration) {
		t.Helper()
		if err := z.Stop(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(down) // the fault itself: how long ZooKeeper is away
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := z.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	sessionPast := time.Duration(zkSessionTimeout)*time.Second + 3*time.Second
	// expire stops a host past its session and lets it go on: it must learn
	// that its locks went before it writes again. withZK: ZooKeeper is down
	// meanwhile, and stays down after the host goes on until the host counts
	// its locks as lost.
	expire := func(h *chaosHost, withZK bool) {
		t.Helper()
		const lost = "every lock held"
		before := strings.Count(h.d.logs.String(), lost)
		h.d.cmd.Process.Signal(syscall.SIGSTOP)
		if withZK {
			if err := z.Stop(); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(sessionPast) // the fault itself: the session times out meanwhile
		h.d.cmd.Process.Signal(syscall.SIGCONT)
		testenv.WaitFor(t, 60*time.Second, "host "+h.name+" to count its locks as lost", func() bool {
			return strings.Count(h.d.logs.String(), lost) > before
		}, logs)
		if withZK {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := z.Start(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	// killOn kills whichever host logs event first right after it, or a
	// random one after timeout without it.
	killOn := func(event string, timeout time.Duration) string {
		fired := make(chan struct{}, len(hs))
		chs := make([]chan struct{}, len(hs))
		for i, h := range hs {
			chs[i] = h.arm(event, syscall.SIGKILL)
			go func() {
				select {
				case <-chs[i]:
					fired <- struct{}{}
				case <-time.After(timeout + time.Second):
				}
			}()
		}
		var what string
		var victims []*chaosHost
		select {
		case <-fired:
			what = "right after " + event
		case <-time.After(timeout):
			what = fmt.Sprintf("after %s without %s", timeout, event)
		}
		for _, h := range hs {
			h.arm("", 0) // no trigger fires after this
		}
		for i, h := range hs {
			select {
			case <-chs[i]:
				victims = append(victims, h)
			default:
			}
		}
		if len(victims) == 0 {
			h := hs[rng.Intn(len(hs))]
			h.d.cmd.Process.Signal(syscall.SIGKILL)
			victims = append(victims, h)
		}
		var killed []string
		for _, h := range victims {
			<-h.d.exited
			h.earlier = append(h.earlier, h.d.logs.String())
			killed = append(killed, "host "+h.name)
			h.start(t)
		}
		return strings.Join(killed, " and ") + " killed " + what
	}

	seen := map[string]listing.Build{} // every build seen ready, by id
	var dibBuilt []string              // dib-image builds, one per request
	settle := func(round int, latest zuultest.Build) {
		t.Helper()
		var why string
		deadline := time.Now().Add(2 * time.Minute)
		for {
			why = e.chaosInvariants(z, hs, latest, seen, dibBuilt)
			if why == "" || time.Now().After(deadline) {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
		if why != "" {
			t.Fatalf("round %d (seed %d) did not settle: %s\n%s", round, seed, why, logs())
		}
		for _, b := range e.buildsJSON() {
			if b.Image == "dib-image" && b.State == "ready" && !slices.Contains(dibBuilt, b.BuildID) {
				dibBuilt = append(dibBuilt, b.BuildID)
			}
		}
	}

	// The first builds: dib-image has none, so it is due without a request.
	latest := e.addBuild(e.makeImage(1), zuultest.BuildSpec{})
	settle(-1, latest)

	for r := range rounds {
		latest = e.addBuild(e.makeImage(int64(10+r)), zuultest.BuildSpec{})
		e.must(0, []string{"image-build", "dib-image"})
		h := hs[rng.Intn(len(hs))]
		var what string
		switch faults[r%len(faults)] {
		case 0:
			what = killOn(lifecycleEvents[rng.Intn(len(lifecycleEvents))], 10*time.Second)
		case 1:
			d := time.Duration(rng.Int63n(int64(4 * time.Second)))
			time.Sleep(d) // a random moment
			h.kill()
			h.start(t)
			what = fmt.Sprintf("host %s killed after %s", h.name, d)
		case 2:
			d := time.Duration(rng.Int63n(int64(4 * time.Second)))
			time.Sleep(d) // a random moment
			for _, h := range hs {
				h.kill()
			}
			for _, h := range hs {
				h.start(t)
			}
			what = fmt.Sprintf("both hosts killed after %s", d)
		case 3:
			d := time.Duration(1+rng.Intn(3)) * time.Second
			time.Sleep(time.Duration(rng.Int63n(int64(3 * time.Second)))) // a random moment
			restartZK(d)
			what = fmt.Sprintf("ZooKeeper stopped for %s", d)
		case 4:
			time.Sleep(time.Duration(rng.Int63n(int64(3 * time.Second)))) // a random moment
			expire(h, false)
			what = fmt.Sprintf("host %s stopped past its session", h.name)
		case 5, 6:
			// The session lost while a DIB build runs: its outcome must not
			// be written under the lock it lost. In 5, ZooKeeper is down
			// too when the build ends, and back only once the host counts
			// its locks as lost; in 6 it stays up, expires the session, and
			// another builder may take the lock meanwhile.
			withZK := faults[r%len(faults)] == 5
			fired := make(chan *chaosHost, len(hs))
			for _, h := range hs {
				ch := h.arm(`msg="building image" image=dib-image`, syscall.SIGSTOP)
				go func() {
					select {
					case <-ch:
						fired <- h
					case <-time.After(time.Minute):
					}
				}()
			}
			select {
			case h := <-fired:
				for _, o := range hs {
					o.arm("", 0)
				}
				expire(h, withZK)
				what = fmt.Sprintf("host %s stopped past its session while building", h.name)
				if withZK {
					what += ", with ZooKeeper down until it counted its locks lost"
				}
			case <-time.After(20 * time.Second):
				for _, o := range hs {
					o.arm("", 0)
				}
				what = "no host built dib-image within 20s; no fault"
			}
		}
		t.Logf("round %d: %s", r, what)
		settle(r, latest)
	}
}

// partialLeftover is a file no settled build leaves behind: a temporary file,
// a conversion, a partial download or the state of one in ranges.
var partialLeftover = regexp.MustCompile(`\.tmp[0-9]*$|\.converting-[0-9]+$|\.download$|\.ranges$|\.ranges\.tmp$`)

// chaosInvariants says what does not hold (yet) once the hosts settled, or "".
// seen collects the builds seen ready; dibBuilt are the dib-image builds of
// the rounds before.
func (e *env) chaosInvariants(z *testenv.ZooKeeper, hs []*chaosHost, latest zuultest.Build,
	seen map[string]listing.Build, dibBuilt []string) string {
	builds := e.buildsJSON()
	// Each Zuul build became at most one ready build, ever.
	for _, b := range builds {
		if b.State == "ready" {
			seen[b.BuildID] = b
		}
	}
	byZuul := map[string][]string{}
	for _, b := range seen {
		if b.ZuulBuildUUID != "" {
			byZuul[b.ZuulBuildUUID] = append(byZuul[b.ZuulBuildUUID], b.BuildID)
		}
	}
	for uuid, ids := range byZuul {
		if len(ids) > 1 {
			return fmt.Sprintf("Zuul build %s became %d ready builds: %v", uuid, len(ids), ids)
		}
	}
	// Each request was built once: one dib-image build more than before, and
	// the request gone.
	var fresh []string
	for _, b := range seen {
		if b.Image == "dib-image" && !slices.Contains(dibBuilt, b.BuildID) {
			fresh = append(fresh, b.BuildID)
		}
	}
	if len(fresh) != 1 {
		return fmt.Sprintf("the round's build request made %d ready dib-image builds: %v", len(fresh), fresh)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := testenv.RunKazoo(ctx, kazooConn(z), `print(bool(zk.exists("/nodepool/images/dib-image/request-build")))`); err != nil {
		return err.Error()
	} else if strings.TrimSpace(out) != "False" {
		return "the build request is still there"
	}
	zb, ok := e.zuulBuildOf(latest.UUID)
	if !ok || zb.State != "ready" {
		return fmt.Sprintf("the newest Zuul build %s has no ready build", latest.UUID)
	}

	// The state as nodepool-launcher reads it.
	v := launcher(e.t, z)
	type buildRec struct {
		image, id, state string
		stateTime        float64
		builderID        string
	}
	newest := map[string]buildRec{} // by image
	recs := map[string]buildRec{}   // by id
	for key, f := range v.Builds {
		image, id, _ := strings.Cut(key, "/")
		st, _ := f["state"][1].(string)
		at, _ := f["state_time"][1].(float64)
		bid, _ := f["builder_id"][1].(string)
		r := buildRec{image, id, st, at, bid}
		recs[id] = r
		if st == "building" {
			return "build " + key + " is building"
		}
		if st == "ready" && at > newest[image].stateTime {
			newest[image] = r
		}
	}
	if newest["debian"].id != zb.BuildID {
		return fmt.Sprintf("the newest ready debian build is %s, want %s", newest["debian"].id, zb.BuildID)
	}
	live := map[string]bool{} // the ready uploads' external ids
	type pair struct{ image, provider string }
	ready := map[pair]int{}
	newestReady := map[pair]int{}
	for key, f := range v.Uploads {
		parts := strings.Split(key, "/")
		image, build, provider := parts[0], parts[1], parts[2]
		st, _ := f["state"][1].(string)
		if st != "ready" {
			return fmt.Sprintf("upload %s is %s", key, st)
		}
		ext, _ := f["external_id"][1].(string)
		if live[ext] {
			return "two uploads name image " + ext
		}
		live[ext] = true
		p := pair{image, provider}
		ready[p]++
		if build == newest[image].id {
			newestReady[p]++
		}
	}
	for _, image := range []string{"debian", "dib-image"} {
		for _, provider := range []string{"cloud-q", "cloud-r"} {
			p := pair{image, provider}
			if newestReady[p] != 1 {
				return fmt.Sprintf("%s's newest ready build %s has %d ready uploads to %s, want 1", image, newest[image].id, newestReady[p], provider)
			}
			if ready[p] > chaosKeepUploads {
				return fmt.Sprintf("%s has %d ready uploads to %s, more than keep-uploads", image, ready[p], provider)
			}
		}
	}
	// Glance holds exactly the ready uploads' images, all active.
	ids := map[string]bool{}
	for _, h := range hs {
		ids[h.builderID(e.t)] = true
	}
	imgs, err := e.cloud.List(ctx, nil)
	if err != nil {
		return err.Error()
	}
	active := map[string]bool{}
	for _, img := range imgs {
		if !ids[img.Properties[uploader.PropBuilderID]] {
			continue
		}
		if !live[img.ID] {
			return fmt.Sprintf("Glance image %s (%s, %s) is no ready upload's", img.ID, img.Name, img.Status)
		}
		if img.Status != "active" {
			return fmt.Sprintf("Glance image %s is %s", img.ID, img.Status)
		}
		active[img.ID] = true
	}
	for ext := range live {
		if !active[ext] {
			return "the ready upload's image " + ext + " is not in Glance"
		}
	}
	// nodepool-launcher boots an active image of the newest ready build.
	for _, image := range []string{"debian", "dib-image"} {
		for _, provider := range []string{"cloud-q", "cloud-r"} {
			pick, ok := v.Launch[image+"/"+provider]
			if !ok || !active[pick.ExternalID] || strings.Split(pick.Upload, "/")[1] != newest[image].id {
				return fmt.Sprintf("the launcher boots %+v for %s on %s, want an upload of build %s", pick, image, provider, newest[image].id)
			}
		}
	}
	// Each host's files are of builds it holds, ready or deleting; nothing
	// temporary or partial is left.
	for _, h := range hs {
		id := h.builderID(e.t)
		var bad string
		filepath.WalkDir(h.imagesDir, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || bad != "" {
				return nil
			}
			rel, _ := filepath.Rel(h.imagesDir, path)
			name := d.Name()
			if partialLeftover.MatchString(name) || strings.HasPrefix(rel, ".partial"+string(filepath.Separator)) {
				bad = fmt.Sprintf("host %s has leftover %s", h.name, rel)
				return nil
			}
			m := buildFileOf.FindStringSubmatch(name)
			if m == nil {
				return nil
			}
			r, ok := recs[m[1]]
			switch {
			case !ok:
				bad = fmt.Sprintf("host %s keeps %s of a build the state does not hold", h.name, rel)
			case r.builderID != id:
				bad = fmt.Sprintf("host %s keeps %s of a build of builder %s", h.name, rel, r.builderID)
			case r.state != "ready" && r.state != "deleting":
				bad = fmt.Sprintf("host %s keeps %s of a %s build", h.name, rel, r.state)
			}
			return nil
		})
		if bad != "" {
			return bad
		}
	}
	return ""
}

// buildFileOf matches the name of a build's file, <image>-<build id>.<ext>.
var buildFileOf = regexp.MustCompile(`-([0-9a-f]{32})\.`)
