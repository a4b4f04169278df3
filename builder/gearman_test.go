package builder

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/gearman"
	"github.com/nodepool-builder/nodepool-builder/internal/ratelimit"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
	"github.com/nodepool-builder/nodepool-builder/zuulmqtt"
)

// call runs one gearman job through the service's handler, as the worker does.
func call(g *gearmanService, function, data string) (string, error) {
	res, err := g.handle(context.Background(), &gearman.Job{Function: function, Handle: "H:test:1", Data: []byte(data)})
	if err == nil && !strings.HasSuffix(string(res), "\n") {
		return "", fmt.Errorf("answer %q does not end with a newline", res)
	}
	return strings.TrimSuffix(string(res), "\n"), err
}

// wantErr fails the test unless err says every one of says.
func wantErr(t *testing.T, what string, err error, says ...string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: no error, want one saying %q", what, says)
		return
	}
	for _, s := range says {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("%s: error %q does not say %q", what, err, s)
		}
	}
}

func TestGearmanUploadAndDeleteJobs(t *testing.T) {
	r := newRig(t, twoImages)
	r.run()
	g := newGearmanService(r.b)
	ctx := context.Background()

	a := r.build("img-a")
	testenv.WaitFor(t, 10*time.Second, "the planner's upload of img-a to pa", func() bool {
		ups := r.uploads(store.UploadFilter{BuildID: a.ID, State: store.Ready})
		return len(ups) == 1
	})
	ext, err := call(g, FnUpload+a.ID, "pa\n")
	ups := r.uploads(store.UploadFilter{BuildID: a.ID, State: store.Ready})
	if err != nil || ext != ups[0].ExternalID {
		t.Fatalf("image-upload of an uploaded build = %q, %v; want %s at once", ext, err, ups[0].ExternalID)
	}
	if _, creates := r.clouds["pa"].count(); creates != 1 {
		t.Errorf("pa saw %d image creates, want 1: asking again must not upload again", creates)
	}

	// An upload the job asks for: a newer build is what the planner uploads,
	// and a's upload is released and deleted.
	newer := r.build("img-a")
	// Released before the planner has seen the newer build, a's upload would
	// be missing from the newest build it knows, and made again.
	testenv.WaitFor(t, 10*time.Second, "the planner's upload of the newer img-a to pa", func() bool {
		return len(r.uploads(store.UploadFilter{BuildID: newer.ID, State: store.Ready})) == 1
	})
	if _, err := r.st.ReleaseUpload(ctx, a.ID, "pa", ups[0].ID); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the released upload to be deleted", func() bool {
		return len(r.uploads(store.UploadFilter{BuildID: a.ID})) == 0
	})
	ext, err = call(g, FnUpload+a.ID, "pa")
	if err != nil || ext == "" || ext == ups[0].ExternalID {
		t.Fatalf("image-upload of a build with no upload = %q, %v; want a new image id", ext, err)
	}
	again := r.uploads(store.UploadFilter{BuildID: a.ID, State: store.Ready})
	if len(again) != 1 || again[0].ExternalID != ext {
		t.Fatalf("ready uploads of %s = %+v, want one with image %s", a.ID, again, ext)
	}

	// Bad input: a failure that says what was wrong, and nothing changed.
	b := r.build("img-b")
	_, err = call(g, FnUpload+a.ID, "nowhere")
	wantErr(t, "unknown provider", err, `unknown provider "nowhere"`, "pa, pb")
	_, err = call(g, FnUpload+a.ID, "")
	wantErr(t, "no provider", err, "needs a provider name", FnUpload+a.ID+" <provider>")
	_, err = call(g, FnUpload+b.ID, "pa")
	wantErr(t, "provider without the image", err, "provider pa does not take image img-b")
	_, err = call(g, FnUpload+"0123456789abcdef0123456789abcdef", "pa")
	wantErr(t, "unknown build", err, "no build 0123456789abcdef0123456789abcdef is known")
	_, err = call(g, "image-frobnicate:x", "")
	wantErr(t, "unknown function", err, "not a function of this builder")
	if n := len(r.uploads(store.UploadFilter{BuildID: b.ID, Provider: "pa"})); n != 0 {
		t.Errorf("%d uploads of img-b to pa after refused jobs, want 0", n)
	}

	// The functions: uploads and deletes of the ready builds made here.
	fns, err := g.functions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{FnBuild + "img-a", FnBuild + "img-b", FnUpload + a.ID, FnDelete + a.ID, FnUpload + newer.ID, FnUpload + b.ID} {
		if !strings.Contains(strings.Join(fns, " ")+" ", want+" ") {
			t.Errorf("functions %v lack %s", fns, want)
		}
	}

	name, err := call(g, FnDelete+a.ID, "")
	if err != nil || name != a.Name() {
		t.Fatalf("image-delete = %q, %v; want %s", name, err, a.Name())
	}
	if _, err := r.st.Build(ctx, a.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("build after image-delete: %v, want not found", err)
	}
	if n := len(r.uploads(store.UploadFilter{BuildID: a.ID})); n != 0 {
		t.Errorf("%d upload records left after image-delete", n)
	}
	if _, err := r.clouds["pa"].Get(ctx, ext); err == nil {
		t.Errorf("cloud image %s still there after image-delete", ext)
	}
	fns, _ = g.functions(ctx)
	if joined := strings.Join(fns, " "); strings.Contains(joined, FnUpload+a.ID) || !strings.Contains(joined, FnDelete+a.ID) {
		t.Errorf("functions after image-delete = %v, want no upload of the build and its delete kept a while", fns)
	}
	// The same delete again (handed out again after a lost connection): the
	// same answer, at once.
	if again, err := call(g, FnDelete+a.ID, ""); err != nil || again != a.Name() {
		t.Errorf("image-delete asked again = %q, %v; want %s", again, err, a.Name())
	}
}

