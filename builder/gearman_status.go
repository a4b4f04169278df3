package builder

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/nodepool-builder/nodepool-builder/store"
)

// gearmanStatusPart names the gearman status file in the images-dir.
const gearmanStatusPart = "gearman"

// gearmanStatusEvery is how often the status file is written while nothing
// changes, so that its time says the daemon is alive.
const gearmanStatusEvery = 30 * time.Second

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
	s := GearmanStatus{Updated: time.Now().UTC(), PID: os.Getpid(), Serving: serving,
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
// ends, else when what it says changed, and every gearmanStatusEvery anyway.
func (g *gearmanService) writeStatus(ctx context.Context) {
	var last []byte
	var written time.Time
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		s := g.status(true)
		stamp := s.Updated
		s.Updated = time.Time{}
		now, _ := json.Marshal(s)
		if !bytes.Equal(now, last) || time.Since(written) >= gearmanStatusEvery {
			s.Updated = stamp
			if err := g.save(s); err != nil {
				g.log.Warn("could not write the gearman status file", "error", err)
			}
			last, written = now, time.Now()
		}
		select {
		case <-ctx.Done():
			return
		case <-g.changed:
		case <-t.C:
		}
	}
}

// saveStatus writes the status once.
func (g *gearmanService) saveStatus(serving bool) {
	if err := g.save(g.status(serving)); err != nil {
		g.log.Warn("could not write the gearman status file", "error", err)
	}
}

func (g *gearmanService) save(s GearmanStatus) error {
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return g.b.store.WriteStatus(gearmanStatusPart, append(data, '\n'))
}

// ReadGearmanStatus reads what the daemon last said of its gearman worker;
// nil when it never said anything.
func ReadGearmanStatus(st *store.Store) (*GearmanStatus, error) {
	data, err := os.ReadFile(st.StatusPath(gearmanStatusPart))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var s GearmanStatus
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("read %s: %w", st.StatusPath(gearmanStatusPart), err)
	}
	return &s, nil
}

// Stale tells whether the status is too old to be the running daemon's.
func (s *GearmanStatus) Stale(now time.Time) bool {
	return !s.Serving || now.Sub(s.Updated) > 3*gearmanStatusEvery
}
