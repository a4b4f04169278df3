package gearman

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
)

// newFakeWorker makes a worker of the fake server with a gated handler; tune
// changes the options first.
func newFakeWorker(t *testing.T, f *fakeServer, g *gate, res *results, maxJobs int, tune ...func(*Options)) *Worker {
	opts := Options{
		Servers:    []Server{f.server()},
		ClientID:   "builder01",
		Handler:    g.handler,
		Logger:     testLogger(t),
		MaxJobs:    maxJobs,
		MinBackoff: 10 * time.Millisecond,
		MaxBackoff: 50 * time.Millisecond,
		OnJob:      res.add,
	}
	for _, change := range tune {
		change(&opts)
	}
	return New(opts)
}

// TestWorkerGrabCycle follows the PROTOCOL document's sleep cycle: GRAB_JOB_UNIQ,
// NO_JOB, PRE_SLEEP, NOOP, GRAB_JOB_UNIQ, JOB_ASSIGN_UNIQ, WORK_STATUS, WORK_COMPLETE.
func TestWorkerGrabCycle(t *testing.T) {
	f := newFakeServer(t)
	g, res := newGate(), &results{}
	w := newFakeWorker(t, f, g, res, 1)
	w.SetFunctions([]string{"reverse", "another"})
	runWorker(t, w)

	c := f.accept()
	c.expect(Req(SetClientID, "builder01"), Req(CanDo, "another"), Req(CanDo, "reverse"), Req(GrabJobUniq))
	c.send(resPacket(NoJob))
	c.expect(Req(PreSleep))
	c.send(resPacket(Noop))
	c.expect(Req(GrabJobUniq))
	c.send(resPacket(JobAssignUniq, "H:lap:1", "reverse", "U1", "test"))
	j := g.waitStarted(t)
	if j.Function != "reverse" || j.Handle != "H:lap:1" || j.Unique != "U1" || string(j.Data) != "test" {
		t.Fatalf("handler got %+v", j)
	}
	st := w.Status()
	if len(st.Running) != 1 || st.Running[0].Handle != "H:lap:1" || !st.Servers[0].Connected || st.Servers[0].Registered != 2 {
		t.Errorf("status while running: %+v", st)
	}
	j.Status(1, 2)
	// MaxJobs is 1: no grab until the job is answered.
	g.finish("test", result{data: []byte("tset")})
	c.expect(Req(WorkStatus, "H:lap:1", "1", "2"), Req(WorkComplete, "H:lap:1", "tset"), Req(GrabJobUniq))
	jr := res.wait(t, 1)[0]
	if !jr.Delivered || string(jr.Result) != "tset" || jr.Err != nil || jr.Unserved || jr.Server != f.server().String() || string(jr.Data) != "test" {
		t.Errorf("OnJob got %+v", jr)
	}
	// A status after the answer would draw an ERROR from the server; it is dropped.
	j.Status(2, 2)

	// A NOOP while the grab is outstanding: after NO_JOB it grabs again, not sleeps.
	c.send(resPacket(Noop))
	c.send(resPacket(NoJob))
	c.expect(Req(GrabJobUniq))
	c.send(resPacket(JobAssignUniq, "H:lap:2", "another", "", "x"))
	g.waitStarted(t)
	g.finish("x", result{err: errors.New("no such build\n0042")})
	c.expect(Req(WorkData, "H:lap:2", "no such build 0042\n"), Req(WorkFail, "H:lap:2"), Req(GrabJobUniq))
	c.send(resPacket(NoJob))
	c.expect(Req(PreSleep))
	if st := w.Status(); st.Served != 1 || st.Failed != 1 || len(st.Running) != 0 {
		t.Errorf("status after two jobs: %+v", st)
	}
}

