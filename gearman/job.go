package gearman

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// Job is a job assigned to this worker.
type Job struct {
	Function string
	// Handle is the server's name of the job; a job requeued after its worker's
	// connection dropped keeps it.
	Handle string
	// Unique is the client's key of the job (the gearman command's -u, or a fresh UUID
	// it makes up); the server coalesces jobs submitted with the same one.
	Unique string
	Data   []byte

	s        *serverConn // where it was assigned; nil for a Job made elsewhere
	mu       sync.Mutex
	answered bool // no WORK_STATUS after the answer: the server would answer ERROR
}

// Status sends WORK_STATUS (progress numerator/denominator) to the client. It is best
// effort: dropped when the job's connection is gone or the job is answered. Safe for
// concurrent use.
func (j *Job) Status(numerator, denominator uint64) {
	if j == nil || j.s == nil {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.answered {
		return
	}
	// A failed write ends the connection; the job's answer then goes nowhere either.
	_ = j.s.send(Req(WorkStatus, j.Handle, strconv.FormatUint(numerator, 10), strconv.FormatUint(denominator, 10)))
}

// answer sends the job's answer, once, and tells whether it went out.
func (j *Job) answer(pkts ...Packet) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.answered = true
	return j.s.send(pkts...)
}

// Handler does a job. Its result is sent as WORK_COMPLETE; an error's message (made one
// line, and cut to 4 KiB) as WORK_DATA then WORK_FAIL, which the gearman command
// prints and exits 1 on. ctx ends when the worker stops (after Run's ctx ends and the
// connections are closed), not when the job's connection drops: a job whose
// connection dropped is finished anyway and its result is only logged as
// undeliverable.
type Handler func(ctx context.Context, j *Job) ([]byte, error)

// JobResult is what became of a job, for OnJob.
type JobResult struct {
	Server, Function, Handle, Unique string
	Data                             []byte // the job's data
	Result                           []byte // the handler's result, when Err is nil
	Err                              error  // why the job failed
	Started, Ended                   time.Time
	// Delivered tells whether the answer was written to the job's connection; false
	// when that connection was gone.
	Delivered bool
	// Unserved marks a job of a function nobody serves, failed without a handler.
	Unserved bool
}

// maxMessage bounds a failure message: the client shows it to a person.
const maxMessage = 4 << 10

// jobKey names the same job across handles: a job requeued after a lost connection
// comes back with the same function and unique.
type jobKey struct{ function, unique string }

// flight is a handler call that a second assignment of the same job waits for.
type flight struct {
	done   chan struct{}
	result []byte
	err    error
}

// jobRun is a job being done, for Status.
type jobRun struct {
	job     *Job
	server  string
	started time.Time
}

// startJob runs the job on its own goroutine: the handler, or the unserved failure, or
// the wait for the same job that is running already. The job holds the slot its grab
// reserved until it is answered, except a wait for the same job, which does no work.
func (w *Worker) startJob(ctx context.Context, s *serverConn, j *Job, unserved bool, message string) {
	r := &jobRun{job: j, server: s.addr, started: time.Now()}
	// Every job is logged as it arrives, before anything is done for it: who
	// asked gearmand for what is on record even when the job never ends.
	w.log.Info("gearman job received", "address", s.addr, "function", j.Function,
		"handle", j.Handle, "unique", j.Unique, "data_bytes", len(j.Data), "unserved", unserved)
	var f *flight
	dup := false
	w.mu.Lock()
	w.jobs[r] = true
	if !unserved && j.Unique != "" {
		key := jobKey{j.Function, j.Unique}
		if f = w.flights[key]; f != nil {
			dup = true
			w.busy--
			w.kickAll()
		} else {
			f = &flight{done: make(chan struct{})}
			w.flights[key] = f
		}
	}
	w.mu.Unlock()
	w.jobWG.Go(func() {
		var result []byte
		var err error
		switch {
		case unserved:
			err = errors.New(message)
		case dup:
			w.log.Info("gearman job assigned again while running; answering it with the running one's result",
				"address", s.addr, "function", j.Function, "handle", j.Handle, "unique", j.Unique)
			<-f.done
			result, err = f.result, f.err
		default:
			result, err = w.call(ctx, j)
			if f != nil {
				w.mu.Lock()
				delete(w.flights, jobKey{j.Function, j.Unique})
				f.result, f.err = result, err
				close(f.done)
				w.mu.Unlock()
			}
		}
		w.finish(s, r, result, err, unserved, !dup)
	})
}

// call runs the handler; a panic fails the job instead of the daemon.
func (w *Worker) call(ctx context.Context, j *Job) (result []byte, err error) {
	if w.opts.Handler == nil {
		return nil, errors.New("no handler for gearman jobs")
	}
	defer func() {
		if p := recover(); p != nil {
			w.log.Error("gearman job handler panicked", "function", j.Function, "handle", j.Handle, "panic", p, "stack", string(debug.Stack()))
			result, err = nil, fmt.Errorf("job handler panicked: %v", p)
		}
	}()
	return w.opts.Handler(ctx, j)
}

// finish answers the job on its connection, frees its slot and reports it.
func (w *Worker) finish(s *serverConn, r *jobRun, result []byte, err error, unserved, slot bool) {
	j := r.job
	if err == nil && len(result)+len(j.Handle)+1 > MaxDataSize {
		err = fmt.Errorf("result of %d bytes is too large to send", len(result))
	}
	var aerr error
	if err == nil {
		aerr = j.answer(Req(WorkComplete, j.Handle, string(result)))
	} else {
		// WORK_DATA carries the message the gearman command prints; a bare
		// WORK_EXCEPTION would leave it waiting forever. The command prints it
		// as it is, then "Job failed" on stderr: the newline keeps them apart.
		msg := oneLine(err.Error()) + "\n"
		aerr = j.answer(Req(WorkData, j.Handle, msg), Req(WorkFail, j.Handle))
	}
	ended := time.Now()
	s.answeredJob(j.Handle)
	if aerr != nil {
		w.log.Warn("cannot deliver the answer of a gearman job", "address", s.addr, "function", j.Function,
			"handle", j.Handle, "unique", j.Unique, "failed", err != nil, "error", aerr)
	}

	w.mu.Lock()
	delete(w.jobs, r)
	if err == nil {
		w.served++
	} else {
		w.failed++
	}
	if slot {
		w.busy--
		w.kickAll()
	}
	w.mu.Unlock()

	if w.opts.OnJob != nil {
		w.opts.OnJob(JobResult{
			Server: s.addr, Function: j.Function, Handle: j.Handle, Unique: j.Unique,
			Data: j.Data, Result: result, Err: err,
			Started: r.started, Ended: ended,
			Delivered: aerr == nil, Unserved: unserved,
		})
	}
}

// oneLine makes a failure message one line of valid UTF-8 without NULs, at most
// maxMessage bytes.
func oneLine(s string) string {
	s = strings.ToValidUTF8(s, "?")
	s = strings.Map(func(r rune) rune {
		switch r {
		case '\n', '\r', '\t':
			return ' '
		case 0:
			return -1
		}
		return r
	}, s)
	s = strings.TrimSpace(s)
	if len(s) > maxMessage {
		cut := maxMessage - len("...")
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "..."
	}
	if s == "" {
		s = "job failed"
	}
	return s
}