func TestGearmanBuildJobs(t *testing.T) {
	r := newRig(t, twoImages)
	r.run()
	g := newGearmanService(r.b)
	ctx := context.Background()

	// img-a is paused in the config: refused, with why.
	_, err := call(g, FnBuild+"img-a", "")
	wantErr(t, "paused image", err, "paused in the config")
	_, err = call(g, FnBuild+"img-a", "not a request id!")
	wantErr(t, "malformed request", err, "malformed request id")

	// A request that made a build before gets that build at once, paused or not.
	made, err := r.st.CreateBuild(ctx, store.Build{Image: "img-a", Source: store.SourceDIB, Request: "req-7"})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.raw.SetBuildState(ctx, &made, store.Ready, ""); err != nil {
		t.Fatal(err)
	}
	if id, err := call(g, FnBuild+"img-a", "req-7"); err != nil || id != made.ID {
		t.Errorf("image-build with the request of build %s = %q, %v", made.ID, id, err)
	}
	failed, err := r.st.CreateBuild(ctx, store.Build{Image: "img-b", Source: store.SourceDIB, Request: "req-8"})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.raw.SetBuildState(ctx, &failed, store.Failed, "dib exited 1"); err != nil {
		t.Fatal(err)
	}
	_, err = call(g, FnBuild+"img-b", "req-8")
	wantErr(t, "request whose build failed", err, failed.Name(), "failed: dib exited 1")
	_, err = call(g, FnBuild+"nope", "")
	wantErr(t, "unknown image", err, `"nope" is not an image of this builder's config`)
}

// TestGearmanAnswersShowNoUserinfo: a job's failure goes back to whoever asked,
// in clear, through gearmand: it says what failed, without the userinfo of a
// URL in the error.
func TestGearmanAnswersShowNoUserinfo(t *testing.T) {
	const password = "pw-2b9e"
	r := newRig(t, twoImages)
	r.clouds["pa"].mu.Lock()
	r.clouds["pa"].uploadErr = errors.New(`PUT "https://ci:` + password + `@glance.example.org/v2/images/x/file": connection reset`)
	r.clouds["pa"].mu.Unlock()
	r.run()
	g := newGearmanService(r.b)
	a := r.build("img-a")
	_, err := call(g, FnUpload+a.ID, "pa")
	wantErr(t, "image-upload to a failing cloud", err, `"https://glance.example.org/v2/images/x/file": connection reset`)
	if err != nil && strings.Contains(err.Error(), password) {
		t.Errorf("the answer shows the password: %v", err)
	}
}