// TestWorkerDefersCantDo: a function removed while its job is held, or while a grab is
// outstanding, is unregistered only after the answer, or after the grab's NO_JOB.
func TestWorkerDefersCantDo(t *testing.T) {
	f := newFakeServer(t)
	g, res := newGate(), &results{}
	w := newFakeWorker(t, f, g, res, 2)
	w.SetFunctions([]string{"f"})
	runWorker(t, w)

	c := f.accept()
	c.expect(Req(SetClientID, "builder01"), Req(CanDo, "f"), Req(GrabJobUniq))
	c.send(resPacket(JobAssignUniq, "H:1", "f", "", "d"))
	g.waitStarted(t)
	c.expect(Req(GrabJobUniq)) // a second slot is free
	c.send(resPacket(NoJob))
	c.expect(Req(PreSleep))

	// f goes while its job runs; g comes. CAN_DO g shows the change was seen; asleep, it
	// grabs for g's queued jobs; CANT_DO f waits for the answer.
	w.SetFunctions([]string{"g"})
	c.expect(Req(CanDo, "g"), Req(GrabJobUniq))
	// Removed during the grab: nothing until NO_JOB, since gearmand could be assigning
	// a job of it right now.
	w.SetFunctions(nil)
	c.send(resPacket(NoJob))
	c.expect(Req(CantDo, "g"), Req(PreSleep))
	g.finish("d", result{data: []byte("ok")})
	c.expect(Req(WorkComplete, "H:1", "ok"), Req(CantDo, "f"))
	if jr := res.wait(t, 1)[0]; !jr.Delivered {
		t.Errorf("OnJob got %+v", jr)
	}
	testenv.WaitFor(t, waitTimeout, "no function registered", func() bool { return w.Status().Servers[0].Registered == 0 })
}

// TestWorkerReconnects: a dropped connection, an ERROR packet, an oversized packet and
// an unanswered ECHO_REQ each make the worker dial again and register everything again.
func TestWorkerReconnects(t *testing.T) {
	f := newFakeServer(t)
	g, res := newGate(), &results{}
	w := newFakeWorker(t, f, g, res, 1, func(o *Options) { o.PingIdle, o.PingTimeout = 100*time.Millisecond, 100*time.Millisecond })
	w.SetFunctions([]string{"f"})
	runWorker(t, w)
	hello := []Packet{Req(SetClientID, "builder01"), Req(CanDo, "f"), Req(GrabJobUniq)}

	c := f.accept()
	c.expect(hello...)
	c.send(resPacket(NoJob))
	c.expect(Req(PreSleep))
	// Idle: it pings; an answer keeps the connection.
	c.expect(Req(EchoReq, "ping"))
	c.send(resPacket(EchoRes, "ping"))
	c.expect(Req(EchoReq, "ping"))
	// No answer this time: it gives up on the connection.
	c.expectClosed()
	testenv.WaitFor(t, waitTimeout, "the ping failure in the status", func() bool {
		return strings.Contains(w.Status().Servers[0].LastError, "no answer to ECHO_REQ")
	})

	c = f.accept()
	c.expect(hello...)
	c.send(resPacket(Error, "ERR_TEST", "something is wrong"))
	c.expectClosed()
	testenv.WaitFor(t, waitTimeout, "the ERROR in the status", func() bool {
		return strings.Contains(w.Status().Servers[0].LastError, "server sent ERROR ERR_TEST: something is wrong")
	})

	c = f.accept()
	c.expect(hello...)
	c.c.Write(hexPacket("\x00RES", uint32(JobAssignUniq), MaxDataSize+1, ""))
	c.expectClosed()
	testenv.WaitFor(t, waitTimeout, "the oversized packet in the status", func() bool {
		return strings.Contains(w.Status().Servers[0].LastError, "more than 1048576")
	})

	c = f.accept()
	c.expect(hello...)
	c.c.Close()
	c = f.accept()
	c.expect(hello...)
	testenv.WaitFor(t, waitTimeout, "connected", func() bool { return w.Status().Servers[0].Connected })
}

