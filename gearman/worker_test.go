package gearman

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
)

// These tests run the worker against a real gearmand, with the gearman command
// (gearman-tools) as the client and gearadmin to look at the server.

// realServer is a gearmand and the paths of its command-line tools.
type realServer struct {
	*testenv.Gearmand
	gearman, gearadmin string
}

func newRealServer(t *testing.T) *realServer {
	t.Helper()
	gearman := testenv.RequireBinary(t, "gearman")
	gearadmin := testenv.RequireBinary(t, "gearadmin")
	return &realServer{Gearmand: testenv.NewGearmand(t), gearman: gearman, gearadmin: gearadmin}
}

func (g *realServer) server() Server { return Server{Host: g.Host, Port: g.Port} }

// clientRun is the outcome of a gearman command.
type clientRun struct {
	stdout, stderr string
	exit           int
	took           time.Duration
	err            error // other than a non-zero exit
}

// client starts `gearman args...` against the server and returns its outcome when it
// ends; its context ends with the test.
func (g *realServer) client(t *testing.T, args ...string) <-chan clientRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	cmd := g.Command(ctx, g.gearman, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start gearman %q: %v", args, err)
	}
	done := make(chan clientRun, 1)
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		defer cancel()
		err := cmd.Wait()
		r := clientRun{stdout: stdout.String(), stderr: stderr.String(), took: time.Since(start)}
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			r.exit = exit.ExitCode()
		} else {
			r.err = err
		}
		done <- r
	}()
	t.Cleanup(func() {
		cancel()
		<-exited
	})
	return done
}

// wait returns the client's outcome, failing the test if it does not end in time.
func wait(t *testing.T, c <-chan clientRun) clientRun {
	t.Helper()
	select {
	case r := <-c:
		if r.err != nil {
			t.Fatalf("gearman: %v (stderr %q)", r.err, r.stderr)
		}
		return r
	case <-time.After(waitTimeout + 20*time.Second):
		t.Fatal("gearman did not end")
		return clientRun{}
	}
}

// adminStatus runs `gearadmin --status` and returns its lines, keyed by function:
// "TOTAL RUNNING WORKERS".
func (g *realServer) adminStatus(t *testing.T) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := g.Command(ctx, g.gearadmin, "--status").Output()
	if err != nil {
		t.Fatalf("gearadmin --status: %v", err)
	}
	st := map[string]string{}
	for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Split(line, "\t"); len(f) == 4 {
			st[f[0]] = strings.Join(f[1:], " ")
		}
	}
	return st
}