func TestGearmanUnservedSaysWhy(t *testing.T) {
	r := newRig(t, twoImages)
	g := newGearmanService(r.b)
	a := r.build("img-a")
	ctx := context.Background()
	broken, err := r.st.CreateBuild(ctx, store.Build{Image: "img-b", Source: store.SourceDIB})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.raw.SetBuildState(ctx, &broken, store.Failed, "broken"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		function string
		bad      bool
		says     string
	}{
		{FnBuild + "nope", true, `"nope" is not an image any of them builds`},
		{FnBuild + "img-a", false, ""},
		{FnDelete + "0123456789abcdef0123456789abcdef", true, "no build 0123456789abcdef0123456789abcdef is known here"},
		{FnUpload + a.ID, false, ""},
		{FnUpload + broken.ID, true, "is failed"},
		{"reverse", false, ""},
	} {
		msg, bad := g.unserved(c.function)
		if bad != c.bad || !strings.Contains(msg, c.says) {
			t.Errorf("unserved(%q) = %q, %v; want %v saying %q", c.function, msg, bad, c.bad, c.says)
		}
	}
	// Only well-formed names of the builders' functions are judged at all.
	for fn, want := range map[string]bool{
		FnUpload + a.ID: true, FnDelete + "0001": true, FnBuild + "img-a": true, FnBuild + "é": true,
		FnUpload + "../etc": false, FnDelete + "a\tb": false, FnBuild + "a/b": false, FnBuild + "..": false,
		FnBuild + "a\x1b": false, FnBuild: false, "reverse": false, "image-frobnicate:x": false,
		FnUpload + strings.Repeat("0", 65): false,
	} {
		if got := wellFormed(fn); got != want {
			t.Errorf("wellFormed(%q) = %v, want %v", fn, got, want)
		}
	}
}

func TestFlightsShareOneCall(t *testing.T) {
	var f flights
	var calls atomic.Int32
	release := make(chan struct{})
	var wg sync.WaitGroup
	results := make([]string, 4)
	for i := range results {
		wg.Go(func() {
			results[i], _ = f.do("k", func() (string, error) {
				calls.Add(1)
				<-release
				return "done", nil
			})
		})
	}
	testenv.WaitFor(t, 5*time.Second, "the first call to start", func() bool { return calls.Load() == 1 })
	// The others join the first: they are waiting on it, not calling.
	testenv.WaitFor(t, 5*time.Second, "the callers to join", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.m["k"] != nil && f.m["k"].joined == len(results)-1
	})
	close(release)
	wg.Wait()
	if calls.Load() != 1 {
		t.Errorf("%d calls for one key at once, want 1", calls.Load())
	}
	for i, r := range results {
		if r != "done" {
			t.Errorf("caller %d got %q", i, r)
		}
	}
	// Done: the next call runs anew.
	if r, _ := f.do("k", func() (string, error) { return "again", nil }); r != "again" {
		t.Errorf("a call after the first ended got %q", r)
	}
}

// dibImage is one diskimage built by the fake disk-image-create, kept one
// ready build at a time: a second build would rotate the first out.
const dibImage = `images-dir: %s
build-log-dir: {{LOGS}}
diskimages:
  - name: dimg
    dib-cmd: {{DIB}}
    elements: [e]
    formats: [raw]
    rebuild-age: 604800
builder:
  keep-builds: 1
`

