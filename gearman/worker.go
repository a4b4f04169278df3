package gearman

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/defaults"
	"github.com/nodepool-builder/nodepool-builder/internal/reconnect"
)

// DefaultPort is gearmand's port, used when a Server's Port is 0.
const DefaultPort = 4730

// Server is the address of a gearman job server.
type Server struct {
	Host string
	Port int // 0 means DefaultPort
}

// String is host:port, with brackets around an IPv6 host.
func (s Server) String() string {
	port := s.Port
	if port == 0 {
		port = DefaultPort
	}
	return net.JoinHostPort(s.Host, strconv.Itoa(port))
}

// Options configure a Worker. The zero value of each field but Servers and Handler works.
type Options struct {
	// Servers are the job servers to serve; the worker keeps one connection to each.
	Servers []Server
	// ClientID is sent as SET_CLIENT_ID on every connection, so gearadmin --workers
	// shows which host a worker is.
	ClientID string
	// Handler does the jobs.
	Handler Handler
	// Logger receives connection events; nil means slog.Default().
	Logger *slog.Logger
	// MaxJobs is how many jobs run at once across all connections; default 4. The
	// worker grabs a job only while below it, so other workers get the rest.
	MaxJobs int
	// MinBackoff and MaxBackoff bound the wait before redialling a server, which
	// doubles with jitter while it keeps failing; defaults 1s and 60s.
	MinBackoff, MaxBackoff time.Duration
	// Unserved, when not nil, lets the worker answer jobs of functions that nobody
	// serves, so a client calling a function that cannot exist (the upload of an unknown
	// build) gets a failure instead of waiting forever. It is asked about each function,
	// not in this worker's set, that has queued jobs and no worker; when it says bad, and
	// the function stays so for UnservedAfter, the worker registers the function on that
	// server and fails its jobs with message (the handler is not called), then
	// unregisters it once none are queued.
	Unserved func(function string) (message string, bad bool)
	// UnservedCandidate, when not nil, tells without I/O whether Unserved may judge a
	// function: the names of the functions this worker's kind serves, well formed.
	// Jobs of other functions are left to whoever serves them. Unserved is asked about
	// at most maxJudged functions per status read, the rest at the reads after.
	UnservedCandidate func(function string) bool
	// UnservedAfter is how long a function must stay unserved before its jobs are
	// failed; default 30s.
	UnservedAfter time.Duration
	// UnservedCheck is how often each server's admin status is read; default 5s.
	UnservedCheck time.Duration
	// PingIdle and PingTimeout find a connection that went dead without a word: one on
	// which nothing arrived for PingIdle gets an ECHO_REQ, and is dialled again when
	// nothing answers within PingTimeout; defaults 60s and 30s. A worker asleep waiting
	// for a NOOP hears nothing for hours, and TCP keepalive alone takes the kernel's time
	// (often over two hours) to notice a server that vanished.
	PingIdle, PingTimeout time.Duration
	// OnJob, when not nil, is called after each job is answered, or could not be, for
	// status pages and logs. It runs on the job's goroutine.
	OnJob func(JobResult)
}

// Defaults of Options and the timings of a connection.
const (
	defaultMaxJobs       = 4
	defaultMinBackoff    = time.Second
	defaultMaxBackoff    = time.Minute
	defaultUnservedAfter = 30 * time.Second
	defaultUnservedCheck = 5 * time.Second
	defaultPingIdle      = 60 * time.Second
	defaultPingTimeout   = 30 * time.Second

	// dialTimeout bounds a connection attempt, so a blackholed server is retried.
	dialTimeout = 10 * time.Second
	// writeTimeout bounds a write; a server that takes nothing for that long is dead.
	writeTimeout = 10 * time.Second
	// maxFunctionName is gearmand's limit on a function name.
	maxFunctionName = 512
)

// Worker serves gearman jobs from a set of job servers. Create it with New, set its
// functions with SetFunctions, and serve with Run.
type Worker struct {
	opts Options
	log  *slog.Logger

	running atomic.Bool
	jobWG   sync.WaitGroup // every job's goroutine

	mu      sync.Mutex
	funcs   map[string]bool
	conns   map[*serverConn]bool
	servers []ServerStatus
	busy    int // job slots taken: grabs outstanding and jobs running
	flights map[jobKey]*flight
	jobs    map[*jobRun]bool
	served  int
	failed  int
}

