package zuulmqtt

import (
	"bytes"
	"net"
	"strings"
	"testing"

	"github.com/eclipse/paho.mqtt.golang/packets"
)

// TestLimitConn feeds packets through limitConn to the MQTT client's own packet
// reader: a QoS 0 PUBLISH over the limit is skipped unread, and the packets
// around it read as they were sent.
func TestLimitConn(t *testing.T) {
	const limit = 100
	publish := func(qos byte, payload int) []byte {
		p := packets.NewControlPacket(packets.Publish).(*packets.PublishPacket)
		p.TopicName, p.Qos, p.Payload = "zuul/t", qos, bytes.Repeat([]byte("x"), payload)
		if qos > 0 {
			p.MessageID = 7
		}
		var b bytes.Buffer
		if err := p.Write(&b); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	connack := []byte{0x20, 0x02, 0x00, 0x00}
	read := func(stream []byte) ([]packets.ControlPacket, []int, error) {
		server, client := net.Pipe()
		go func() {
			server.Write(stream)
			server.Close()
		}()
		var skipped []int
		c := newLimitConn(client, limit, func(topic string, n int) {
			if topic != "zuul/t" {
				t.Errorf("skipped a message to %q, want zuul/t", topic)
			}
			skipped = append(skipped, n)
		})
		defer c.Close()
		var got []packets.ControlPacket
		for {
			p, err := packets.ReadPacket(c)
			if err != nil {
				return got, skipped, err
			}
			got = append(got, p)
		}
	}

	stream := append(append(append(append([]byte{}, connack...), publish(0, 90)...), publish(0, 5000)...), publish(0, 3)...)
	got, skipped, err := read(stream)
	if len(got) != 3 || err == nil || !strings.Contains(err.Error(), "EOF") {
		t.Fatalf("read %d packets (%v), then %v; want 3 then EOF", len(got), got, err)
	}
	if p, ok := got[1].(*packets.PublishPacket); !ok || len(p.Payload) != 90 {
		t.Errorf("second packet %v, want the PUBLISH of 90 bytes", got[1])
	}
	if p, ok := got[2].(*packets.PublishPacket); !ok || len(p.Payload) != 3 {
		t.Errorf("third packet %v, want the PUBLISH of 3 bytes after the skipped one", got[2])
	}
	if len(skipped) != 1 || skipped[0] < 5000 {
		t.Errorf("skipped %v, want the one PUBLISH of 5000 bytes", skipped)
	}

	// What cannot be skipped without the client noticing ends the connection.
	for name, big := range map[string][]byte{
		"a QoS 1 PUBLISH": publish(1, 5000),
		"a SUBACK":        append([]byte{0x90, 0xe8, 0x07}, make([]byte, 1000)...),
		"a bad length":    {0x30, 0xff, 0xff, 0xff, 0xff, 0x01},
	} {
		got, skipped, err := read(append(append([]byte{}, connack...), big...))
		if len(got) != 1 || len(skipped) != 0 || err == nil || strings.Contains(err.Error(), "EOF") {
			t.Errorf("%s: read %d packets, skipped %v, then %v; want the CONNACK, then an error", name, len(got), skipped, err)
		}
	}
}