func dibConfig(t *testing.T, extra string) string {
	t.Helper()
	script, err := filepath.Abs(filepath.Join("..", "dib", "testdata", "fake-disk-image-create"))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(dibImage, "{{DIB}}", strconv.Quote("bash '"+script+"'"))
	return strings.ReplaceAll(text, "{{LOGS}}", filepath.Join(t.TempDir(), "logs")) + extra
}

// TestGearmanBuildJobsInARow: an image-build job while the newest ready build
// is younger than gearman-min-build-interval is refused, saying until when;
// the build stays, and no rotation happens.
func TestGearmanBuildJobsInARow(t *testing.T) {
	r := newRig(t, dibConfig(t, ""))
	g := newGearmanService(r.b)
	ctx := context.Background()

	first, err := call(g, FnBuild+"dimg", "")
	if err != nil {
		t.Fatalf("the first image-build: %v", err)
	}
	_, err = call(g, FnBuild+"dimg", "")
	wantErr(t, "a second image-build at once", err, "image-build dimg refused", store.BuildName("dimg", first),
		"younger than builder.gearman-min-build-interval (1h0m0s)", "ask again after")
	if err := r.b.lifecycle(ctx); err != nil {
		t.Fatal(err)
	}
	builds, err := r.st.Builds(ctx, store.BuildFilter{Image: "dimg"})
	if err != nil {
		t.Fatal(err)
	}
	if len(builds) != 1 || builds[0].ID != first || builds[0].State != store.Ready {
		t.Errorf("builds after two image-build jobs in a row: %+v; want %s alone, ready", builds, first)
	}

	// With the bound set to 0, each job makes a build.
	r2 := newRig(t, dibConfig(t, "  gearman-min-build-interval: 0\n"))
	g2 := newGearmanService(r2.b)
	a, errA := call(g2, FnBuild+"dimg", "")
	b, errB := call(g2, FnBuild+"dimg", "")
	if errA != nil || errB != nil || a == b {
		t.Errorf("image-build twice with no bound = %q, %v and %q, %v; want two builds", a, errA, b, errB)
	}
}

// TestGearmanFunctionsOfTheConfig: the kinds left out of gearman-functions
// are neither registered nor run, and their unserved jobs are answered.
func TestGearmanFunctionsOfTheConfig(t *testing.T) {
	r := newRig(t, twoImages+"builder:\n  gearman-functions: [image-build]\n")
	g := newGearmanService(r.b)
	ctx := context.Background()
	a := r.build("img-a")
	fns, err := g.functions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{FnBuild + "img-a", FnBuild + "img-b"}; !slices.Equal(fns, want) {
		t.Errorf("functions = %v, want %v", fns, want)
	}
	_, err = call(g, FnDelete+a.ID, "")
	wantErr(t, "image-delete left out of the config", err, "does not take image-delete jobs")
	_, err = call(g, FnUpload+a.ID, "pa")
	wantErr(t, "image-upload left out of the config", err, "does not take image-upload jobs")
	if bd, err := r.st.Build(ctx, a.ID); err != nil || bd.State != store.Ready {
		t.Errorf("build after a refused image-delete: %+v, %v; want it ready", bd, err)
	}
	if msg, bad := g.unserved(FnDelete + a.ID); !bad || !strings.Contains(msg, "does not take image-delete jobs") {
		t.Errorf("unserved(image-delete of a build here) = %q, %v; want it answered as not taken", msg, bad)
	}
}

