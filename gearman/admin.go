package gearman

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"
)

// functionStatus is one line of the text admin protocol's `status` answer.
type functionStatus struct {
	Function string
	// Total counts the jobs queued or running, Running those assigned to a worker,
	// Workers the connected workers that registered the function.
	Total, Running, Workers int
}

// Queued is the jobs that wait for a worker.
func (f functionStatus) Queued() int { return f.Total - f.Running }

// maxStatusLines bounds the admin status answer a server may send us.
const maxStatusLines = 1 << 20

// readStatus sends the text admin command `status` on conn and reads the answer: one
// line FUNCTION\tTOTAL\tRUNNING\tAVAILABLE_WORKERS per function, then a line ".".
func readStatus(conn io.ReadWriter) ([]functionStatus, error) {
	if _, err := io.WriteString(conn, "status\n"); err != nil {
		return nil, fmt.Errorf("admin status: %w", err)
	}
	return parseStatus(bufio.NewReader(conn))
}

func parseStatus(r *bufio.Reader) ([]functionStatus, error) {
	var out []functionStatus
	for range maxStatusLines {
		line, err := r.ReadString('\n')
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, fmt.Errorf("admin status: %w", err)
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "." {
			return out, nil
		}
		if strings.HasPrefix(line, "ERR ") {
			return nil, fmt.Errorf("admin status: %s", oneLine(line))
		}
		// A client may queue jobs of a function whose name holds a tab or a newline,
		// which gearmand prints as it is: its lines are skipped, not the status.
		if st, ok := parseStatusLine(line); ok {
			out = append(out, st)
		}
	}
	return nil, fmt.Errorf("admin status: more than %d lines", maxStatusLines)
}

// parseStatusLine reads FUNCTION\tTOTAL\tRUNNING\tAVAILABLE_WORKERS.
func parseStatusLine(line string) (functionStatus, bool) {
	f := strings.Split(line, "\t")
	if len(f) != 4 {
		return functionStatus{}, false
	}
	st := functionStatus{Function: f[0]}
	for i, p := range []*int{&st.Total, &st.Running, &st.Workers} {
		n, err := strconv.Atoi(f[i+1])
		if err != nil || n < 0 {
			return functionStatus{}, false
		}
		*p = n
	}
	return st, true
}

// adminTimeout bounds a status exchange.
const adminTimeout = 10 * time.Second

// watchUnserved reads the server's status every UnservedCheck on a connection of its
// own and tells the connection's loop which unserved functions to answer, until ctx (the
// connection's) ends.
func (s *serverConn) watchUnserved(ctx context.Context) {
	tick := time.NewTicker(s.w.opts.UnservedCheck)
	defer tick.Stop()
	var conn net.Conn
	var unhook func() bool
	hangUp := func() {
		if conn != nil {
			unhook()
			conn.Close()
			conn = nil
		}
	}
	defer hangUp()
	u := unservedTracker{
		after:     s.w.opts.UnservedAfter,
		ours:      s.w.hasFunction,
		candidate: s.w.opts.UnservedCandidate,
		judge:     s.w.opts.Unserved,
		seen:      map[string]time.Time{},
		active:    map[string]string{},
	}
	behind := false // functions were left for later: said once until caught up
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if conn == nil {
			d := net.Dialer{Timeout: dialTimeout}
			c, err := d.DialContext(ctx, "tcp", s.addr)
			if err != nil {
				s.w.log.Debug("cannot read gearman status", "address", s.addr, "error", err)
				continue
			}
			// Closing it when the connection ends cuts a status read short.
			conn, unhook = c, context.AfterFunc(ctx, func() { c.Close() })
		}
		conn.SetDeadline(time.Now().Add(adminTimeout))
		st, err := readStatus(conn)
		if err != nil {
			s.w.log.Debug("cannot read gearman status", "address", s.addr, "error", err)
			hangUp()
			continue
		}
		next := u.step(st, time.Now())
		switch {
		case u.left > 0 && !behind:
			s.w.log.Warn("many gearman functions have queued jobs and no worker: judging at most a few per status read, the rest later",
				"address", s.addr, "per_read", maxJudged, "left", u.left)
			behind = true
		case u.left == 0:
			behind = false
		}
		if next != nil {
			// Only this goroutine sends, so after the drain there is room.
			select {
			case <-s.unservedc:
			default:
			}
			s.unservedc <- maps.Clone(next) // the loop changes its copy
		}
	}
}

// maxJudged bounds the functions judged at one status read: a client that queues jobs
// of many made-up names costs a bounded number of verdicts (store lookups) and
// registrations per read, however many names it made up.
const maxJudged = 100

// unservedTracker decides, from one status after another, which functions nobody
// serves for long enough that their jobs should be failed.
type unservedTracker struct {
	after     time.Duration
	ours      func(function string) bool
	candidate func(function string) bool // nil: any name gearmand could take
	judge     func(function string) (message string, bad bool)
	seen      map[string]time.Time // since when a function is judged unserved, not yet answered
	active    map[string]string    // functions being answered -> message
	// cursor is the last function judged: the next step goes on after it, so that
	// the functions over maxJudged get their turn.
	cursor string
	// left counts the functions the last step left for later.
	left int
}

// step takes a status read at now and returns the functions to answer, or nil when
// they did not change. A function is answered once it was judged bad, and judged bad
// again at least u.after later, with queued jobs and no worker at every status between;
// it stays answered while it has queued jobs and no other worker. At most maxJudged
// functions are judged per step, in turn.
func (u *unservedTracker) step(status []functionStatus, now time.Time) map[string]string {
	next := map[string]string{}
	listed := map[string]bool{}
	var due []string
	for _, st := range status {
		f := st.Function
		if checkFunction(f) != nil || (u.candidate != nil && !u.candidate(f)) {
			continue
		}
		listed[f] = true
		msg, active := u.active[f]
		workers := st.Workers
		if active {
			workers-- // this worker, answering it
		}
		if u.ours(f) || st.Queued() <= 0 || workers > 0 {
			delete(u.seen, f)
			continue
		}
		if active {
			next[f] = msg
			continue
		}
		if first, ok := u.seen[f]; ok && now.Sub(first) < u.after {
			continue
		}
		due = append(due, f)
	}
	slices.Sort(due)
	turn, _ := slices.BinarySearch(due, u.cursor)
	if turn < len(due) && due[turn] == u.cursor {
		turn++
	}
	due = append(due[turn:], due[:turn]...)
	u.left = max(len(due)-maxJudged, 0)
	for _, f := range due[:len(due)-u.left] {
		u.cursor = f
		msg, bad := u.judge(f)
		switch _, judged := u.seen[f]; {
		case !bad:
			delete(u.seen, f)
		case !judged:
			u.seen[f] = now
		default:
			delete(u.seen, f)
			next[f] = oneLine(msg)
		}
	}
	for f := range u.seen {
		if !listed[f] {
			delete(u.seen, f)
		}
	}
	if maps.Equal(next, u.active) {
		return nil
	}
	u.active = next
	return next
}