// New makes a worker with no functions; it does nothing until Run.
func New(opts Options) *Worker {
	opts.MaxJobs = defaults.Positive(opts.MaxJobs, defaultMaxJobs)
	opts.MinBackoff = defaults.Positive(opts.MinBackoff, defaultMinBackoff)
	opts.MaxBackoff = defaults.Positive(opts.MaxBackoff, defaultMaxBackoff)
	opts.MaxBackoff = max(opts.MaxBackoff, opts.MinBackoff)
	opts.UnservedAfter = defaults.Positive(opts.UnservedAfter, defaultUnservedAfter)
	opts.UnservedCheck = defaults.Positive(opts.UnservedCheck, defaultUnservedCheck)
	opts.PingIdle = defaults.Positive(opts.PingIdle, defaultPingIdle)
	opts.PingTimeout = defaults.Positive(opts.PingTimeout, defaultPingTimeout)
	opts.Servers = slices.Clone(opts.Servers)
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	w := &Worker{
		opts:    opts,
		log:     log,
		funcs:   map[string]bool{},
		conns:   map[*serverConn]bool{},
		flights: map[jobKey]*flight{},
		jobs:    map[*jobRun]bool{},
	}
	for _, s := range opts.Servers {
		w.servers = append(w.servers, ServerStatus{Address: s.String()})
	}
	return w
}

// SetFunctions sets the functions this worker can do. It may be called before Run and
// at any time, from any goroutine. New names are registered (CAN_DO) on every connected
// server at once; removed names are unregistered (CANT_DO), but on a connection that
// holds a job of that function only after the job is answered, because gearmand
// requeues a job whose function its worker gives up and rejects the late answer.
// A name that gearmand could not take (empty, over 512 bytes, with a space or a
// control byte, which would break the admin status) is logged and left out.
func (w *Worker) SetFunctions(names []string) {
	set := make(map[string]bool, len(names))
	for _, n := range names {
		if err := checkFunction(n); err != nil {
			w.log.Error("ignoring a gearman function", "function", n, "error", err)
			continue
		}
		set[n] = true
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if mapsEqual(set, w.funcs) {
		return
	}
	w.funcs = set
	w.kickAll()
}

// checkFunction says why gearmand could not take a function name, if it could not.
func checkFunction(name string) error {
	switch {
	case name == "":
		return errors.New("empty function name")
	case len(name) > maxFunctionName:
		return errors.New("function name longer than 512 bytes")
	case strings.ContainsFunc(name, func(r rune) bool { return r <= ' ' || r == 0x7f }):
		// A tab or a newline breaks the lines of the admin status for every client of
		// gearmand; the other control bytes reach the terminals that show them.
		return errors.New("function name with a space or a control byte")
	}
	return nil
}

func mapsEqual(a, b map[string]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}

// hasFunction tells whether the function is in the worker's set now.
func (w *Worker) hasFunction(name string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.funcs[name]
}

// functionSet is a copy of the worker's set.
func (w *Worker) functionSet() map[string]bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]bool, len(w.funcs))
	for k := range w.funcs {
		out[k] = true
	}
	return out
}

// kickAll wakes every connection to look at the function set and the free job slots
// again. w.mu must be held.
func (w *Worker) kickAll() {
	for s := range w.conns {
		s.kick()
	}
}

// reserveSlot takes a job slot for a grab, if one is free.
func (w *Worker) reserveSlot() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.busy >= w.opts.MaxJobs {
		return false
	}
	w.busy++
	return true
}

// releaseSlot frees a job slot and wakes the connections that wait for one.
func (w *Worker) releaseSlot() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.busy--
	w.kickAll()
}

// Run connects to every server, each on its own, and serves until ctx ends. It
// redials a lost server with backoff and registers every function again on each new
// connection, since a restarted gearmand knows nothing. When ctx ends it closes the
// connections, so gearmand hands their unanswered jobs to other workers, then ends
// the handlers' context (it carries ctx's values) and waits for them to return. It
// returns nil after ctx ends, or an error at once when the worker is already running.
func (w *Worker) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return errors.New("gearman worker: Run called while running")
	}
	defer w.running.Store(false)
	// Handlers that saw ctx end at once would race the closing connections to answer
	// "context canceled", and the client would get that failure instead of another
	// worker doing its job.
	jobCtx, stopJobs := context.WithCancel(context.WithoutCancel(ctx))
	defer stopJobs()
	var wg sync.WaitGroup
	for i := range w.opts.Servers {
		wg.Go(func() { w.serve(ctx, jobCtx, i) })
	}
	<-ctx.Done()
	wg.Wait()
	stopJobs()
	w.jobWG.Wait()
	return nil
}

