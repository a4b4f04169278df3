package status

import (
	"time"

	"github.com/nodepool-builder/nodepool-builder/store"
)

// ZuulMQTTPart names the status file of the listener to Zuul's MQTT reports.
const ZuulMQTTPart = "zuul-mqtt"

// ZuulMQTT is what the daemon's listener to Zuul's MQTT reports is doing, as
// it leaves it in the images-dir for image-status. It holds no credential.
type ZuulMQTT struct {
	Stamp
	// Listening is false once the daemon stopped, or a reload took
	// builder.zuul-mqtt out of the config.
	Listening bool     `json:"listening"`
	URL       string   `json:"url"`
	Topics    []string `json:"topics"`
	// Connected tells whether the listener is connected and subscribed, and
	// Since since when it is, or is not.
	Connected bool      `json:"connected"`
	Since     time.Time `json:"since,omitzero"`
	// LastMessage is when the last message arrived, used or not.
	LastMessage time.Time `json:"last_message,omitzero"`
	// LastError is why the last connect failed or the connection was lost,
	// and LastErrorAt when.
	LastError   string    `json:"last_error,omitempty"`
	LastErrorAt time.Time `json:"last_error_at,omitzero"`
	// Used counts the messages that made zuul-images be polled, Polls the
	// polls they asked for, and Ignored the other messages by reason, since
	// the daemon started.
	Used    uint64            `json:"used"`
	Polls   uint64            `json:"polls"`
	Ignored map[string]uint64 `json:"ignored"`
}

// ReadZuulMQTT reads what the daemon last said of its listener to Zuul's MQTT
// reports; nil when it never said anything.
func ReadZuulMQTT(st *store.Store) (*ZuulMQTT, error) {
	return read[ZuulMQTT](st, ZuulMQTTPart)
}

// Stale tells whether the status is too old to be the running daemon's.
func (s *ZuulMQTT) Stale(now time.Time) bool {
	return !s.Listening || stale(s.Updated, now)
}
