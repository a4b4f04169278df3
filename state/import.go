package state

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// ImportReport says what ImportToZooKeeper did.
type ImportReport struct {
	store.CopyReport
	From      string // the SQLite state
	To        string // the cluster and chroot
	BuilderID string
	// MovedAt is set when an earlier import had copied the state: this one
	// copied nothing.
	MovedAt time.Time
}

// NoZooKeeper is the error of a config without zookeeper-servers, for a
// command that needs them: it names the files that could set them.
func NoZooKeeper(cfg *config.Config) error {
	lacks := cfg.Path + " has no zookeeper-servers"
	if cfg.SecurePath != "" {
		lacks = "neither " + cfg.Path + " nor the secure file " + cfg.SecurePath + " has zookeeper-servers"
	}
	return fmt.Errorf("%w: %s: add the cluster to copy the state into (zookeeper-servers, and zookeeper-tls when it "+
		"serves TLS), then run zookeeper-import again", config.ErrUnusable, lacks)
}

// ImportToZooKeeper copies the SQLite state of a config's images-dir into the
// config's ZooKeeper (store.Copy), then marks it moved, so that the builder
// keeps its uploads when it starts keeping its state in ZooKeeper. The caller
// holds the images-dir lock: the state must not change while it is copied.
//
// A state marked moved is not copied again: the builder may have deleted
// some of its records from ZooKeeper since, and a copy would bring them back.
func ImportToZooKeeper(ctx context.Context, cfg *config.Config, opts Options) (ImportReport, error) {
	r := ImportReport{From: cfg.Builder.StateDB}
	if cfg.ZooKeeper == nil {
		return r, NoZooKeeper(cfg)
	}
	r.To = zooKeeperName(cfg.ZooKeeper)
	if cfg.ImagesDir == "" || r.From == "" {
		return r, fmt.Errorf("%w: %s: images-dir is not set, so there is no SQLite state to import", config.ErrUnusable, cfg.Path)
	}
	if _, err := os.Stat(r.From); errors.Is(err, os.ErrNotExist) {
		return r, fmt.Errorf("no SQLite state at %s, so nothing to import: %w; check images-dir (and builder.state-db) in %s",
			r.From, store.ErrNotInitialized, cfg.Path)
	}
	// Opened so, it is brought to the current schema and bound to the
	// images-dir's builder id, which the copied builds keep.
	st, err := store.Open(ctx, store.Options{ImagesDir: cfg.ImagesDir, DBPath: r.From, Access: store.Create})
	if err != nil {
		return r, err
	}
	defer st.Close()
	r.BuilderID = st.BuilderID()
	sq, ok := st.SQLite()
	if !ok {
		return r, errors.New("zookeeper-import: the state is not a SQLite one")
	}
	movedTo, at, err := sq.Moved(ctx)
	if err != nil {
		return r, err
	}
	if movedTo != "" {
		r.To, r.MovedAt = movedTo, at
		return r, nil
	}
	zk, err := OpenZooKeeper(ctx, cfg.ZooKeeper, opts)
	if err != nil {
		return r, err
	}
	defer zk.Close()
	r.CopyReport, err = store.Copy(ctx, sq, zk)
	if err != nil {
		return r, fmt.Errorf("copy %s to ZooKeeper %s: %w; what was copied stays, and zookeeper-import copies the rest when "+
			"run again", r.From, r.To, err)
	}
	if err := sq.MarkMoved(ctx, r.To); err != nil {
		return r, fmt.Errorf("%w; everything was copied: run zookeeper-import again to mark it", err)
	}
	return r, nil
}

// zooKeeperName names a cluster and its chroot, as host:port,host:port/chroot.
func zooKeeperName(zc *config.ZooKeeper) string {
	return strings.Join(zooKeeperServers(zc), ",") + zc.Servers[0].Chroot
}
