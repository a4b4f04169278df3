package builder

import (
	"context"
	"os"
	"time"

	"github.com/nodepool-builder/nodepool-builder/progress"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// progressStatusPart names the progress status file in the images-dir.
const progressStatusPart = "progress"

// ProgressStatus is the long work the daemon runs now (downloads, uploads,
// builds), as it leaves it in the images-dir for image-status.
type ProgressStatus struct {
	Updated time.Time `json:"updated"`
	PID     int       `json:"pid"`
	// Running is false once the daemon stopped.
	Running bool              `json:"running"`
	Tasks   []progress.Status `json:"tasks"`
}

func (s *ProgressStatus) stamp(t time.Time) { s.Updated = t }

// writeProgress keeps the progress status file fresh until ctx ends, then
// says the daemon stopped.
func (b *Builder) writeProgress(ctx context.Context) {
	f := &statusFile{store: b.store, part: progressStatusPart, log: b.log}
	take := func(running bool) *ProgressStatus {
		s := &ProgressStatus{PID: os.Getpid(), Running: running, Tasks: b.opts.Progress.Running()}
		if !running {
			s.Tasks = nil
		}
		return s
	}
	f.keep(ctx, nil, func() stamped { return take(true) })
	f.save(take(false))
}

// ReadProgress reads what the daemon last said of the long work it runs; nil
// when it never said anything.
func ReadProgress(st *store.Store) (*ProgressStatus, error) {
	var s ProgressStatus
	if ok, err := readStatus(st, progressStatusPart, &s); !ok {
		return nil, err
	}
	return &s, nil
}

// Stale tells whether the status is too old to be the running daemon's.
func (s *ProgressStatus) Stale(now time.Time) bool {
	return !s.Running || stale(s.Updated, now)
}
