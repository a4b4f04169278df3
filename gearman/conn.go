package gearman

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"
)

// serverConn is one connection to a server, from dial to loss. Its run loop owns the
// protocol state; job goroutines and Job.Status write through send, which serializes
// whole packets, and tell the loop when they answered a job.
type serverConn struct {
	w     *Worker
	index int // in w.opts.Servers
	addr  string
	conn  net.Conn
	// jobCtx is the handlers' context: it ends only after every connection is closed.
	jobCtx context.Context

	wmu sync.Mutex // one writer at a time, so packets never interleave

	done      chan struct{}      // closed when the connection ends
	cancel    context.CancelFunc // ends the context of the connection's own goroutines
	closeOnce sync.Once
	causeMu   sync.Mutex
	cause     error // why it ended; the first failure wins

	kickc     chan struct{}          // the function set or the free slots changed
	answered  chan string            // handle of a job answered (or not) by its goroutine
	unservedc chan map[string]string // unserved functions to answer, from the watcher
	in        chan Packet            // from the reader
	goroutine sync.WaitGroup         // the reader and the watcher

	// Owned by the run loop.
	state     grabState
	slot      bool              // a job slot is reserved for the outstanding grab
	noopLater bool              // a NOOP came while a grab was outstanding
	reg       map[string]bool   // functions registered on the connection
	held      map[string]string // handle -> function of jobs assigned, not yet answered
	unWant    map[string]string // unserved functions the watcher wants answered -> message
	unMsg     map[string]string // unserved functions registered -> message, until CANT_DO
	lastRead  time.Time         // when the last packet arrived
	echoSent  time.Time         // when the unanswered ECHO_REQ went, or zero
}

// grabState is where a connection is in the grab cycle.
type grabState int

const (
	// idle: no grab outstanding and not asleep; it grabs when it has functions and a
	// job slot is free.
	idle grabState = iota
	// grabbing: GRAB_JOB_UNIQ sent, NO_JOB or JOB_ASSIGN_UNIQ to come.
	grabbing
	// sleeping: PRE_SLEEP sent; the server sends NOOP when a job comes.
	sleeping
)

// errClosed is what sending on an ended connection gives.
var errClosed = errors.New("connection closed")

// runConn serves one connection until it fails or ctx ends, and returns why it
// ended. Jobs get jobCtx. up is called once the functions are registered.
func (w *Worker) runConn(ctx, jobCtx context.Context, i int, addr string, conn net.Conn, up func(registered int)) error {
	s := &serverConn{
		w:         w,
		index:     i,
		addr:      addr,
		conn:      conn,
		jobCtx:    jobCtx,
		done:      make(chan struct{}),
		kickc:     make(chan struct{}, 1),
		answered:  make(chan string),
		unservedc: make(chan map[string]string, 1),
		in:        make(chan Packet),
		reg:       map[string]bool{},
		held:      map[string]string{},
		unWant:    map[string]string{},
		unMsg:     map[string]string{},
		lastRead:  time.Now(),
	}
	w.mu.Lock()
	w.conns[s] = true
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		delete(w.conns, s)
		w.mu.Unlock()
	}()
	cctx, cancel := context.WithCancel(ctx)
	s.cancel = cancel
	err := s.run(ctx, cctx, up)
	s.close(err)
	s.goroutine.Wait()
	if s.slot {
		s.slot = false
		w.releaseSlot()
	}
	return s.err()
}

// run is the connection's loop until ctx ends; cctx ends with the connection, for
// the connection's own goroutines.
func (s *serverConn) run(ctx, cctx context.Context, up func(int)) error {
	s.goroutine.Go(s.read)
	if s.w.opts.Unserved != nil {
		s.goroutine.Go(func() { s.watchUnserved(cctx) })
	}
	if id := s.w.opts.ClientID; id != "" {
		if err := s.send(Req(SetClientID, id)); err != nil {
			return err
		}
	}
	if err := s.update(); err != nil {
		return err
	}
	up(len(s.reg))

	every := min(s.w.opts.PingIdle, s.w.opts.PingTimeout) / 4
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		var err error
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.done:
			return s.err()
		case p := <-s.in:
			s.lastRead, s.echoSent = time.Now(), time.Time{}
			err = s.handle(p)
		case <-s.kickc:
			err = s.update()
		case h := <-s.answered:
			delete(s.held, h)
			err = s.update()
		case want := <-s.unservedc:
			s.unWant = want
			err = s.update()
		case now := <-tick.C:
			err = s.ping(now)
		}
		if err != nil {
			return err
		}
	}
}

