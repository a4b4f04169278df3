package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"sort"
	"strings"
	"time"
)

// CopyReport says what Copy did.
type CopyReport struct {
	Builds, Uploads, Cursors, Pauses, Requests CopyCount
	// Interrupted counts the builds and uploads copied in state building or
	// uploading: the builder's recovery settles them on its next pass.
	Interrupted int
	// Skipped says what was not copied, and why.
	Skipped []string
}

// CopyCount counts the records of one kind that were copied, and those the
// destination held already.
type CopyCount struct {
	Copied, Present int
}

// Copy copies the state of a SQLite backend into another backend: builds worth
// keeping with all their uploads, poll cursors, run-time pauses and build
// requests. It is idempotent, so that it can run again after it stopped half
// way: a build the destination holds is not created again, nor an upload it
// holds under that build (same provider and cloud image). Leak marks are not
// copied: a leak needs two sightings in the new state too.
//
// Upload ids may change (ZooKeeper numbers uploads as it creates them); each
// build's uploads are created oldest first, so their order stays, and each
// keeps its cloud image's id, by which the leak sweep knows it.
func Copy(ctx context.Context, from *SQLite, to Backend) (CopyReport, error) {
	var r CopyReport
	builds, err := from.Builds(ctx, BuildFilter{})
	if err != nil {
		return r, err
	}
	ups, err := from.Uploads(ctx, UploadFilter{})
	if err != nil {
		return r, err
	}
	byBuild := map[string][]Upload{}
	for _, u := range ups {
		byBuild[u.BuildID] = append(byBuild[u.BuildID], u)
	}
	newest := map[string]string{} // image -> its newest build
	for _, b := range builds {
		if _, ok := newest[b.Image]; !ok {
			newest[b.Image] = b.ID
		}
	}
	// Oldest first, as they were made.
	for i := len(builds) - 1; i >= 0; i-- {
		b := builds[i]
		if b.State == Failed && newest[b.Image] != b.ID && len(byBuild[b.ID]) == 0 {
			r.Skipped = append(r.Skipped, fmt.Sprintf("build %s: failed, and a newer build of %s exists (the builder would delete it)",
				b.Name(), b.Image))
			continue
		}
		if err := copyBuild(ctx, to, b, &r); err != nil {
			return r, err
		}
		if err := copyUploads(ctx, to, b, byBuild[b.ID], &r); err != nil {
			return r, err
		}
	}
	if err := copyCursors(ctx, from, to, &r); err != nil {
		return r, err
	}
	if err := copyFlags(ctx, from.Paused, to.Paused, func(image string) error { return to.SetPaused(ctx, image, true) },
		&r.Pauses); err != nil {
		return r, err
	}
	if err := copyFlags(ctx, from.BuildRequests, to.BuildRequests, func(image string) error { return to.RequestBuild(ctx, image) },
		&r.Requests); err != nil {
		return r, err
	}
	return r, nil
}

func copyBuild(ctx context.Context, to Backend, b Build, r *CopyReport) error {
	_, err := to.Build(ctx, b.ID)
	switch {
	case err == nil:
		r.Builds.Present++
		return nil
	case !errors.Is(err, ErrNotFound):
		return fmt.Errorf("copy build %s: %w", b.Name(), err)
	}
	nb := b
	nb.Version = 0
	if err := to.Write(ctx, PutBuild(&nb)); err != nil {
		return fmt.Errorf("copy build %s: %w", b.Name(), err)
	}
	r.Builds.Copied++
	if b.State == Building {
		r.Interrupted++
	}
	return nil
}

// copyUploads copies a build's uploads that the destination lacks.
func copyUploads(ctx context.Context, to Backend, b Build, ups []Upload, r *CopyReport) error {
	if len(ups) == 0 {
		return nil
	}
	have, err := to.Uploads(ctx, UploadFilter{BuildID: b.ID})
	if err != nil {
		return fmt.Errorf("copy uploads of %s: %w", b.Name(), err)
	}
	taken := make([]bool, len(have))
	ups = append([]Upload(nil), ups...)
	sort.SliceStable(ups, func(i, j int) bool {
		if ups[i].Provider != ups[j].Provider {
			return ups[i].Provider < ups[j].Provider
		}
		return ups[i].ID < ups[j].ID // ids are zero-padded: oldest first
	})
	for _, u := range ups {
		if j := sameUpload(have, taken, u); j >= 0 {
			taken[j] = true
			r.Uploads.Present++
			continue
		}
		nu := u
		nu.ID, nu.Version = "", 0
		if err := to.Write(ctx, PutUpload(&nu)); err != nil {
			return fmt.Errorf("copy upload %s: %w", u, err)
		}
		r.Uploads.Copied++
		if u.State == Uploading {
			r.Interrupted++
		}
	}
	return nil
}