// TestGearmanFunctionsRefuseBadIDs: build ids from the state that hold a tab
// or an escape make no gearman function: gearmand's admin status stays
// readable and shows none of them, and the log names each id refused.
// wellFormed, which makes the refusal of the functions, has its own table.
func TestGearmanFunctionsRefuseBadIDs(t *testing.T) {
	gd := testenv.NewGearmand(t)
	logs := &logBuffer{}
	r := newRig(t, twoImages+"builder:\n  gearman-servers: [{host: "+gd.Host+", port: "+strconv.Itoa(gd.Port)+"}]\n",
		func(o *Options) { o.Logger = slog.New(slog.NewTextHandler(logs, nil)) })
	good := r.build("img-a")
	bad := map[string]string{r.build("img-a").ID: "tab\tid", r.build("img-b").ID: "esc\x1b[2Jid"}
	// As a hand edit of the state would.
	db, err := sql.Open("sqlite", "file:"+filepath.Join(r.st.Dir(), "builder.db")+"?_pragma=foreign_keys(0)&_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for from, to := range bad {
		for _, q := range []string{"UPDATE builds SET id = ? WHERE id = ?", "UPDATE build_files SET build_id = ? WHERE build_id = ?"} {
			if _, err := db.Exec(q, to, from); err != nil {
				t.Fatal(err)
			}
		}
	}
	g := newGearmanService(r.b)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); g.run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	testenv.WaitFor(t, 30*time.Second, "a worker of the good build's upload in gearmand", func() bool {
		return gearmanWorkers(t, gd, FnUpload+good.ID) == 1
	})
	st, err := gd.Status(context.Background())
	if err != nil {
		t.Fatalf("gearmand's admin status does not read: %v", err)
	}
	for fn := range st {
		if strings.Contains(fn, "id") && !strings.Contains(fn, good.ID) && !strings.HasPrefix(fn, FnBuild) {
			t.Errorf("gearmand lists %q", fn)
		}
		if strings.ContainsFunc(fn, func(r rune) bool { return r < ' ' }) {
			t.Errorf("gearmand lists %q, with a control byte", fn)
		}
	}
	// The store refuses such a record as it reads it; were one to come
	// through, the functions would refuse its id.
	for _, id := range bad {
		escaped := strings.Trim(strconv.Quote(id), `"`)
		if r.storeLogs.count(escaped) == 0 && logs.count(strconv.Quote(FnUpload+id)) == 0 && logs.count(strconv.Quote(FnDelete+id)) == 0 {
			t.Errorf("no log line names the refused id %q:\n%s\n%s", id, r.storeLogs, logs.b.String())
		}
	}
}

// submitJobs submits a job of function for each unique id, all at once on one
// connection with SUBMIT_JOB packets, as any client may, and returns each
// job's answer by unique id: the data of its WORK_COMPLETE, or "failed: " and
// what its WORK_DATA said. It fails the test when they are not all answered
// within a minute.
func submitJobs(t *testing.T, gd *testenv.Gearmand, function string, uniques []string) map[string]string {
	t.Helper()
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(gd.Host, strconv.Itoa(gd.Port)), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(time.Minute))
	var out []byte
	for _, u := range uniques {
		b, err := gearman.Req(gearman.SubmitJob, function, u, "").MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b...)
	}
	if _, err := conn.Write(out); err != nil {
		t.Fatal(err)
	}
	// gearmand answers JOB_CREATED in the order of the submits.
	r := bufio.NewReader(conn)
	unique := map[string]string{} // by handle
	answers := map[string]string{}
	said := map[string]string{} // WORK_DATA by handle
	for len(answers) < len(uniques) {
		p, err := gearman.ReadPacket(r)
		if err != nil {
			t.Fatalf("%d of %d jobs answered, then: %v", len(answers), len(uniques), err)
		}
		switch p.Type {
		case gearman.JobCreated:
			unique[p.Arg(0)] = uniques[len(unique)]
		case gearman.WorkData:
			said[p.Arg(0)] += p.Arg(1)
		case gearman.WorkComplete:
			answers[unique[p.Arg(0)]] = strings.TrimSpace(p.Arg(1))
		case gearman.WorkFail:
			answers[unique[p.Arg(0)]] = "failed: " + said[p.Arg(0)]
		}
	}
	return answers
}

