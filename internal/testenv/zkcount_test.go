package testenv

import (
	"encoding/binary"
	"testing"
)

// zkPacket is a client packet: its length, then its body.
func zkPacket(body []byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
}

// zkRequest is a request packet with a header and a payload.
func zkRequest(xid, op int32, payload string) []byte {
	body := binary.BigEndian.AppendUint32(nil, uint32(xid))
	body = binary.BigEndian.AppendUint32(body, uint32(op))
	return zkPacket(append(body, payload...))
}

// TestZooKeeperFramesCount: the counter tells requests from the packets that
// keep a session, and reads from the rest, however the stream is cut.
func TestZooKeeperFramesCount(t *testing.T) {
	var stream []byte
	stream = append(stream, zkPacket(make([]byte, 45))...) // connect request: no header
	stream = append(stream, zkRequest(1, zkOpGetData, "\x00\x00\x00\x02/a\x01")...)
	stream = append(stream, zkRequest(zkPingXid, 11, "")...)
	stream = append(stream, zkRequest(2, 1, "\x00\x00\x00\x02/b"+string(make([]byte, 3000)))...) // create
	stream = append(stream, zkRequest(zkSetWatchesXid, 101, "watches")...)
	stream = append(stream, zkRequest(3, zkOpGetChildren2, "\x00\x00\x00\x01/\x00")...)
	stream = append(stream, zkRequest(4, 14, "multi")...)
	stream = append(stream, zkRequest(5, zkOpExists, "")...)
	stream = append(stream, zkRequest(6, zkOpCloseSession, "")...)
	for _, chunk := range []int{len(stream), 1, 3, 7, 13, 1000} {
		c := &ZooKeeperCounter{}
		f := &zkFrames{c: c}
		for b := stream; len(b) > 0; {
			k := min(chunk, len(b))
			if n, err := f.Write(b[:k]); n != k || err != nil {
				t.Fatalf("chunks of %d: Write = %d, %v", chunk, n, err)
			}
			b = b[k:]
		}
		if c.Requests() != 5 || c.Reads() != 3 {
			t.Errorf("chunks of %d: %d requests, %d reads; want 5 requests (get, create, children, multi, "+
				"exists) of which 3 reads", chunk, c.Requests(), c.Reads())
		}
	}
}
