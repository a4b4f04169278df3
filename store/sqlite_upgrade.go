package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/fsync"
)

// schemaCopyPath is where the SQLite state at path is copied before its schema
// is upgraded from version v: beside it, named with v, so that a builder of
// that version finds the copy it can go back to.
func schemaCopyPath(path string, v int) string {
	return fmt.Sprintf("%s.schema-%d", path, v)
}

// keepCopy copies the whole state, as SQLite reads it (the WAL's pages
// included), to schemaCopyPath before a migration from version v changes it,
// with the state's mode and owner. An existing copy of v is kept: it is the
// one made before any change. Without a copy the migration does not run.
func (s *SQLite) keepCopy(ctx context.Context, v int) error {
	dst := schemaCopyPath(s.path, v)
	fail := func(err error) error {
		return fmt.Errorf("keep a copy of the state at %s before upgrading its schema from version %d to %d: %w. "+
			"The schema was not upgraded and the state was not changed: free space in %s (the copy takes about "+
			"what the state and its -wal file take) or fix the cause, and start the builder again",
			dst, v, len(migrations), err, filepath.Dir(dst))
	}
	if fi, err := os.Lstat(dst); err == nil {
		s.log.Info("kept the copy of the state made before an earlier upgrade of its schema", "copy", dst,
			"made", fi.ModTime().UTC().Format(time.RFC3339), "from_version", v, "to_version", len(migrations))
		return nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return fail(err)
	}
	state, err := os.Stat(s.path)
	if err != nil {
		return fail(err)
	}
	tmp := dst + ".tmp"
	// What a start that stopped half way left.
	if err := removeCopyTemp(tmp); err != nil {
		return fail(err)
	}
	if err := s.writeCopy(ctx, state, tmp); err != nil {
		return fail(errors.Join(err, removeCopyTemp(tmp)))
	}
	if err := os.Rename(tmp, dst); err != nil {
		return fail(errors.Join(err, removeCopyTemp(tmp)))
	}
	if err := fsync.Dir(filepath.Dir(dst)); err != nil {
		return fail(err)
	}
	s.log.Info("copied the state before upgrading its schema", "copy", dst, "from_version", v, "to_version", len(migrations))
	return nil
}

// newerSchema is the error for a state of schema version v, which a newer
// builder upgraded. It names the copy this program can go back to, when there
// is one: of its own version, else the newest of an older one, which it would
// upgrade.
func (s *SQLite) newerSchema(v int) error {
	msg := fmt.Sprintf("schema version %d is newer than this program knows (%d): a newer nodepool-builder upgraded it; "+
		"use that version", v, len(migrations))
	for old := len(migrations); old > 0; old-- {
		c := schemaCopyPath(s.path, old)
		if fi, err := os.Stat(c); err != nil || !fi.Mode().IsRegular() {
			continue
		}
		msg += fmt.Sprintf(". Or, to go back to this version, stop the builder, move %s and its -wal and -shm files "+
			"aside, and move %s, the copy made before the schema was upgraded from version %d, to %s: what the "+
			"builder recorded since is lost (see \"Going back to an older version\" in the upgrading docs)", s.path, c, old, s.path)
		break
	}
	return errors.New(msg)
}

// writeCopy writes the state into a new file at tmp, of the state's mode and
// owner, and syncs it.
func (s *SQLite) writeCopy(ctx context.Context, state os.FileInfo, tmp string) error {
	// VACUUM INTO writes into an empty file that exists: made here, it has the
	// state's mode and owner from the start.
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, state.Mode().Perm())
	if err != nil {
		return err
	}
	err = f.Chmod(state.Mode().Perm()) // the umask took some of it
	if err == nil {
		err = sameOwner(f, state)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if _, err := s.db.ExecContext(ctx, `VACUUM INTO ?`, tmp); err != nil {
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	return fsync.File(tmp)
}

// sameOwner gives f the owner and group of the file that fi describes, when
// they differ.
func sameOwner(f *os.File, fi os.FileInfo) error {
	want, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	ffi, err := f.Stat()
	if err != nil {
		return err
	}
	if have, ok := ffi.Sys().(*syscall.Stat_t); ok && have.Uid == want.Uid && have.Gid == want.Gid {
		return nil
	}
	if err := f.Chown(int(want.Uid), int(want.Gid)); err != nil {
		return fmt.Errorf("give the copy the state's owner %d:%d: %w", want.Uid, want.Gid, err)
	}
	return nil
}

// removeCopyTemp removes the temporary file of a copy and the journal SQLite
// may have left beside it.
func removeCopyTemp(tmp string) error {
	var errs []error
	for _, p := range []string{tmp, tmp + "-journal", tmp + "-wal", tmp + "-shm"} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
