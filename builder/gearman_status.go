package builder

import (
	"context"
	"os"
	"time"

	"github.com/nodepool-builder/nodepool-builder/store"
)

// gearmanStatusPart names the gearman status file in the images-dir.
const gearmanStatusPart = "gearman"

// GearmanStatus is what the daemon's gearman worker is doing, as it leaves it
// in the images-dir for image-status.
type GearmanStatus struct {
	Updated time.Time `json:"updated"`
	PID     int       `json:"pid"`
	// Serving is false once the daemon stopped.
	Serving   bool                  `json:"serving"`
	Servers   []GearmanServerStatus `json:"servers"`
	Functions int                   `json:"functions"`
	Running   []GearmanJob          `json:"running"`
	Served    int                   `json:"served"`
	Failed    int                   `json:"failed"`
	Recent    []GearmanJob          `json:"recent"` // newest last
}

// GearmanServerStatus is the connection to one gearman server.
type GearmanServerStatus struct {
	Address   string    `json:"address"`
	Connected bool      `json:"connected"`
	Since     time.Time `json:"since"`
	LastError string    `json:"last_error,omitempty"`
	// Registered is how many functions the server knows from this builder.
	Registered int `json:"registered"`
}

// GearmanJob is a job running or served.
type GearmanJob struct {
	Server    string    `json:"server"`
	Function  string    `json:"function"`
	Started   time.Time `json:"started"`
	Ended     time.Time `json:"ended,omitzero"`
	Result    string    `json:"result,omitempty"`
	Error     string    `json:"error,omitempty"`
	Delivered bool      `json:"delivered"`
}

// status is the service's status now.
func (g *gearmanService) status(serving bool) GearmanStatus {
	ws := g.w.Status()
	s := GearmanStatus{PID: os.Getpid(), Serving: serving,
		Functions: len(ws.Functions), Served: ws.Served, Failed: ws.Failed}
	for _, srv := range ws.Servers {
		s.Servers = append(s.Servers, GearmanServerStatus{Address: srv.Address, Connected: srv.Connected && serving,
			Since: srv.Since, LastError: srv.LastError, Registered: srv.Registered})
	}
	for _, r := range ws.Running {
		s.Running = append(s.Running, GearmanJob{Server: r.Server, Function: quoteLimit(r.Function), Started: r.Started})
	}
	g.mu.Lock()
	s.Recent = append([]GearmanJob(nil), g.recent...)
	g.mu.Unlock()
	return s
}

// writeStatus keeps the status file fresh until ctx ends: at once when a job
// ends, else when what it says changed.
func (g *gearmanService) writeStatus(ctx context.Context) {
	g.file.keep(ctx, g.changed, func() stamped {
		s := g.status(true)
		return &s
	})
}

// saveStatus writes the status once.
func (g *gearmanService) saveStatus(serving bool) {
	s := g.status(serving)
	g.file.save(&s)
}

func (s *GearmanStatus) stamp(t time.Time) { s.Updated = t }

// ReadGearmanStatus reads what the daemon last said of its gearman worker;
// nil when it never said anything.
func ReadGearmanStatus(st *store.Store) (*GearmanStatus, error) {
	var s GearmanStatus
	if ok, err := readStatus(st, gearmanStatusPart, &s); !ok {
		return nil, err
	}
	return &s, nil
}

// Stale tells whether the status is too old to be the running daemon's.
func (s *GearmanStatus) Stale(now time.Time) bool {
	return !s.Serving || stale(s.Updated, now)
}
