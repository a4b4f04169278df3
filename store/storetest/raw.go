package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/store"
)

// Raw is the backend of a store a test opened, at the test's hand: it writes
// the records a test sets up as they are, past the store's named operations,
// which are the only ways product code changes a record.
type Raw struct {
	store.Backend
	// Now is the store's clock, for the state times Raw writes.
	Now func() time.Time
}

// SetBuildState moves a build, as read, to a state: compare-and-set on its
// version, as a step of the builder would.
func (r Raw) SetBuildState(ctx context.Context, b *store.Build, st store.State, reason string) error {
	next := *b
	next.SetState(st, r.Now())
	next.Reason = reason
	if err := r.Write(ctx, store.PutBuild(&next)); err != nil {
		return fmt.Errorf("set build %s %s: %w", b.Name(), st, err)
	}
	*b = next
	return nil
}

// Open opens a store as store.Open does with opts and returns it with its
// backend: opts.Backend when set, else the SQLite state the store opened. The
// test closes the store.
func Open(t testing.TB, opts store.Options) (*store.Store, Raw) {
	t.Helper()
	st, err := store.Open(context.Background(), opts)
	if err != nil {
		if opts.Backend != nil {
			opts.Backend.Close()
		}
		t.Fatal(err)
	}
	backend := opts.Backend
	if sq, ok := st.SQLite(); ok {
		backend = sq
	}
	return st, Raw{Backend: backend, Now: st.Now}
}