// read passes the server's packets to the loop until the connection fails.
func (s *serverConn) read() {
	br := bufio.NewReader(s.conn)
	for {
		p, err := ReadPacket(br)
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("server closed the connection")
			}
			s.close(fmt.Errorf("gearman %s: read: %w", s.addr, err))
			return
		}
		select {
		case s.in <- p:
		case <-s.done:
			return
		}
	}
}

// close ends the connection for the given reason, unless it ended already.
func (s *serverConn) close(cause error) {
	s.causeMu.Lock()
	if s.cause == nil {
		s.cause = cause
	}
	s.causeMu.Unlock()
	s.closeOnce.Do(func() {
		s.conn.Close()
		close(s.done)
		s.cancel()
	})
}

// err is why the connection ended.
func (s *serverConn) err() error {
	s.causeMu.Lock()
	defer s.causeMu.Unlock()
	if s.cause == nil {
		return fmt.Errorf("gearman %s: %w", s.addr, errClosed)
	}
	return s.cause
}

// kick wakes the loop to look at the function set and the job slots; kicks coalesce.
func (s *serverConn) kick() {
	select {
	case s.kickc <- struct{}{}:
	default:
	}
}

// send writes the packets in one write. A failed write ends the connection.
func (s *serverConn) send(pkts ...Packet) error {
	var buf []byte
	for _, p := range pkts {
		b, err := p.MarshalBinary()
		if err != nil {
			return fmt.Errorf("gearman %s: %w", s.addr, err)
		}
		buf = append(buf, b...)
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	select {
	case <-s.done:
		return fmt.Errorf("gearman %s: %w", s.addr, errClosed)
	default:
	}
	s.conn.SetWriteDeadline(time.Now().Add(writeTimeout))
	if _, err := s.conn.Write(buf); err != nil {
		err = fmt.Errorf("gearman %s: write %s: %w", s.addr, pkts[0].Type, err)
		s.close(err)
		return err
	}
	return nil
}

// ping sends ECHO_REQ on a connection quiet for PingIdle, and gives up on one whose
// ECHO_REQ went unanswered for PingTimeout.
func (s *serverConn) ping(now time.Time) error {
	if !s.echoSent.IsZero() {
		if now.Sub(s.echoSent) >= s.w.opts.PingTimeout {
			return fmt.Errorf("gearman %s: no answer to ECHO_REQ within %s", s.addr, s.w.opts.PingTimeout)
		}
		return nil
	}
	if now.Sub(s.lastRead) < s.w.opts.PingIdle {
		return nil
	}
	s.echoSent = now
	return s.send(Req(EchoReq, "ping"))
}

// handle acts on a packet from the server.
func (s *serverConn) handle(p Packet) error {
	if !p.Response {
		return fmt.Errorf("gearman %s: server sent a request packet %s", s.addr, p.Type)
	}
	switch p.Type {
	case Noop:
		if s.state == grabbing {
			// The grab may have been answered before the job that woke us came.
			s.noopLater = true
			return nil
		}
		s.state = idle
		return s.tryGrab()
	case NoJob:
		if s.state != grabbing {
			return fmt.Errorf("gearman %s: NO_JOB without GRAB_JOB", s.addr)
		}
		s.state = idle
		s.releaseSlot()
		if _, err := s.sync(); err != nil { // unregistrations held back during the grab
			return err
		}
		if s.noopLater || len(s.reg) == 0 {
			s.noopLater = false
			return s.tryGrab()
		}
		// The server answers PRE_SLEEP with NOOP at once when a job already waits.
		if err := s.send(Req(PreSleep)); err != nil {
			return err
		}
		s.state = sleeping
		return nil
	case JobAssignUniq, JobAssign:
		if s.state != grabbing {
			return fmt.Errorf("gearman %s: %s without GRAB_JOB", s.addr, p.Type)
		}
		s.state, s.noopLater = idle, false
		j := &Job{Function: p.Arg(1), Handle: p.Arg(0), s: s}
		if p.Type == JobAssignUniq {
			j.Unique, j.Data = p.Arg(2), p.Args[3]
		} else {
			j.Data = p.Args[2]
		}
		s.dispatch(j)
		return s.update()
	case EchoRes:
		return nil
	case Error:
		return fmt.Errorf("gearman %s: server sent ERROR %s: %s", s.addr, p.Arg(0), p.Arg(1))
	default:
		return fmt.Errorf("gearman %s: unexpected %s packet", s.addr, p.Type)
	}
}

// releaseSlot gives back the slot reserved for the grab.
func (s *serverConn) releaseSlot() {
	if s.slot {
		s.slot = false
		s.w.releaseSlot()
	}
}

// dispatch starts the job assigned by the server: its function's handler, or the
// failure of an unserved function. The slot reserved for the grab goes to the job.
func (s *serverConn) dispatch(j *Job) {
	s.held[j.Handle] = j.Function
	s.slot = false
	// The function may have become ours since it was registered as unserved: then the
	// handler does it. One neither ours nor unserved any more was ours at the grab.
	msg, unserved := s.unMsg[j.Function]
	if unserved && s.w.hasFunction(j.Function) {
		unserved = false
	}
	s.w.startJob(s.jobCtx, s, j, unserved, msg)
}

// update registers what should be, and grabs when it can.
func (s *serverConn) update() error {
	added, err := s.sync()
	if err != nil {
		return err
	}
	if added && s.state == sleeping {
		// The server wakes a sleeping worker for new jobs only, not for the queued jobs
		// of a function registered after PRE_SLEEP.
		s.state = idle
	}
	if s.state == idle {
		return s.tryGrab()
	}
	return nil
}

// sync registers the functions of the worker's set and the unserved functions to
// answer, and unregisters the rest, except those of held jobs and while a grab is
// outstanding (gearmand would requeue the job it assigns meanwhile). It tells whether
// it registered any.
func (s *serverConn) sync() (added bool, err error) {
	want := s.w.functionSet()
	var pkts []Packet
	var names []string
	for f := range want {
		names = append(names, f)
	}
	for f := range s.unWant {
		if want[f] {
			// Ours now; the watcher drops it at its next status too.
			delete(s.unWant, f)
			continue
		}
		names = append(names, f)
	}
	slices.Sort(names)
	for _, f := range names {
		if msg, ok := s.unWant[f]; ok && !want[f] {
			if s.unMsg[f] == "" {
				s.w.log.Info("answering the jobs of an unserved gearman function", "address", s.addr, "function", f, "message", msg)
			}
			s.unMsg[f] = msg
		} else {
			delete(s.unMsg, f)
		}
		if !s.reg[f] {
			s.reg[f] = true
			pkts = append(pkts, Req(CanDo, f))
			added = true
		}
	}
	var drop []string
	for f := range s.reg {
		if _, un := s.unWant[f]; want[f] || un {
			continue
		}
		if s.state == grabbing || s.holds(f) {
			continue
		}
		drop = append(drop, f)
	}
	slices.Sort(drop)
	for _, f := range drop {
		delete(s.reg, f)
		delete(s.unMsg, f)
		pkts = append(pkts, Req(CantDo, f))
	}
	if len(pkts) == 0 {
		return added, nil
	}
	s.w.setRegistered(s.index, len(s.reg))
	return added, s.send(pkts...)
}

// holds tells whether a job of the function is assigned and not yet answered.
func (s *serverConn) holds(function string) bool {
	for _, f := range s.held {
		if f == function {
			return true
		}
	}
	return false
}

// tryGrab asks for a job when none is asked for, there is something to do and a job
// slot is free; otherwise it waits, idle, for a kick.
func (s *serverConn) tryGrab() error {
	if s.state == grabbing {
		return nil
	}
	s.state = idle
	if len(s.reg) == 0 || !s.w.reserveSlot() {
		return nil
	}
	s.slot = true
	if err := s.send(Req(GrabJobUniq)); err != nil {
		return err
	}
	s.state = grabbing
	return nil
}

// answeredJob tells the loop that a job is answered, unless the connection ended.
func (s *serverConn) answeredJob(handle string) {
	select {
	case s.answered <- handle:
	case <-s.done:
	}
}