// sameUpload finds the copy of u among a build's uploads in the destination: to
// the same provider with the same cloud image; for an upload that has none
// (failed, or interrupted before its image was made), with the same state,
// format and state time. It returns -1 when there is none.
func sameUpload(have []Upload, taken []bool, u Upload) int {
	for j, h := range have {
		if taken[j] || h.Provider != u.Provider || h.ExternalID != u.ExternalID {
			continue
		}
		if u.ExternalID != "" {
			return j
		}
		// A destination may keep times less precisely (ZooKeeper: float seconds).
		if d := h.StateTime.Sub(u.StateTime); h.State == u.State && h.Format == u.Format && d < time.Millisecond && d > -time.Millisecond {
			return j
		}
	}
	return -1
}

// copyCursors copies the poll cursors the destination lacks, or holds an
// older one of.
func copyCursors(ctx context.Context, from *SQLite, to Backend, r *CopyReport) error {
	cursors, err := from.Cursors(ctx)
	if err != nil {
		return err
	}
	for _, c := range cursors {
		cur, err := to.Cursor(ctx, c.Image)
		if err != nil {
			return err
		}
		if cur.ZuulUUID != "" && cur.ZuulID >= c.ZuulID {
			r.Cursors.Present++
			continue
		}
		if err := to.Write(ctx, PutCursor(c)); err != nil {
			return fmt.Errorf("copy poll cursor of %s: %w", c.Image, err)
		}
		r.Cursors.Copied++
	}
	return nil
}

// copyFlags copies the images flagged in from (paused, or with a build
// request) that are not flagged in to.
func copyFlags(ctx context.Context, from, to func(context.Context) (map[string]time.Time, error), set func(string) error,
	n *CopyCount) error {
	src, err := from(ctx)
	if err != nil {
		return err
	}
	dst, err := to(ctx)
	if err != nil {
		return err
	}
	images := make([]string, 0, len(src))
	for image := range src {
		images = append(images, image)
	}
	sort.Strings(images)
	for _, image := range images {
		if _, ok := dst[image]; ok {
			n.Present++
			continue
		}
		if err := set(image); err != nil {
			return err
		}
		n.Copied++
	}
	return nil
}

// SQLiteContents says what a SQLite state holds, for a builder that keeps its
// state elsewhere: records of a state that was never moved would be lost.
type SQLiteContents struct {
	Builds, Uploads, Cursors, Paused, Requests int
	// MovedTo says where the state was copied to (SQLite.MarkMoved); "" when
	// it was not.
	MovedTo string
}

// Empty tells whether the state holds no record.
func (c SQLiteContents) Empty() bool {
	return c.Builds+c.Uploads+c.Cursors+c.Paused+c.Requests == 0
}

// String lists the records, as "2 builds, 4 uploads and 1 poll cursor".
func (c SQLiteContents) String() string {
	var parts []string
	for _, n := range []struct {
		n    int
		what string
	}{{c.Builds, "build"}, {c.Uploads, "upload"}, {c.Cursors, "poll cursor"}, {c.Paused, "paused image"},
		{c.Requests, "build request"}} {
		switch {
		case n.n == 1:
			parts = append(parts, "1 "+n.what)
		case n.n > 1:
			parts = append(parts, fmt.Sprintf("%d %ss", n.n, n.what))
		}
	}
	switch len(parts) {
	case 0:
		return "no records"
	case 1:
		return parts[0]
	}
	return strings.Join(parts[:len(parts)-1], ", ") + " and " + parts[len(parts)-1]
}

// ReadSQLiteContents counts the records of the SQLite state at path, of any
// schema version, without changing it; the zero value when there is no file.
func ReadSQLiteContents(ctx context.Context, path string) (SQLiteContents, error) {
	var c SQLiteContents
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return c, nil
	} else if err != nil {
		return c, fmt.Errorf("read state database %s: %w", path, err)
	}
	q := url.Values{}
	q.Set("mode", "ro")
	q.Add("_pragma", "busy_timeout(10000)")
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return c, fmt.Errorf("read state database %s: %w", path, err)
	}
	defer db.Close()
	rows, err := db.QueryContext(ctx, `SELECT name FROM sqlite_master WHERE type = 'table'`)
	if err != nil {
		return c, fmt.Errorf("read state database %s: %w", path, err)
	}
	tables := map[string]bool{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return c, fmt.Errorf("read state database %s: %w", path, err)
		}
		tables[name] = true
	}
	err = rows.Err()
	rows.Close()
	if err != nil {
		return c, fmt.Errorf("read state database %s: %w", path, err)
	}
	for table, n := range map[string]*int{"builds": &c.Builds, "uploads": &c.Uploads, "poll_cursors": &c.Cursors,
		"paused_images": &c.Paused, "build_requests": &c.Requests} {
		if !tables[table] {
			continue // an older schema
		}
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+table).Scan(n); err != nil {
			return c, fmt.Errorf("read state database %s: %w", path, err)
		}
	}
	if tables["meta"] {
		err := db.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = ?`, metaMovedTo).Scan(&c.MovedTo)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return c, fmt.Errorf("read state database %s: %w", path, err)
		}
	}
	return c, nil
}
