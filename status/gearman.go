package status

import (
	"time"

	"github.com/nodepool-builder/nodepool-builder/store"
)

// GearmanPart names the gearman status file in the images-dir.
const GearmanPart = "gearman"

// Gearman is what the daemon's gearman worker is doing, as it leaves it in the
// images-dir for image-status.
type Gearman struct {
	Stamp
	// Serving is false once the daemon stopped.
	Serving   bool            `json:"serving"`
	Servers   []GearmanServer `json:"servers"`
	Functions int             `json:"functions"`
	Running   []GearmanJob    `json:"running"`
	Served    int             `json:"served"`
	Failed    int             `json:"failed"`
	Recent    []GearmanJob    `json:"recent"` // newest last
}

// GearmanServer is the connection to one gearman server.
type GearmanServer struct {
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

// ReadGearman reads what the daemon last said of its gearman worker; nil when
// it never said anything.
func ReadGearman(st *store.Store) (*Gearman, error) {
	return read[Gearman](st, GearmanPart)
}

// Stale tells whether the status is too old to be the running daemon's.
func (s *Gearman) Stale(now time.Time) bool {
	return !s.Serving || stale(s.Updated, now)
}
