// Package status holds the files of the images-dir in which a running daemon
// leaves what its parts do (the long work under way, its gearman worker, its
// listener to Zuul's MQTT reports), for image-status and the status pages of
// other processes to read: their types, how they are kept fresh and how they
// are read. It links neither the daemon nor its parts, so that the commands
// that only read the files do not either.
package status

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

// Every is how often a status file is written while nothing changes, so that
// its time says the daemon is alive; one three times as old is stale.
const Every = 30 * time.Second

// Stamped is a status that carries the time it was written.
type Stamped interface{ stamp(time.Time) }

// Stamp is what every status file says of its writing: when, and by which
// process. A status embeds it.
type Stamp struct {
	Updated time.Time `json:"updated"`
	PID     int       `json:"pid"`
}

func (s *Stamp) stamp(t time.Time) { s.Updated = t }

// File is a status file of the images-dir. The store owns its path; it is
// replaced whole, so a reader sees the old or the new one.
type File struct {
	store *store.Store
	part  string
	log   *slog.Logger

	last    []byte // what the last write said, without its time
	written time.Time
}

// NewFile is the status file of one part of the daemon.
func NewFile(st *store.Store, part string, log *slog.Logger) *File {
	return &File{store: st, part: part, log: log}
}

// Keep writes the status that take returns until ctx ends: when what it says
// changed, looked at every second and when changed fires, and every Every
// anyway. take leaves the time of writing zero.
func (f *File) Keep(ctx context.Context, changed <-chan struct{}, take func() Stamped) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		s := take()
		body, _ := json.Marshal(s)
		if !bytes.Equal(body, f.last) || time.Since(f.written) >= Every {
			f.Save(s)
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

// Save writes s now, stamped with the time, and logs a failure: the work goes
// on without its status shown.
func (f *File) Save(s Stamped) {
	s.stamp(time.Now().UTC())
	data, err := json.MarshalIndent(s, "", "  ")
	if err == nil {
		err = f.store.WriteStatus(f.part, append(data, '\n'))
	}
	if err != nil {
		f.log.Warn("could not write the "+f.part+" status file", "error", err)
	}
}

// read reads a part's status file; nil when there is none.
func read[T any](st *store.Store, part string) (*T, error) {
	path := st.StatusPath(part)
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var s T
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return &s, nil
}

// stale tells whether a status written at updated is too old to be the
// running daemon's.
func stale(updated, now time.Time) bool {
	return now.Sub(updated) > 3*Every
}
