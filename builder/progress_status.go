package builder

import (
	"context"
	"os"

	"github.com/nodepool-builder/nodepool-builder/status"
)

// writeProgress keeps the progress status file fresh until ctx ends, then
// says the daemon stopped.
func (b *Builder) writeProgress(ctx context.Context) {
	f := status.NewFile(b.store, status.ProgressPart, b.log)
	take := func(running bool) *status.Progress {
		s := &status.Progress{Stamp: status.Stamp{PID: os.Getpid()}, Running: running, Tasks: b.opts.Progress.Running()}
		if !running {
			s.Tasks = nil
		}
		return s
	}
	f.Keep(ctx, nil, func() status.Stamped { return take(true) })
	f.Save(take(false))
}
