package metrics

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// defaultStatsdPort is statsd's port, nodepool's default for STATSD_PORT.
const defaultStatsdPort = "8125"

// statsd sends statsd lines over one UDP socket, one line a packet. A send
// never blocks for long and never fails the work: a lost packet is statsd's
// way, and the first error is logged.
type statsd struct {
	conn   net.Conn
	prefix string
	log    *slog.Logger
	warned atomic.Bool
}

// newStatsd opens the socket to host:port; nil when host is empty or cannot be
// resolved (logged).
func newStatsd(host, port, prefix string, log *slog.Logger) (*statsd, error) {
	if host == "" {
		return nil, nil
	}
	if port == "" {
		port = defaultStatsdPort
	}
	if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
		return nil, fmt.Errorf("STATSD_PORT %q is not a port number", port)
	}
	addr := net.JoinHostPort(host, port)
	conn, err := net.Dial("udp", addr)
	if err != nil {
		log.Warn("statsd is off: cannot open a socket to STATSD_HOST", "address", addr, "error", err)
		return nil, nil
	}
	log.Info("sending statsd metrics", "address", addr, "prefix", prefix)
	return &statsd{conn: conn, prefix: prefix, log: log}, nil
}

func (s *statsd) gauge(name string, v int64) { s.send(line(s.prefix, name, v, "g")) }

func (s *statsd) count(name string, v int64) { s.send(line(s.prefix, name, v, "c")) }

// timing sends a timer in milliseconds, as nodepool does.
func (s *statsd) timing(name string, d time.Duration) {
	s.send(line(s.prefix, name, d.Milliseconds(), "ms"))
}

func (s *statsd) send(l string) {
	// A full socket buffer must not hold up the work that reports.
	_ = s.conn.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := s.conn.Write([]byte(l)); err != nil && !s.warned.Swap(true) {
		s.log.Warn("statsd packets are being lost", "error", err)
	}
}

// maxPacket is the largest packet a batch sends, as Python's statsd client
// (nodepool's) packs a pipeline: lines joined by newlines, a new packet when
// the next line would make it maxPacket bytes or more.
const maxPacket = 512

// batch sends lines in as few packets as maxPacket allows, in order.
func (s *statsd) batch(lines []string) {
	for _, p := range packets(lines) {
		s.send(p)
	}
}

// packets packs lines into packets of fewer than maxPacket bytes; a line that
// is longer on its own goes alone.
func packets(lines []string) []string {
	var out []string
	cur := ""
	for _, l := range lines {
		switch {
		case cur == "":
			cur = l
		case len(cur)+1+len(l) >= maxPacket:
			out = append(out, cur)
			cur = l
		default:
			cur += "\n" + l
		}
	}
	if cur != "" {
		out = append(out, cur)
	}
	return out
}

func (s *statsd) close() error { return s.conn.Close() }

// line is one statsd line: [<prefix>.]<name>:<value>|<type>.
func line(prefix, name string, v int64, typ string) string {
	if prefix != "" {
		name = prefix + "." + name
	}
	return name + ":" + strconv.FormatInt(v, 10) + "|" + typ
}

// key makes a name part safe for the statsd line: the protocol's separators
// and white space become "_". Dots stay: nodepool keeps them too.
func key(s string) string {
	return strings.Map(func(r rune) rune {
		if r == ':' || r == '|' || r == '@' || r <= ' ' || r == 0x7f {
			return '_'
		}
		return r
	}, s)
}

// diskSize is the space a file takes on disk, as nodepool reports image sizes:
// st_blocks * 512, which a sparse file keeps small.
func diskSize(path string) (int64, bool) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fi.Size(), true
	}
	return st.Blocks * 512, true
}
