package zuulmqtt

import (
	"bufio"
	"fmt"
	"io"
	"net"
)

// MQTT control packet types, the high nibble of a packet's first byte.
const packetPublish = 3

// maxPacket is the largest packet that reaches the MQTT client: a PUBLISH of
// MaxMessageSize with the longest topic and a packet id.
const maxPacket = MaxMessageSize + 2 + 65535 + 2

// limitConn is the connection to the broker as the MQTT client sees it. The
// client reads a whole packet into memory before anyone can look at it, and
// MQTT allows packets of 256 MiB: a report over MaxMessageSize is skipped here,
// as it arrives, and never read into memory. Only a QoS 0 PUBLISH can be skipped
// without the client noticing (the others are acknowledged); the listener
// subscribes at QoS 0, so the broker sends no other. Any other packet that
// large ends the connection.
type limitConn struct {
	net.Conn
	r      *bufio.Reader
	limit  int
	onSkip func(topic string, size int)

	pending []byte // a packet header read and not yet passed on
	pass    int    // bytes of the current packet still to pass on
}

func newLimitConn(c net.Conn, limit int, onSkip func(topic string, size int)) *limitConn {
	return &limitConn{Conn: c, r: bufio.NewReader(c), limit: limit, onSkip: onSkip}
}

func (c *limitConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for len(c.pending) == 0 && c.pass == 0 {
		if err := c.nextPacket(); err != nil {
			return 0, err
		}
	}
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	n, err := c.r.Read(p[:min(len(p), c.pass)])
	c.pass -= n
	return n, err
}

// nextPacket reads the fixed header of the next packet: a packet the client
// may have is made pending, a QoS 0 PUBLISH over the limit is skipped.
func (c *limitConn) nextPacket() error {
	first, err := c.r.ReadByte()
	if err != nil {
		return err
	}
	header := []byte{first}
	size, mult := 0, 1
	for i := 0; ; i++ {
		b, err := c.r.ReadByte()
		if err != nil {
			return err
		}
		header = append(header, b)
		size += int(b&0x7f) * mult
		if b&0x80 == 0 {
			break
		}
		if i == 3 {
			return fmt.Errorf("the broker sent a packet with a malformed length")
		}
		mult *= 128
	}
	if size <= c.limit {
		c.pending, c.pass = header, size
		return nil
	}
	kind, qos := first>>4, (first>>1)&3
	if kind != packetPublish || qos != 0 {
		return fmt.Errorf("the broker sent a packet of %d bytes (type %d, QoS %d), over the %d this client takes", size, kind, qos, c.limit)
	}
	// The topic, for the log: its length in two bytes, then the topic.
	var topic []byte
	rest := size
	if rest >= 2 {
		var n [2]byte
		if _, err := io.ReadFull(c.r, n[:]); err != nil {
			return err
		}
		topic = make([]byte, min(int(n[0])<<8|int(n[1]), rest-2))
		if _, err := io.ReadFull(c.r, topic); err != nil {
			return err
		}
		rest -= 2 + len(topic)
	}
	if _, err := io.CopyN(io.Discard, c.r, int64(rest)); err != nil {
		return err
	}
	if c.onSkip != nil {
		c.onSkip(string(topic), size)
	}
	return nil
}
