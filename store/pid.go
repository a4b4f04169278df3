package store

import (
	"context"
	"fmt"
)

// SetBuildPID records the process that is building a build. A build's record is
// made before its build process starts, so the pid is only known afterwards.
func (s *Store) SetBuildPID(ctx context.Context, id string, pid int) error {
	res, err := s.db.ExecContext(ctx, `UPDATE builds SET pid = ? WHERE id = ?`, pid, id)
	if err != nil {
		return fmt.Errorf("record pid of build %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("record pid of build %s: %w", id, ErrNotFound)
	}
	return nil
}