// TestWorkerSameJobAgain: a job requeued after a dropped connection comes back with
// the same function and unique while its handler still runs; the handler is not called
// again, and the new assignment gets the running one's result.
func TestWorkerSameJobAgain(t *testing.T) {
	f := newFakeServer(t)
	g, res := newGate(), &results{}
	w := newFakeWorker(t, f, g, res, 4)
	w.SetFunctions([]string{"f"})
	runWorker(t, w)

	c := f.accept()
	c.expect(Req(SetClientID, "builder01"), Req(CanDo, "f"), Req(GrabJobUniq))
	c.send(resPacket(JobAssignUniq, "H:1", "f", "KEY", "d1"))
	g.waitStarted(t)
	c.c.Close()

	c = f.accept()
	c.expect(Req(SetClientID, "builder01"), Req(CanDo, "f"), Req(GrabJobUniq))
	c.send(resPacket(JobAssignUniq, "H:1", "f", "KEY", "d1"))
	c.expect(Req(GrabJobUniq)) // the wait takes no slot
	testenv.WaitFor(t, waitTimeout, "two running jobs in the status", func() bool { return len(w.Status().Running) == 2 })
	// A job with another unique is another job: its handler runs.
	c.send(resPacket(JobAssignUniq, "H:2", "f", "OTHER", "d2"))
	g.waitStarted(t)
	c.expect(Req(GrabJobUniq))

	g.finish("d1", result{data: []byte("r1")})
	c.expect(Req(WorkComplete, "H:1", "r1"))
	all := res.wait(t, 2)
	if all[0].Delivered == all[1].Delivered {
		t.Errorf("want one undelivered result (the dropped connection) and one delivered: %v", res)
	}
	g.finish("d2", result{data: []byte("r2")})
	c.expect(Req(WorkComplete, "H:2", "r2"))
	if n1, n2 := g.count("d1"), g.count("d2"); n1 != 1 || n2 != 1 {
		t.Errorf("handler called %d times for KEY and %d for OTHER, want once each", n1, n2)
	}
}

// TestWorkerUnserved: a function nobody serves, with queued jobs, that Unserved calls
// bad for UnservedAfter is registered, its jobs failed with the message, and dropped
// once none are queued; one that becomes ours meanwhile runs its handler.
func TestWorkerUnserved(t *testing.T) {
	f := newFakeServer(t)
	g, res := newGate(), &results{}
	w := New(Options{
		Servers:    []Server{f.server()},
		Handler:    g.handler,
		Logger:     testLogger(t),
		MinBackoff: 10 * time.Millisecond,
		MaxBackoff: 50 * time.Millisecond,
		OnJob:      res.add,
		Unserved: func(fn string) (string, bool) {
			if name, ok := strings.CutPrefix(fn, "image-upload:"); ok {
				return "no build " + name + "\non this builder", true
			}
			return "", false
		},
		UnservedAfter: 200 * time.Millisecond,
		UnservedCheck: 20 * time.Millisecond,
	})
	w.SetFunctions([]string{"f"})
	f.setStatus("f\t0\t0\t1", "image-upload:0001\t2\t0\t0", "other\t5\t0\t0", "image-upload:0002\t1\t0\t1")
	start := time.Now()
	runWorker(t, w)

	c := f.accept()
	c.expect(Req(CanDo, "f"), Req(GrabJobUniq))
	c.send(resPacket(NoJob))
	c.expect(Req(PreSleep))
	// Only image-upload:0001: "other" is not bad, and 0002 has a worker.
	c.expect(Req(CanDo, "image-upload:0001"), Req(GrabJobUniq))
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Errorf("registered the unserved function after %s, before UnservedAfter", d)
	}
	c.send(resPacket(JobAssignUniq, "H:1", "image-upload:0001", "u", "provider"))
	c.expectAny(Req(WorkData, "H:1", "no build 0001 on this builder\n"), Req(WorkFail, "H:1"), Req(GrabJobUniq))
	jr := res.wait(t, 1)[0]
	if !jr.Unserved || !jr.Delivered || jr.Err == nil || jr.Err.Error() != "no build 0001 on this builder" {
		t.Errorf("OnJob got %+v", jr)
	}
	if g.count("provider") != 0 {
		t.Errorf("the handler ran for an unserved function")
	}

	// It becomes ours before its second job is assigned: the handler does it.
	w.SetFunctions([]string{"f", "image-upload:0001"})
	c.send(resPacket(JobAssignUniq, "H:2", "image-upload:0001", "u2", "provider"))
	g.waitStarted(t)
	g.finish("provider", result{data: []byte("image-id")})
	c.expectAny(Req(GrabJobUniq), Req(WorkComplete, "H:2", "image-id"))
	if jr := res.wait(t, 2)[1]; jr.Unserved || string(jr.Result) != "image-id" {
		t.Errorf("OnJob got %+v", jr)
	}

	// Ours no more, and none queued: it stays unregistered.
	f.setStatus("f\t0\t0\t1", "image-upload:0001\t0\t0\t1")
	w.SetFunctions([]string{"f"})
	c.send(resPacket(NoJob))
	// The watcher may not have read the new status yet: then CANT_DO follows it.
	c.expectAny(Req(CantDo, "image-upload:0001"), Req(PreSleep))
}

