package gearman

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
)

// fakeServer is an in-process gearman server that a test drives packet by packet, to
// see exactly what a worker sends and when. Connections that start with text get the
// admin protocol: `status` answers with the test's lines.
type fakeServer struct {
	t     *testing.T
	ln    net.Listener
	conns chan *fakeConn

	mu     sync.Mutex
	status string // admin status lines, each ending in \n, without the final "."
}

// fakeConn is one worker connection to a fakeServer.
type fakeConn struct {
	t    *testing.T
	c    net.Conn
	pkts chan Packet
	eof  chan error // why reading ended
}

// waitTimeout bounds every wait for something a worker should do promptly.
const waitTimeout = 10 * time.Second

func newFakeServer(t *testing.T) *fakeServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeServer{t: t, ln: ln, conns: make(chan *fakeConn, 16)}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var open []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			open = append(open, c)
			mu.Unlock()
			wg.Go(func() { f.serve(c) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range open {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return f
}

func (f *fakeServer) server() Server {
	a := f.ln.Addr().(*net.TCPAddr)
	return Server{Host: "127.0.0.1", Port: a.Port}
}

func (f *fakeServer) setStatus(lines ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.status = ""
	for _, l := range lines {
		f.status += l + "\n"
	}
}

// serve tells admin connections from worker connections by their first byte.
func (f *fakeServer) serve(c net.Conn) {
	br := bufio.NewReader(c)
	first, err := br.Peek(1)
	if err != nil {
		c.Close()
		return
	}
	if first[0] != 0 {
		defer c.Close()
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			if strings.TrimSpace(line) != "status" {
				io.WriteString(c, "ERR UNKNOWN_COMMAND\n")
				continue
			}
			f.mu.Lock()
			answer := f.status + ".\n"
			f.mu.Unlock()
			if _, err := io.WriteString(c, answer); err != nil {
				return
			}
		}
	}
	fc := &fakeConn{t: f.t, c: c, pkts: make(chan Packet, 100), eof: make(chan error, 1)}
	f.conns <- fc
	for {
		p, err := ReadPacket(br)
		if err != nil {
			fc.eof <- err
			close(fc.pkts)
			return
		}
		fc.pkts <- p
	}
}

// accept waits for the worker's next connection.
func (f *fakeServer) accept() *fakeConn {
	f.t.Helper()
	select {
	case c := <-f.conns:
		return c
	case <-time.After(waitTimeout):
		f.t.Fatalf("no worker connected within %s", waitTimeout)
		return nil
	}
}

// next is the worker's next packet.
func (c *fakeConn) next() Packet {
	c.t.Helper()
	select {
	case p, ok := <-c.pkts:
		if !ok {
			c.t.Fatalf("worker closed the connection: %v", <-c.eof)
		}
		return p
	case <-time.After(waitTimeout):
		c.t.Fatalf("worker sent nothing within %s", waitTimeout)
		return Packet{}
	}
}

// expect checks that the worker's next packets are these, in this order.
func (c *fakeConn) expect(want ...Packet) {
	c.t.Helper()
	for _, w := range want {
		if got := c.next(); got.String() != w.String() {
			c.t.Fatalf("worker sent %v, want %v", got, w)
		}
	}
}

// expectAny checks that the worker's next packets are these, in any order: for
// packets from the loop and from a job, which race.
func (c *fakeConn) expectAny(want ...Packet) {
	c.t.Helper()
	var got, exp []string
	for _, w := range want {
		got = append(got, c.next().String())
		exp = append(exp, w.String())
	}
	slices.Sort(got)
	slices.Sort(exp)
	if !slices.Equal(got, exp) {
		c.t.Fatalf("worker sent %q, want %q in any order", got, exp)
	}
}

// expectClosed waits until the worker closes the connection, skipping what it sends.
func (c *fakeConn) expectClosed() {
	c.t.Helper()
	deadline := time.After(waitTimeout)
	for {
		select {
		case _, ok := <-c.pkts:
			if !ok {
				return
			}
		case <-deadline:
			c.t.Fatalf("worker kept the connection open for %s", waitTimeout)
		}
	}
}

func (c *fakeConn) send(p Packet) {
	c.t.Helper()
	if err := writePacket(c.c, p); err != nil {
		c.t.Fatalf("send %v: %v", p, err)
	}
}

// testLogger logs to the test's output.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// runWorker starts w.Run and, when the test ends, stops it and waits for it.
func runWorker(t *testing.T, w *Worker) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(waitTimeout):
			t.Errorf("Run did not return within %s of its context ending", waitTimeout)
		}
	})
}

// gate is a handler whose calls block until the test finishes them, by job data.
type gate struct {
	started  chan *Job
	mu       sync.Mutex
	calls    map[string]int         // by data
	releases map[string]chan result // by data
}

type result struct {
	data []byte
	err  error
}

func newGate() *gate {
	return &gate{started: make(chan *Job, 16), calls: map[string]int{}, releases: map[string]chan result{}}
}

func (g *gate) release(data string) chan result {
	g.mu.Lock()
	defer g.mu.Unlock()
	ch, ok := g.releases[data]
	if !ok {
		ch = make(chan result, 16)
		g.releases[data] = ch
	}
	return ch
}

// finish makes the handler of the job with this data return r.
func (g *gate) finish(data string, r result) { g.release(data) <- r }

func (g *gate) handler(ctx context.Context, j *Job) ([]byte, error) {
	g.mu.Lock()
	g.calls[string(j.Data)]++
	g.mu.Unlock()
	g.started <- j
	select {
	case r := <-g.release(string(j.Data)):
		return r.data, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (g *gate) count(data string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.calls[data]
}

// waitStarted returns the next job whose handler started.
func (g *gate) waitStarted(t *testing.T) *Job {
	t.Helper()
	select {
	case j := <-g.started:
		return j
	case <-time.After(waitTimeout):
		t.Fatalf("no handler started within %s", waitTimeout)
		return nil
	}
}

// results collects OnJob calls.
type results struct {
	mu  sync.Mutex
	all []JobResult
}

func (r *results) add(jr JobResult) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all = append(r.all, jr)
}

func (r *results) get() []JobResult {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]JobResult(nil), r.all...)
}

// wait returns the results once there are n.
func (r *results) wait(t *testing.T, n int) []JobResult {
	t.Helper()
	testenv.WaitFor(t, waitTimeout, strconv.Itoa(n)+" job results", func() bool { return len(r.get()) >= n })
	return r.get()
}

func (r *results) String() string {
	var b strings.Builder
	for _, jr := range r.get() {
		fmt.Fprintf(&b, "%s %s %q delivered=%v err=%v; ", jr.Function, jr.Handle, jr.Result, jr.Delivered, jr.Err)
	}
	return b.String()
}