// serve keeps a connection to server i until ctx ends; its jobs get jobCtx.
func (w *Worker) serve(ctx, jobCtx context.Context, i int) {
	addr := w.opts.Servers[i].String()
	streak := reconnect.New(w.opts.MinBackoff, w.opts.MaxBackoff)
	// The first connection of a streak is logged too, so the recovery shows;
	// then one every LogEvery of the streak while it goes on.
	var (
		connLogged  bool
		lastConnLog time.Time
	)
	for ctx.Err() == nil {
		var lasted time.Duration
		msg := "cannot connect to gearman server"
		conn, err := w.dial(ctx, addr)
		if err == nil {
			started := time.Now()
			err = w.runConn(ctx, jobCtx, i, addr, conn, func(registered int) {
				w.setServer(i, true, nil)
				if streak.Failures() == 0 || !connLogged || time.Since(lastConnLog) >= streak.LogEvery {
					w.log.Info("connected to gearman server", "address", addr, "functions", registered)
					connLogged, lastConnLog = true, time.Now()
				}
			})
			lasted, msg = time.Since(started), "lost gearman server"
		}
		if ctx.Err() != nil {
			break
		}
		wait, logIt := streak.Failed(lasted)
		if streak.Failures() == 1 {
			connLogged = false // a new streak: its first connection is logged
		}
		w.setServer(i, false, err)
		if logIt {
			w.log.Warn(msg, "address", addr, "failures", streak.Failures(), "error", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
	w.setServer(i, false, nil)
}

// dial connects with a timeout and TCP keepalive.
func (w *Worker) dial(ctx context.Context, addr string) (net.Conn, error) {
	d := net.Dialer{
		Timeout:         dialTimeout,
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: 30 * time.Second, Interval: 10 * time.Second, Count: 3},
	}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("gearman %s: %w", addr, err)
	}
	return conn, nil
}

// setServer records a server's state for Status.
func (w *Worker) setServer(i int, connected bool, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := &w.servers[i]
	if s.Connected != connected || s.Since.IsZero() {
		s.Connected, s.Since = connected, time.Now()
	}
	if err != nil {
		s.LastError = err.Error()
	}
	if !connected {
		s.Registered = 0
	}
}

// setRegistered records how many functions are registered on server i.
func (w *Worker) setRegistered(i, n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.servers[i].Registered = n
}

// Status is a snapshot of a worker for status pages and logs.
type Status struct {
	Servers   []ServerStatus
	Functions []string // sorted
	Running   []RunningJob
	// Served and Failed count the jobs answered with success and with failure, or that
	// could not be answered, since New.
	Served, Failed int
}

// ServerStatus is the state of the connection to one server.
type ServerStatus struct {
	Address   string
	Connected bool
	Since     time.Time // when it entered the current state
	LastError string    // the last failure, kept after a reconnect
	// Registered is how many functions are registered on the connection, unserved
	// functions being answered included.
	Registered int
}

// RunningJob is a job being done, or waiting for the same job already being done.
type RunningJob struct {
	Server, Function, Handle, Unique string
	Started                          time.Time
}

// Status returns a snapshot of the worker.
func (w *Worker) Status() Status {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := Status{
		Servers: slices.Clone(w.servers),
		Served:  w.served,
		Failed:  w.failed,
	}
	for f := range w.funcs {
		st.Functions = append(st.Functions, f)
	}
	slices.Sort(st.Functions)
	for r := range w.jobs {
		st.Running = append(st.Running, RunningJob{
			Server: r.server, Function: r.job.Function, Handle: r.job.Handle, Unique: r.job.Unique, Started: r.started,
		})
	}
	slices.SortFunc(st.Running, func(a, b RunningJob) int {
		if c := a.Started.Compare(b.Started); c != 0 {
			return c
		}
		return strings.Compare(a.Handle, b.Handle)
	})
	return st
}