func TestUnservedTracker(t *testing.T) {
	bad := map[string]string{"a": "no a", "b": "no b", "c": "no c"}
	ours := map[string]bool{"c": true}
	u := unservedTracker{
		after:  time.Minute,
		ours:   func(f string) bool { return ours[f] },
		judge:  func(f string) (string, bool) { m, ok := bad[f]; return m, ok },
		seen:   map[string]time.Time{},
		active: map[string]string{},
	}
	t0 := time.Unix(1000, 0)
	steps := []struct {
		at     time.Duration
		status []functionStatus
		want   map[string]string // nil: no change
	}{
		// a queued with no worker; b running only; c ours; d not bad.
		{0, []functionStatus{{"a", 2, 0, 0}, {"b", 1, 1, 0}, {"c", 1, 0, 0}, {"d", 1, 0, 0}}, nil},
		{30 * time.Second, []functionStatus{{"a", 2, 0, 0}}, nil},
		{60 * time.Second, []functionStatus{{"a", 2, 0, 0}, {"b", 2, 1, 0}}, map[string]string{"a": "no a"}},
		// Registered by us, a has one worker: still unserved. b's streak began at 60s.
		{90 * time.Second, []functionStatus{{"a", 1, 0, 1}, {"b", 2, 1, 0}}, nil},
		// A real worker for a: drop it. b had a worker at 100s: its streak starts over.
		{100 * time.Second, []functionStatus{{"a", 1, 0, 2}, {"b", 2, 1, 1}}, map[string]string{}},
		{110 * time.Second, []functionStatus{{"b", 2, 1, 0}}, nil},
		{169 * time.Second, []functionStatus{{"b", 2, 1, 0}}, nil},
		{170 * time.Second, []functionStatus{{"b", 2, 1, 0}}, map[string]string{"b": "no b"}},
		// None queued: drop it.
		{180 * time.Second, []functionStatus{{"b", 1, 1, 1}}, map[string]string{}},
	}
	for _, s := range steps {
		got := u.step(s.status, t0.Add(s.at))
		if (got == nil) != (s.want == nil) || len(got) != len(s.want) {
			t.Fatalf("at %s: step = %v, want %v", s.at, got, s.want)
		}
		for k, v := range s.want {
			if got[k] != v {
				t.Fatalf("at %s: step = %v, want %v", s.at, got, s.want)
			}
		}
	}
}