// waitAdmin waits until gearadmin --status shows these lines.
func (g *realServer) waitAdmin(t *testing.T, want map[string]string) {
	t.Helper()
	var st map[string]string
	deadline := time.Now().Add(waitTimeout)
	for {
		st = g.adminStatus(t)
		ok := true
		for f, w := range want {
			if st[f] != w {
				ok = false
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("gearadmin --status = %v, want %v", st, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func realWorker(t *testing.T, servers []Server, h Handler, res *results) *Worker {
	return New(Options{
		Servers:    servers,
		ClientID:   "builder-test",
		Handler:    h,
		Logger:     testLogger(t),
		MinBackoff: 20 * time.Millisecond,
		MaxBackoff: 200 * time.Millisecond,
		OnJob:      res.add,
	})
}

func TestGearmanJobCompletesAndFails(t *testing.T) {
	g := newRealServer(t)
	res := &results{}
	w := realWorker(t, []Server{g.server()}, func(ctx context.Context, j *Job) ([]byte, error) {
		switch j.Function {
		case "reverse":
			j.Status(1, 2)
			out := []byte(string(j.Data))
			slices.Reverse(out)
			return out, nil
		default:
			return nil, errors.New("no such build: " + string(j.Data) + "\nsee the builder's log")
		}
	}, res)
	w.SetFunctions([]string{"reverse", "fail"})
	runWorker(t, w)
	g.waitAdmin(t, map[string]string{"reverse": "0 0 1", "fail": "0 0 1"})

	ok := g.client(t, "-f", "reverse", "hello")
	failed := g.client(t, "-f", "fail", "0042")

	// The result on stdout, and the WORK_STATUS as "50% Complete".
	r := wait(t, ok)
	t.Logf("success: exit %d, stdout %q, stderr %q", r.exit, r.stdout, r.stderr)
	if r.exit != 0 || !strings.Contains(r.stdout, "olleh") || !strings.Contains(r.stdout, "50% Complete\n") || r.stderr != "" {
		t.Errorf("gearman -f reverse hello: exit %d, stdout %q, stderr %q; want 0, olleh and 50%% Complete", r.exit, r.stdout, r.stderr)
	}
	// The WORK_DATA message on stdout, "Job failed" on stderr for the WORK_FAIL, exit 1.
	r = wait(t, failed)
	t.Logf("failure: exit %d, stdout %q, stderr %q", r.exit, r.stdout, r.stderr)
	if r.exit != 1 || r.stdout != "no such build: 0042 see the builder's log\n" || r.stderr != "Job failed\n" {
		t.Errorf("gearman -f fail 0042: exit %d, stdout %q, stderr %q; want 1, the message, Job failed", r.exit, r.stdout, r.stderr)
	}

	all := res.wait(t, 2)
	for _, jr := range all {
		if !jr.Delivered || jr.Unique == "" || jr.Handle == "" {
			t.Errorf("OnJob got %+v", jr)
		}
		// Without -u the gearman command makes up a UUID as the unique.
		t.Logf("%s: handle %s, unique %s", jr.Function, jr.Handle, jr.Unique)
	}
	if st := w.Status(); st.Served != 1 || st.Failed != 1 || !st.Servers[0].Connected || st.Servers[0].Registered != 2 {
		t.Errorf("status %+v", st)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	workers, err := g.Command(ctx, g.gearadmin, "--workers").Output()
	if err != nil || !bytes.Contains(workers, []byte(" builder-test : ")) {
		t.Errorf("gearadmin --workers = %q, %v; want the client id builder-test", workers, err)
	}
}

func TestGearmanSetFunctions(t *testing.T) {
	g := newRealServer(t)
	w := realWorker(t, []Server{g.server()}, func(ctx context.Context, j *Job) ([]byte, error) {
		return []byte(j.Function), nil
	}, &results{})
	w.SetFunctions([]string{"image-build:debian", "image-upload:0001"})
	runWorker(t, w)
	g.waitAdmin(t, map[string]string{"image-build:debian": "0 0 1", "image-upload:0001": "0 0 1"})

	// gearmand keeps listing a function with 0 workers after CANT_DO.
	w.SetFunctions([]string{"image-build:debian", "image-upload:0002"})
	g.waitAdmin(t, map[string]string{"image-build:debian": "0 0 1", "image-upload:0001": "0 0 0", "image-upload:0002": "0 0 1"})
	r := wait(t, g.client(t, "-f", "image-upload:0002", "x"))
	if r.exit != 0 || r.stdout != "image-upload:0002" {
		t.Errorf("job of an added function: exit %d, stdout %q, stderr %q", r.exit, r.stdout, r.stderr)
	}
	testenv.WaitFor(t, waitTimeout, "2 functions registered", func() bool { return w.Status().Servers[0].Registered == 2 })

	w.SetFunctions(nil)
	g.waitAdmin(t, map[string]string{"image-build:debian": "0 0 0", "image-upload:0002": "0 0 0"})
}

// TestGearmanServerKilledMidJob: gearmand dies (SIGKILL) and comes back on the same
// port while a job runs. The worker reconnects and registers again; the interrupted
// handler still finishes, and its result is reported undelivered.
func TestGearmanServerKilledMidJob(t *testing.T) {
	g := newRealServer(t)
	gt, res := newGate(), &results{}
	w := realWorker(t, []Server{g.server()}, gt.handler, res)
	w.SetFunctions([]string{"slow"})
	runWorker(t, w)
	g.waitAdmin(t, map[string]string{"slow": "0 0 1"})

	first := g.client(t, "-f", "slow", "one")
	gt.waitStarted(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := g.Kill(); err != nil {
		t.Fatal(err)
	}
	r := wait(t, first)
	t.Logf("client of the killed server: exit %d, stdout %q, stderr %q", r.exit, r.stdout, r.stderr)
	if err := g.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// The restarted server knows nothing; the worker registers again.
	g.waitAdmin(t, map[string]string{"slow": "0 0 1"})
	second := g.client(t, "-f", "slow", "two")
	if j := gt.waitStarted(t); string(j.Data) != "two" {
		t.Fatalf("handler started for %q, want two", j.Data)
	}
	gt.finish("two", result{data: []byte("done two")})
	if r := wait(t, second); r.exit != 0 || r.stdout != "done two" {
		t.Errorf("job after the restart: exit %d, stdout %q, stderr %q", r.exit, r.stdout, r.stderr)
	}

	gt.finish("one", result{data: []byte("done one")})
	all := res.wait(t, 2)
	var one JobResult
	for _, jr := range all {
		if string(jr.Data) == "one" {
			one = jr
		}
	}
	if one.Delivered || string(one.Result) != "done one" {
		t.Errorf("OnJob of the interrupted job: %+v; want its result, undelivered", one)
	}
	st := w.Status()
	if !st.Servers[0].Connected || st.Servers[0].LastError == "" || len(st.Running) != 0 {
		t.Errorf("status after the restart: %+v", st)
	}
	t.Logf("last error: %s", st.Servers[0].LastError)
}

// TestGearmanSameJobRequeued: the worker's connection drops (a proxy cuts it) while a
// job runs; gearmand requeues the job with the same handle and unique, the worker gets
// it again on its new connection, and answers it with the running handler's result
// instead of running the handler twice.
func TestGearmanSameJobRequeued(t *testing.T) {
	g := newRealServer(t)
	proxy := testenv.NewProxy(t, g.Addr)
	host, port, _ := strings.Cut(proxy.Addr, ":")
	pport, _ := strconv.Atoi(port)
	gt, res := newGate(), &results{}
	w := realWorker(t, []Server{{Host: host, Port: pport}}, gt.handler, res)
	w.SetFunctions([]string{"image-build:debian"})
	runWorker(t, w)
	g.waitAdmin(t, map[string]string{"image-build:debian": "0 0 1"})

	client := g.client(t, "-u", "KEY", "-f", "image-build:debian", "build")
	first := gt.waitStarted(t)
	if first.Unique != "KEY" {
		t.Errorf("unique %q, want KEY", first.Unique)
	}
	proxy.Down()
	// gearmand takes the job back from the lost worker.
	g.waitAdmin(t, map[string]string{"image-build:debian": "1 0 0"})
	if err := proxy.Up(); err != nil {
		t.Fatal(err)
	}
	g.waitAdmin(t, map[string]string{"image-build:debian": "1 1 1"})
	testenv.WaitFor(t, waitTimeout, "the requeued job waiting for the running one", func() bool { return len(w.Status().Running) == 2 })
	if n := gt.count("build"); n != 1 {
		t.Fatalf("handler called %d times, want once", n)
	}

	gt.finish("build", result{data: []byte("0000000042")})
	if r := wait(t, client); r.exit != 0 || r.stdout != "0000000042" {
		t.Errorf("client: exit %d, stdout %q, stderr %q", r.exit, r.stdout, r.stderr)
	}
	all := res.wait(t, 2)
	if all[0].Delivered == all[1].Delivered || all[0].Handle != all[1].Handle {
		t.Errorf("want the first assignment undelivered and the second delivered, same handle: %v", res)
	}
	t.Logf("handles: %s, %s", all[0].Handle, all[1].Handle)
}

// TestGearmanUnserved: the job of a function nobody serves, which Unserved calls bad,
// is failed with its message after UnservedAfter; one it does not call bad waits, and
// the client's -t ends it.
func TestGearmanUnserved(t *testing.T) {
	g := newRealServer(t)
	res := &results{}
	const after = 500 * time.Millisecond
	w := New(Options{
		Servers: []Server{g.server()},
		Handler: func(ctx context.Context, j *Job) ([]byte, error) {
			return nil, errors.New("handler called for " + j.Function)
		},
		Logger:     testLogger(t),
		MinBackoff: 20 * time.Millisecond,
		MaxBackoff: 200 * time.Millisecond,
		OnJob:      res.add,
		Unserved: func(fn string) (string, bool) {
			if build, ok := strings.CutPrefix(fn, "image-upload:"); ok {
				return "no build " + build + " on any builder", true
			}
			return "", false
		},
		UnservedAfter: after,
		UnservedCheck: 50 * time.Millisecond,
	})
	w.SetFunctions([]string{"image-build:debian"})
	runWorker(t, w)
	g.waitAdmin(t, map[string]string{"image-build:debian": "0 0 1"})

	bad := g.client(t, "-f", "image-upload:0099", "provider")
	waiting := g.client(t, "-t", "1500", "-f", "image-build:ubuntu", "x")

	r := wait(t, bad)
	t.Logf("unserved: exit %d, stdout %q, stderr %q, after %s", r.exit, r.stdout, r.stderr, r.took)
	if r.exit != 1 || r.stdout != "no build 0099 on any builder\n" || r.stderr != "Job failed\n" {
		t.Errorf("unserved job: exit %d, stdout %q, stderr %q; want 1, the message, Job failed", r.exit, r.stdout, r.stderr)
	}
	if r.took < after {
		t.Errorf("unserved job failed after %s, before UnservedAfter %s", r.took, after)
	}
	// Once none are queued the function is given up again.
	g.waitAdmin(t, map[string]string{"image-upload:0099": "0 0 0"})

	r = wait(t, waiting)
	t.Logf("not unserved, -t 1500: exit %d, stdout %q, stderr %q, after %s", r.exit, r.stdout, r.stderr, r.took)
	if !strings.Contains(r.stderr, "GEARMAN_TIMEOUT") {
		t.Errorf("job left waiting: exit %d, stdout %q, stderr %q; want the client's timeout", r.exit, r.stdout, r.stderr)
	}
	// The client gave up, but its job stays queued, and nobody answered it.
	if st := g.adminStatus(t); st["image-build:ubuntu"] != "1 0 0" {
		t.Errorf("gearadmin --status image-build:ubuntu = %q, want 1 0 0", st["image-build:ubuntu"])
	}
	all := res.get()
	if len(all) != 1 || !all[0].Unserved || !all[0].Delivered || all[0].Function != "image-upload:0099" {
		t.Errorf("OnJob: %v; want only the unserved job, delivered", res)
	}
}

// submitBackground queues a background job of each function on the server, with
// SUBMIT_JOB_BG packets on one connection, as any client may.
func submitBackground(t *testing.T, g *realServer, functions []string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", g.Addr, waitTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(time.Minute))
	const submitJobBg = 18
	var out bytes.Buffer
	for i, f := range functions {
		data := f + "\x00unique-" + strconv.Itoa(i) + "\x00"
		out.WriteString("\x00REQ")
		out.Write(binary.BigEndian.AppendUint32(nil, submitJobBg))
		out.Write(binary.BigEndian.AppendUint32(nil, uint32(len(data))))
		out.WriteString(data)
	}
	if _, err := conn.Write(out.Bytes()); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(conn)
	for range functions {
		p, err := ReadPacket(r)
		if err != nil || p.Type != JobCreated {
			t.Fatalf("submitting background jobs: %v, %v; want JOB_CREATED", p, err)
		}
	}
}

// TestGearmanUnservedMadeUpNames: thousands of queued jobs of made-up functions, with
// and without the worker's prefix, one with a tab in its name, cost at most two
// verdicts per candidate name and none for the others; every candidate's job is
// answered, the others are left queued for whoever serves them.
func TestGearmanUnservedMadeUpNames(t *testing.T) {
	g := newRealServer(t)
	var mu sync.Mutex
	judged := map[string]int{}
	w := New(Options{
		Servers:    []Server{g.server()},
		Handler:    func(ctx context.Context, j *Job) ([]byte, error) { return nil, errors.New("handler called") },
		Logger:     testLogger(t),
		MaxJobs:    32,
		MinBackoff: 20 * time.Millisecond,
		MaxBackoff: 200 * time.Millisecond,
		Unserved: func(fn string) (string, bool) {
			mu.Lock()
			defer mu.Unlock()
			judged[fn]++
			return "no such build", true
		},
		UnservedCandidate: func(fn string) bool { return strings.HasPrefix(fn, "image-upload:") },
		UnservedAfter:     300 * time.Millisecond,
		UnservedCheck:     50 * time.Millisecond,
	})
	const n = 1500
	var fns []string
	for i := range n {
		fns = append(fns, fmt.Sprintf("image-upload:%05d", i), fmt.Sprintf("made-up:%05d", i))
	}
	fns = append(fns, "image-upload:with\ttab")
	submitBackground(t, g, fns)
	runWorker(t, w)

	// gearadmin --status: its lines with the tab in a name do not read as a function's.
	testenv.WaitFor(t, 2*time.Minute, "every image-upload job answered", func() bool {
		st := g.adminStatus(t)
		for i := range n {
			if !strings.HasPrefix(st[fmt.Sprintf("image-upload:%05d", i)], "0 0 ") {
				return false
			}
		}
		return true
	})
	st := g.adminStatus(t)
	for i := range n {
		if f := fmt.Sprintf("made-up:%05d", i); st[f] != "1 0 0" {
			t.Fatalf("gearadmin --status %s = %q, want its job queued and no worker", f, st[f])
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for f, calls := range judged {
		if !strings.HasPrefix(f, "image-upload:") || strings.Contains(f, "\t") {
			t.Errorf("judged %q, which is no candidate", f)
		}
		if calls > 2 {
			t.Errorf("judged %s %d times, want at most 2", f, calls)
		}
	}
}

// TestGearmanJobLoggedOnArrival: a job is logged with its function, handle and
// unique as soon as it is assigned, while its handler still runs.
func TestGearmanJobLoggedOnArrival(t *testing.T) {
	g := newRealServer(t)
	logs := &testenv.Buffer{}
	release := make(chan struct{})
	w := New(Options{
		Servers: []Server{g.server()},
		Logger:  slog.New(slog.NewTextHandler(logs, nil)),
		Handler: func(ctx context.Context, j *Job) ([]byte, error) {
			<-release
			return []byte("done"), nil
		},
	})
	w.SetFunctions([]string{"slow"})
	runWorker(t, w)
	g.waitAdmin(t, map[string]string{"slow": "0 0 1"})
	done := g.client(t, "-u", "nightly-7", "-f", "slow", "data")
	var line string
	deadline := time.Now().Add(waitTimeout)
	for line == "" {
		for l := range strings.SplitSeq(logs.String(), "\n") {
			if strings.Contains(l, `msg="gearman job received"`) {
				line = l
			}
		}
		if line == "" && time.Now().After(deadline) {
			close(release)
			t.Fatalf("no log line of the job's arrival while it runs:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(release)
	for _, want := range []string{"function=slow", "handle=H:", "unique=nightly-7"} {
		if !strings.Contains(line, want) {
			t.Errorf("the arrival's log line %q does not say %s", line, want)
		}
	}
	if r := wait(t, done); r.exit != 0 || !strings.Contains(r.stdout, "done") {
		t.Errorf("gearman -f slow: exit %d, stdout %q", r.exit, r.stdout)
	}
}
