package testenv

import (
	"crypto/tls"
	"encoding/binary"
	"io"
	"sync/atomic"
	"testing"
)

// ZooKeeperCounter is a proxy in front of a ZooKeeper server that counts the
// requests its clients send, read off the wire: what a piece of work cost the
// server, as a test sees it without the client counting anything itself.
type ZooKeeperCounter struct {
	// Addr is host:port to give the client instead of the server's.
	Addr     string
	requests atomic.Int64
	reads    atomic.Int64
}

// NewZooKeeperCounter starts a counting proxy to z. Under TLS it presents z's
// server certificate to the client and z's client certificate to z.
func NewZooKeeperCounter(t testing.TB, z *ZooKeeper) *ZooKeeperCounter {
	t.Helper()
	c := &ZooKeeperCounter{}
	var acceptTLS, dialTLS *tls.Config
	if z.TLS {
		cert, err := z.serverKeyPair()
		if err != nil {
			t.Fatalf("counting ZooKeeper requests: %v", err)
		}
		if dialTLS, err = z.ClientTLSConfig(); err != nil {
			t.Fatalf("counting ZooKeeper requests: %v", err)
		}
		acceptTLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	c.Addr = newProxy(t, z.Addr, func(p *Proxy) {
		p.tap = func() io.Writer { return &zkFrames{c: c} }
		p.acceptTLS, p.dialTLS = acceptTLS, dialTLS
	}).Addr
	return c
}

// Requests is how many requests the clients sent: reads, writes, multis and
// lock work, but not the pings and watch renewals that keep a session, nor
// its opening and closing.
func (c *ZooKeeperCounter) Requests() int64 { return c.requests.Load() }

// Reads is how many of them read a znode: its data, its children or whether
// it exists.
func (c *ZooKeeperCounter) Reads() int64 { return c.reads.Load() }

// ZooKeeper's client packets: a 4-byte length, then, after the first packet
// of a connection (the connect request), a header of xid and opcode.
const (
	zkPingXid        = -2
	zkAuthXid        = -4
	zkSetWatchesXid  = -8
	zkOpExists       = 3
	zkOpGetData      = 4
	zkOpGetChildren  = 8
	zkOpGetChildren2 = 12
	zkOpCloseSession = -11
)

// zkFrames reads one connection's client packets as they pass and counts them.
type zkFrames struct {
	c         *ZooKeeperCounter
	connected bool   // the connect request went by
	head      []byte // what was read so far of the current packet's length and header
	skip      int64  // bytes of the current packet left to pass over
}

// headLen is how much of a packet's start is read: its length, and after the
// connect request the xid and opcode that follow it.
func (f *zkFrames) headLen() int {
	if len(f.head) < 4 || !f.connected {
		return 4
	}
	return min(12, 4+int(binary.BigEndian.Uint32(f.head)))
}

func (f *zkFrames) Write(b []byte) (int, error) {
	n := len(b)
	for len(b) > 0 {
		if f.skip > 0 {
			k := min(int64(len(b)), f.skip)
			f.skip -= k
			b = b[k:]
			continue
		}
		k := min(f.headLen()-len(f.head), len(b))
		f.head = append(f.head, b[:k]...)
		b = b[k:]
		if len(f.head) < f.headLen() {
			continue
		}
		if f.connected && len(f.head) == 12 {
			f.count(int32(binary.BigEndian.Uint32(f.head[4:])), int32(binary.BigEndian.Uint32(f.head[8:])))
		}
		f.connected = true
		f.skip = int64(binary.BigEndian.Uint32(f.head)) - int64(len(f.head)-4)
		f.head = f.head[:0]
	}
	return n, nil
}

func (f *zkFrames) count(xid, op int32) {
	switch {
	case xid == zkPingXid || xid == zkAuthXid || xid == zkSetWatchesXid || op == zkOpCloseSession:
		return
	case op == zkOpExists || op == zkOpGetData || op == zkOpGetChildren || op == zkOpGetChildren2:
		f.c.reads.Add(1)
	}
	f.c.requests.Add(1)
}