// TestUnservedTrackerBounded: thousands of made-up functions with queued jobs cost
// at most maxJudged verdicts per status, none for names that are not candidates, and
// every candidate gets its turn.
func TestUnservedTrackerBounded(t *testing.T) {
	judged := map[string]int{}
	var stepCalls int
	u := unservedTracker{
		after:     time.Minute,
		ours:      func(string) bool { return false },
		candidate: func(f string) bool { return strings.HasPrefix(f, "image-upload:") },
		judge: func(f string) (string, bool) {
			judged[f]++
			stepCalls++
			return "no " + f, true
		},
		seen:   map[string]time.Time{},
		active: map[string]string{},
	}
	var status []functionStatus
	for i := range 3000 {
		status = append(status, functionStatus{fmt.Sprintf("image-upload:%04d", i), 1, 0, 0},
			functionStatus{fmt.Sprintf("made-up:%04d", i), 1, 0, 0},
			functionStatus{fmt.Sprintf("image-upload:%04d\x1b", i), 1, 0, 0})
	}
	t0 := time.Unix(1000, 0)
	answered := map[string]bool{}
	for i := range 200 {
		stepCalls = 0
		got := u.step(status, t0.Add(time.Duration(i)*5*time.Second))
		if stepCalls > maxJudged {
			t.Fatalf("step %d judged %d functions, want at most %d", i, stepCalls, maxJudged)
		}
		if i == 0 && u.left != 3000-maxJudged {
			t.Errorf("first step left %d for later, want %d", u.left, 3000-maxJudged)
		}
		for f := range got {
			answered[f] = true
		}
	}
	for f, n := range judged {
		if !strings.HasPrefix(f, "image-upload:") || checkFunction(f) != nil {
			t.Errorf("judged %q, which is no candidate", f)
		}
		if n > 2 {
			t.Errorf("judged %s %d times, want twice at most: once, then once after UnservedAfter", f, n)
		}
	}
	if len(answered) != 3000 {
		t.Errorf("%d functions answered after 200 steps, want all 3000 candidates in turn", len(answered))
	}
}

func TestParseStatus(t *testing.T) {
	conn := &rw{in: strings.NewReader("image-build:debian\t3\t1\t2\nimage-upload:0001\t0\t0\t0\n.\n")}
	st, err := readStatus(conn)
	if err != nil {
		t.Fatal(err)
	}
	if conn.out.String() != "status\n" {
		t.Errorf("sent %q, want status\\n", conn.out.String())
	}
	want := []functionStatus{{"image-build:debian", 3, 1, 2}, {"image-upload:0001", 0, 0, 0}}
	if len(st) != 2 || st[0] != want[0] || st[1] != want[1] || st[0].Queued() != 2 {
		t.Errorf("status = %+v, want %+v", st, want)
	}
	// The lines of a function whose name holds a tab or a newline are skipped.
	st, err = readStatus(&rw{in: strings.NewReader("a\tb\t1\t0\t0\nc\nd\t1\t0\t0\nf\tx\t0\t0\ng\t2\t0\t0\n.\n")})
	if want := []functionStatus{{"d", 1, 0, 0}, {"g", 2, 0, 0}}; err != nil || !slices.Equal(st, want) {
		t.Errorf("status with broken lines = %+v, %v; want %+v", st, err, want)
	}
	for _, bad := range []string{"f\t1\t0\t0\n", "ERR UNKNOWN_COMMAND Unknown+server+command\n"} {
		if st, err := readStatus(&rw{in: strings.NewReader(bad)}); err == nil {
			t.Errorf("status from %q = %+v, want an error", bad, st)
		}
	}
}

type rw struct {
	in  *strings.Reader
	out strings.Builder
}

func (r *rw) Read(p []byte) (int, error)  { return r.in.Read(p) }
func (r *rw) Write(p []byte) (int, error) { return r.out.Write(p) }

func TestOneLine(t *testing.T) {
	long := strings.Repeat("é", maxMessage)
	for in, want := range map[string]string{
		"upload failed:\n  quota exceeded\r\n": "upload failed:   quota exceeded",
		"a\x00b\tc":                            "ab c",
		"":                                     "job failed",
		"bad \xff utf8":                        "bad ? utf8",
	} {
		if got := oneLine(in); got != want {
			t.Errorf("oneLine(%q) = %q, want %q", in, got, want)
		}
	}
	got := oneLine(long)
	if len(got) > maxMessage || !strings.HasSuffix(got, "...") || !strings.HasPrefix(got, "éé") || !utf8Valid(got) {
		t.Errorf("oneLine of %d bytes = %d bytes ending %q", len(long), len(got), got[len(got)-8:])
	}
}

