package status

import (
	"time"

	"github.com/nodepool-builder/nodepool-builder/progress"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// ProgressPart names the progress status file in the images-dir.
const ProgressPart = "progress"

// Progress is the long work the daemon runs now (downloads, uploads, builds),
// as it leaves it in the images-dir for image-status.
type Progress struct {
	Stamp
	// Running is false once the daemon stopped.
	Running bool              `json:"running"`
	Tasks   []progress.Status `json:"tasks"`
}

// ReadProgress reads what the daemon last said of the long work it runs; nil
// when it never said anything.
func ReadProgress(st *store.Store) (*Progress, error) {
	return read[Progress](st, ProgressPart)
}

// Stale tells whether the status is too old to be the running daemon's.
func (s *Progress) Stale(now time.Time) bool {
	return !s.Running || stale(s.Updated, now)
}
