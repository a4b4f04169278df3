package testenv

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// TestProxyLinkRate sends a few MiB over two connections at once through a
// proxy whose link is capped, each way: together they move at the cap, not at
// twice it, and each shares the link for the whole transfer rather than
// taking it in turn.
func TestProxyLinkRate(t *testing.T) {
	const (
		rate = 8 << 20 // bytes per second
		each = 4 << 20 // bytes per connection
	)
	for _, tc := range []struct {
		name     string
		toTarget bool
	}{{"to the target", true}, {"from the target", false}} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ln.Close() })
			p := NewProxy(t, ln.Addr().String())
			p.SetLinkRate(rate)

			// Each connection's bytes are counted where they arrive, and
			// its end is when the last of them did: what a sender wrote
			// may still sit in a socket's buffer.
			type result struct {
				n   int64
				end time.Time
				err error
			}
			results := make(chan result, 4)
			receive := func(c net.Conn) {
				n, err := io.Copy(io.Discard, c)
				results <- result{n, time.Now(), err}
			}
			send := func(c net.Conn) {
				if _, err := io.Copy(c, io.LimitReader(zeroReader{}, each)); err != nil {
					results <- result{err: err}
					return
				}
				c.(*net.TCPConn).CloseWrite()
			}
			var served sync.WaitGroup
			t.Cleanup(served.Wait)
			served.Go(func() {
				for range 2 {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					served.Go(func() {
						defer c.Close()
						if tc.toTarget {
							receive(c)
						} else {
							send(c)
						}
					})
				}
			})

			start := time.Now()
			var clients sync.WaitGroup
			for range 2 {
				c, err := net.Dial("tcp", p.Addr)
				if err != nil {
					t.Fatal(err)
				}
				clients.Go(func() {
					defer c.Close()
					if tc.toTarget {
						send(c)
						// The answer is the target closing once it has read all.
						io.Copy(io.Discard, c)
					} else {
						receive(c)
					}
				})
			}
			var ends []time.Time
			var total int64
			for len(ends) < 2 {
				select {
				case r := <-results:
					if r.err != nil {
						t.Fatal(r.err)
					}
					total += r.n
					ends = append(ends, r.end)
				case <-time.After(time.Minute):
					t.Fatal("the transfer did not end within a minute")
				}
			}
			clients.Wait()
			if total != 2*each {
				t.Fatalf("%d bytes arrived, want %d", total, 2*each)
			}
			took := max(ends[0].Sub(start), ends[1].Sub(start))
			got := float64(total) / took.Seconds()
			t.Logf("%d MiB in %s: %.2f MiB/s for a cap of %d MiB/s", total>>20, took, got/(1<<20), rate>>20)
			// The bucket's burst lets 50 ms of data through at once; a busy
			// machine may move less than the cap, never much more.
			if got > 1.1*rate || got < 0.7*rate {
				t.Errorf("the two connections together moved %.2f MiB/s, want about the link's %d MiB/s", got/(1<<20), rate>>20)
			}
			// Taking the link in turn, the first would be done at half time.
			for i, end := range ends {
				if d := end.Sub(start); d < took*7/10 {
					t.Errorf("connection %d was done after %s of %s: it did not share the link", i, d, took)
				}
			}
		})
	}
}

// zeroReader reads zeros without end.
type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