func utf8Valid(s string) bool { return strings.ToValidUTF8(s, "") == s }

func TestServerString(t *testing.T) {
	for s, want := range map[Server]string{
		{Host: "gearman.example.com"}:   "gearman.example.com:4730",
		{Host: "10.0.0.1", Port: 4731}:  "10.0.0.1:4731",
		{Host: "2001:db8::1", Port: 47}: "[2001:db8::1]:47",
	} {
		if got := s.String(); got != want {
			t.Errorf("%+v.String() = %q, want %q", s, got, want)
		}
	}
}

func TestSetFunctionsRefusesBadNames(t *testing.T) {
	w := New(Options{Logger: testLogger(t)})
	w.SetFunctions([]string{"ok", "", "with space", "nul\x00", "tab\tx", "esc\x1b[2J", "del\x7f", strings.Repeat("x", 513), "ok"})
	if got := w.Status().Functions; len(got) != 1 || got[0] != "ok" {
		t.Errorf("functions = %q, want [ok]", got)
	}
}

// TestWorkerConcurrentWrites: statuses from many goroutines and the answer arrive as
// whole packets.
func TestWorkerConcurrentWrites(t *testing.T) {
	f := newFakeServer(t)
	const goroutines, each = 8, 50
	w := New(Options{
		Servers: []Server{f.server()},
		Logger:  testLogger(t),
		MaxJobs: 1,
		Handler: func(ctx context.Context, j *Job) ([]byte, error) {
			var wg sync.WaitGroup
			for range goroutines {
				wg.Go(func() {
					for i := range each {
						j.Status(uint64(i), each)
					}
				})
			}
			wg.Wait()
			return []byte(strings.Repeat("r", 64<<10)), nil
		},
	})
	w.SetFunctions([]string{"f"})
	runWorker(t, w)
	c := f.accept()
	c.expect(Req(CanDo, "f"), Req(GrabJobUniq))
	c.send(resPacket(JobAssignUniq, "H:1", "f", "", ""))
	for range goroutines * each {
		if p := c.next(); p.Type != WorkStatus || p.Arg(0) != "H:1" || p.Arg(2) != "50" {
			t.Fatalf("got %v, want a WORK_STATUS of H:1", p)
		}
	}
	if p := c.next(); p.Type != WorkComplete || len(p.Arg(1)) != 64<<10 {
		t.Fatalf("got %s with %d bytes, want WORK_COMPLETE", p.Type, len(p.Arg(1)))
	}
}

// TestWorkerStopWaitsForHandlers: when Run's context ends, Run closes the connection,
// the handlers see their context end, and Run returns after them.
func TestWorkerStopWaitsForHandlers(t *testing.T) {
	f := newFakeServer(t)
	g, res := newGate(), &results{}
	w := newFakeWorker(t, f, g, res, 4)
	w.SetFunctions([]string{"f"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	c := f.accept()
	c.expect(Req(SetClientID, "builder01"), Req(CanDo, "f"), Req(GrabJobUniq))
	c.send(resPacket(JobAssignUniq, "H:1", "f", "K", "d"))
	g.waitStarted(t)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("Run did not return after its context ended")
	}
	c.expectClosed()
	all := res.get()
	if len(all) != 1 || all[0].Delivered || !errors.Is(all[0].Err, context.Canceled) {
		t.Errorf("OnJob: %v; want the canceled job, undelivered", res)
	}
	if st := w.Status(); st.Servers[0].Connected || len(st.Running) != 0 {
		t.Errorf("status after Run: %+v", st)
	}
}
