package testenv

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy is a TCP proxy on loopback in front of a real service: a test can take
// the service "down" (connections refused, open ones cut) and bring it back on
// the same address, and slow the data flowing through it.
type Proxy struct {
	// Addr is host:port to connect to instead of the target.
	Addr   string
	target string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]bool
	rate  int64 // bytes per second each way and connection; 0: unlimited
	// link caps all connections together, to the target and back (see
	// SetLinkRate); nil: unlimited.
	link [2]*bucket
	wg   sync.WaitGroup
	// tap, when set, gets for each connection a writer that sees what the
	// client sends, before the target does.
	tap func() io.Writer
	// acceptTLS and dialTLS, when set, end the client's TLS at the proxy and
	// speak TLS to the target: a tap then sees what the client sends.
	acceptTLS, dialTLS *tls.Config
}

// NewProxy starts a proxy to target (host:port) and stops it when the test ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	return newProxy(t, target, nil)
}

// NewProxyOn is NewProxy listening on listen, such as [::1]:0 for clients that
// reach the target by its IPv6 loopback address.
func NewProxyOn(t testing.TB, listen, target string) *Proxy {
	t.Helper()
	return newProxyOn(t, listen, target, nil)
}

// newProxy is NewProxy; set, when not nil, sets the proxy's tap and TLS
// before it serves.
func newProxy(t testing.TB, target string, set func(*Proxy)) *Proxy {
	t.Helper()
	return newProxyOn(t, "127.0.0.1:0", target, set)
}

func newProxyOn(t testing.TB, listen, target string, set func(*Proxy)) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatalf("start proxy: %v", err)
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, conns: map[net.Conn]bool{}}
	if set != nil {
		set(p)
	}
	p.serve(ln)
	t.Cleanup(p.close)
	return p
}

// URL is the proxy's address as an http URL.
func (p *Proxy) URL() string { return "http://" + p.Addr }

// SetRate limits each connection to about n bytes per second in each direction;
// 0 lifts the limit.
func (p *Proxy) SetRate(n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rate = n
}

// Down refuses new connections and cuts the open ones.
func (p *Proxy) Down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
}

// Up serves on the proxy's address again.
func (p *Proxy) Up() error {
	p.mu.Lock()
	up := p.ln != nil
	p.mu.Unlock()
	if up {
		return nil
	}
	// The port was free a moment ago; another process taking it meanwhile is
	// unlikely, but a short retry covers a socket still closing.
	var ln net.Listener
	var err error
	for range 50 {
		if ln, err = net.Listen("tcp", p.Addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("proxy up again on %s: %w", p.Addr, err)
	}
	p.serve(ln)
	return nil
}

func (p *Proxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Go(func() { p.pipe(c) })
		}
	})
}

// SetTarget sends the connections made from now on to target; open ones stay
// where they are.
func (p *Proxy) SetTarget(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
}

func (p *Proxy) pipe(c net.Conn) {
	defer c.Close()
	p.mu.Lock()
	target := p.target
	p.mu.Unlock()
	up, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	if p.acceptTLS != nil {
		c, up = tls.Server(c, p.acceptTLS), tls.Client(up, p.dialTLS)
	}
	defer up.Close()
	p.mu.Lock()
	if p.ln == nil { // went down meanwhile
		p.mu.Unlock()
		return
	}
	p.conns[c], p.conns[up] = true, true
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.conns, c)
		delete(p.conns, up)
		p.mu.Unlock()
	}()
	var wg sync.WaitGroup
	copyHalf := func(dst io.Writer, src, dstConn net.Conn, dir int) {
		p.copy(dst, src, dir)
		// The other half may still have an answer to deliver.
		if cw, ok := dstConn.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
	}
	var toTarget io.Writer = up
	if p.tap != nil {
		toTarget = io.MultiWriter(p.tap(), up)
	}
	wg.Go(func() { copyHalf(toTarget, c, up, dirToTarget) })
	wg.Go(func() { copyHalf(c, up, c, dirFromTarget) })
	wg.Wait()
}

// copy moves bytes from src to dst at the proxy's rate and its link's in
// direction dir.
func (p *Proxy) copy(dst io.Writer, src io.Reader, dir int) {
	buf := make([]byte, 16<<10)
	start, sent := time.Now(), int64(0)
	for {
		p.mu.Lock()
		rate, link := p.rate, p.link[dir]
		p.mu.Unlock()
		chunk := buf
		if rate > 0 && int64(len(chunk)) > rate/10 {
			chunk = buf[:max(rate/10, 1)]
		}
		n, err := src.Read(chunk)
		if n > 0 {
			link.take(n)
			if _, werr := dst.Write(chunk[:n]); werr != nil {
				return
			}
			sent += int64(n)
			if rate > 0 {
				// Pace: the bytes sent so far may not leave before their time.
				if due := start.Add(time.Duration(sent * int64(time.Second) / rate)); time.Until(due) > 0 {
					time.Sleep(time.Until(due))
				}
			} else {
				start, sent = time.Now(), 0
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *Proxy) close() {
	p.Down()
	p.wg.Wait()
}
