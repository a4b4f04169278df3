package builder

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/nodepool-builder/nodepool-builder/store"
)

// statusEvery is how often a status file is written while nothing changes, so
// that its time says the daemon is alive; one three times as old is stale.
const statusEvery = 30 * time.Second

// stamped is a status that carries the time it was written.
type stamped interface{ stamp(time.Time) }

// statusFile is a file of the images-dir in which the daemon leaves what one of
// its parts does, for image-status (another process) to show. The store owns
// its path; it is replaced whole, so a reader sees the old or the new one.
type statusFile struct {
	store *store.Store
	part  string
	log   *slog.Logger

	last    []byte // what the last write said, without its time
	written time.Time
}

// keep writes the status that take returns until ctx ends: when what it says
// changed, looked at every second and when changed fires, and every
// statusEvery anyway. take leaves the time of writing zero.
func (f *statusFile) keep(ctx context.Context, changed <-chan struct{}, take func() stamped) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		s := take()
		body, _ := json.Marshal(s)
		if !bytes.Equal(body, f.last) || time.Since(f.written) >= statusEvery {
			f.save(s)
			f.last, f.written = body, time.Now()
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-t.C:
		}
	}
}

// save writes s now, stamped with the time, and logs a failure: the work goes
// on without its status shown.
func (f *statusFile) save(s stamped) {
	s.stamp(time.Now().UTC())
	data, err := json.MarshalIndent(s, "", "  ")
	if err == nil {
		err = f.store.WriteStatus(f.part, append(data, '\n'))
	}
	if err != nil {
		f.log.Warn("could not write the "+f.part+" status file", "error", err)
	}
}

// readStatus reads a part's status file into s; false when there is none.
func readStatus(st *store.Store, part string, s any) (bool, error) {
	path := st.StatusPath(part)
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if err := json.Unmarshal(data, s); err != nil {
		return false, fmt.Errorf("read %s: %w", path, err)
	}
	return true, nil
}

// stale tells whether a status written at updated is too old to be the
// running daemon's.
func stale(updated, now time.Time) bool {
	return now.Sub(updated) > 3*statusEvery
}
