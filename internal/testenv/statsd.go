package testenv

import (
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// Statsd is a UDP socket on loopback that takes statsd packets, as a statsd
// daemon would, for a test to read what the program sent.
type Statsd struct {
	conn net.PacketConn
	// Host and Port are where it listens.
	Host, Port string
}

// NewStatsd listens on a free loopback port until the test ends.
func NewStatsd(t testing.TB) *Statsd {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen for statsd: %v", err)
	}
	t.Cleanup(func() { pc.Close() })
	host, port, _ := net.SplitHostPort(pc.LocalAddr().String())
	return &Statsd{conn: pc, Host: host, Port: port}
}

// Env is STATSD_HOST and STATSD_PORT naming the socket, as KEY=VALUE.
func (s *Statsd) Env() []string {
	return []string{"STATSD_HOST=" + s.Host, "STATSD_PORT=" + s.Port}
}

// Getenv answers STATSD_HOST and STATSD_PORT for the socket, and prefix as STATSD_PREFIX.
func (s *Statsd) Getenv(prefix string) func(string) string {
	return func(k string) string {
		switch k {
		case "STATSD_HOST":
			return s.Host
		case "STATSD_PORT":
			return s.Port
		case "STATSD_PREFIX":
			return prefix
		}
		return ""
	}
}

// Wait reads lines (a packet may hold several, newline separated) until each
// of want has matched one, and returns every line read; the test fails when
// the deadline passes first. A want matches a line equal to it or, when it
// ends in "*", a line that begins with what comes before the "*".
func (s *Statsd) Wait(t testing.TB, deadline time.Duration, want ...string) []string {
	t.Helper()
	var lines []string
	end := time.Now().Add(deadline)
	for !matchAll(lines, want) {
		got := s.read(end)
		if got == nil && !time.Now().Before(end) {
			t.Fatalf("statsd: %q not received within %s; got %q", want, deadline, lines)
		}
		lines = append(lines, got...)
	}
	return lines
}

// Packet returns the lines of the next packet; nil when none comes within d.
func (s *Statsd) Packet(d time.Duration) []string {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if got := s.read(end); got != nil {
			return got
		}
	}
	return nil
}

// Quiet returns the lines that arrive within d: what came after the awaited ones.
func (s *Statsd) Quiet(d time.Duration) []string {
	var lines []string
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		lines = append(lines, s.read(end)...)
	}
	return lines
}

// read reads one packet's lines; nil when none came before end.
func (s *Statsd) read(end time.Time) []string {
	buf := make([]byte, 64<<10)
	s.conn.SetReadDeadline(end)
	n, _, err := s.conn.ReadFrom(buf)
	if err != nil {
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			time.Sleep(10 * time.Millisecond) // a closed socket: do not spin
		}
		return nil
	}
	return strings.Split(strings.TrimRight(string(buf[:n]), "\n"), "\n")
}

func matchAll(lines, want []string) bool {
	for _, w := range want {
		found := false
		for _, l := range lines {
			if l == w || (strings.HasSuffix(w, "*") && strings.HasPrefix(l, strings.TrimSuffix(w, "*"))) {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}