// TestGearmanZuulImageBuildJobsSharePolls: thirty image-build jobs of a
// zuul-image at once, each its own request, cost a bounded number of polls of
// Zuul: the jobs that come before a poll starts share its answer, and the
// polls they start are spaced as MQTT hints are. Every job is answered with
// the build of Zuul's newest build.
func TestGearmanZuulImageBuildJobsSharePolls(t *testing.T) {
	gd := testenv.NewGearmand(t)
	zuul := zuultest.NewServer(zuultest.ServerOptions{})
	t.Cleanup(zuul.Close)
	raw := make([]byte, 1<<20)
	copy(raw, "the image Zuul built")
	zb, err := zuul.AddBuild(zuultest.BuildSpec{Job: "build-zimg", Artifacts: []zuultest.ArtifactSpec{
		{Name: "raw", Data: raw, Metadata: map[string]any{"type": "zuul_image", "format": "raw"}}}})
	if err != nil {
		t.Fatal(err)
	}
	text := strings.NewReplacer("{{ZUUL}}", zuul.URL(), "{{EVERY}}", "3600").Replace(zuulImage) +
		"builder:\n  gearman-servers: [{host: " + gd.Host + ", port: " + strconv.Itoa(gd.Port) + "}]\n"
	r := newRig(t, text)
	// Only the jobs poll: the daemon's loops do not run.
	g := newGearmanService(r.b)
	// The bound of MQTT hints, with 5 s for 30: the jobs all come within it.
	g.polls.limiter = ratelimit.New(zuulmqtt.DefaultHintBurst, 5*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); g.run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	testenv.WaitFor(t, 30*time.Second, "a worker of image-build:zimg in gearmand", func() bool {
		return gearmanWorkers(t, gd, FnBuild+"zimg") == 1
	})

	var uniques []string
	for i := range 30 {
		uniques = append(uniques, fmt.Sprintf("req-%d", i))
	}
	answers := submitJobs(t, gd, FnBuild+"zimg", uniques)
	builds, err := r.st.Builds(context.Background(), store.BuildFilter{Image: "zimg", State: store.Ready})
	if err != nil || len(builds) != 1 || builds[0].Zuul.UUID != zb.UUID {
		t.Fatalf("ready builds of zimg: %+v, %v; want the one of Zuul build %s", builds, err, zb.UUID)
	}
	for _, u := range uniques {
		if answers[u] != builds[0].ID {
			t.Errorf("job %s answered %q, want %s", u, answers[u], builds[0].ID)
		}
	}
	t.Logf("thirty jobs polled Zuul %d times", len(zuul.BuildsCalls()))
	// Two polls at once, then one every 5 s.
	if polls := len(zuul.BuildsCalls()); polls > 3 {
		t.Errorf("thirty jobs polled Zuul %d times, want at most 3", polls)
	}
}

// TestZuulPollsWaitIsCancellable: a job whose poll the limiter holds waits,
// and ends with its context, as do the jobs that joined it; no poll is made
// for them, and the held poll's token goes to the next job's poll.
func TestZuulPollsWaitIsCancellable(t *testing.T) {
	z := newZuulPolls(slog.New(slog.NewTextHandler(t.Output(), nil)))
	z.limiter = ratelimit.New(1, time.Hour)
	var polls atomic.Int32
	poll := func(started func()) (string, error) {
		started()
		return fmt.Sprint("build-", polls.Add(1)), nil
	}
	if id, err := z.share(context.Background(), "zimg", poll); id != "build-1" || err != nil {
		t.Fatalf("the first job = %q, %v; want build-1 at once", id, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := z.share(ctx, "zimg", poll)
			errs <- err
		}()
	}
	testenv.WaitFor(t, 10*time.Second, "the held poll to be pending", func() bool {
		z.mu.Lock()
		defer z.mu.Unlock()
		return z.pending["zimg"] != nil
	})
	cancel()
	for range 2 {
		select {
		case err := <-errs:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("a held job ended with %v, want its context's end", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a held job did not end with its context")
		}
	}
	if n := polls.Load(); n != 1 {
		t.Errorf("%d polls, want only the first job's", n)
	}
	// Another image has a bucket of its own.
	if id, err := z.share(context.Background(), "other", poll); id != "build-2" || err != nil {
		t.Errorf("a job of another image = %q, %v; want build-2 at once", id, err)
	}
}
