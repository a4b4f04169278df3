// Package state opens the images-dir and the state of a config (in ZooKeeper,
// over TLS when it says so, or in SQLite), for the daemon and every command,
// and copies a SQLite state to ZooKeeper (zookeeper-import).
package state

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/store/zookeeper"
)

// Options say how to open the state of a config.
type Options struct {
	Access store.Access
	Logger *slog.Logger
	// Register makes this process a builder component in ZooKeeper: the
	// builder itself, not a listing or an admin command.
	Register bool
	Version  string
	// TakeOver opens (with store.Create) an images-dir that another builder
	// used as this builder's own: see store.Options.TakeOver.
	TakeOver bool
	// StateOnly says the caller reads records only, none of the images-dir's
	// files: with ZooKeeper the images-dir then need not exist (a listing run
	// on an operator's workstation, or on the launcher's host). With SQLite the
	// state is in the images-dir, which must exist all the same.
	StateOnly bool
}

// OpenState opens the images-dir and the state of a config: in ZooKeeper when
// zookeeper-servers are set, else in SQLite.
func Open(ctx context.Context, cfg *config.Config, opts Options) (*store.Store, error) {
	sopts := store.Options{ImagesDir: cfg.ImagesDir, DBPath: cfg.Builder.StateDB, Access: opts.Access, TakeOver: opts.TakeOver,
		Logger: opts.Logger}
	if cfg.ZooKeeper == nil {
		return openSQLiteState(ctx, cfg, sopts)
	}
	// The images-dir is checked before a connection is made.
	if opts.Access != store.Create && !opts.StateOnly {
		if fi, err := os.Stat(cfg.ImagesDir); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("images-dir %s does not exist or is not a directory: %w", cfg.ImagesDir, store.ErrNotInitialized)
		}
	}
	if err := checkSQLiteMoved(ctx, cfg); err != nil {
		return nil, err
	}
	backend, err := OpenZooKeeper(ctx, cfg.ZooKeeper, opts)
	if err != nil {
		return nil, err
	}
	sopts.Backend = backend
	st, err := store.Open(ctx, sopts)
	if err != nil {
		backend.Close()
		return nil, err
	}
	return st, nil
}

// openSQLiteState opens the SQLite state, unless an import copied it to
// ZooKeeper: it is stale then, and the builder's uploads are tracked there.
func openSQLiteState(ctx context.Context, cfg *config.Config, sopts store.Options) (*store.Store, error) {
	st, err := store.Open(ctx, sopts)
	if err != nil {
		return nil, err
	}
	sq, ok := st.SQLite()
	if !ok {
		return st, nil
	}
	to, at, err := sq.Moved(ctx)
	if err != nil {
		st.Close()
		return nil, err
	}
	if to != "" {
		st.Close()
		return nil, fmt.Errorf("%w: the state database %s was copied to ZooKeeper %s on %s (zookeeper-import) and is out "+
			"of date: this builder keeps its state there now. Put zookeeper-servers back in %s%s; or, to start over with "+
			"SQLite, remove or rename %s (the builder then knows none of its cloud images and deletes them as leaks)",
			config.ErrUnusable, cfg.Builder.StateDB, to, at.Format(time.RFC3339), cfg.Path, orSecure(cfg), cfg.Builder.StateDB)
	}
	return st, nil
}

// checkSQLiteMoved refuses a ZooKeeper config while the images-dir holds a
// SQLite state with records that was not copied there: the builder would lose
// track of its uploads, re-upload them, and delete their cloud images as leaks.
func checkSQLiteMoved(ctx context.Context, cfg *config.Config) error {
	if cfg.Builder.StateDB == "" {
		return nil
	}
	c, err := store.ReadSQLiteContents(ctx, cfg.Builder.StateDB)
	if err != nil {
		return fmt.Errorf("check for a SQLite state before using ZooKeeper: %w", err)
	}
	if c.MovedTo != "" || c.Empty() {
		return nil
	}
	return fmt.Errorf("%w: %s sets zookeeper-servers, but the SQLite state %s of this images-dir holds %s that are not "+
		"in ZooKeeper. Stop the builder and run nodepool-builder %s zookeeper-import to copy them there (the uploads "+
		"stay in the clouds and are kept); or, if that state is to be dropped, remove or rename %s (the builder then "+
		"knows none of its cloud images and deletes them as leaks)",
		config.ErrUnusable, cfg.ZooKeeper.ServersFile, cfg.Builder.StateDB, c, cfg.Files.Flags(), cfg.Builder.StateDB)
}

// orSecure names the secure file as the other place ZooKeeper settings go,
// when there is one.
func orSecure(cfg *config.Config) string {
	if cfg.SecurePath == "" {
		return ""
	}
	return " (or the secure file " + cfg.SecurePath + ")"
}

// OpenZooKeeper connects to the cluster of a config.
func OpenZooKeeper(ctx context.Context, zc *config.ZooKeeper, opts Options) (*zookeeper.Backend, error) {
	zopts := zookeeper.Options{Servers: zooKeeperServers(zc), Chroot: zc.Servers[0].Chroot, Timeout: zc.Timeout, Logger: opts.Logger,
		Version: opts.Version, Snapshot: opts.Access == store.ReadOnly}
	if opts.Register {
		zopts.Hostname, _ = os.Hostname()
	}
	if zc.TLS != nil {
		tc, err := ZooKeeperTLS(zc.TLS)
		if err != nil {
			return nil, fmt.Errorf("%w: zookeeper-tls: %w", config.ErrUnusable, err)
		}
		zopts.TLS, zopts.TLSCAFile = tc, zc.TLS.CA
	}
	return zookeeper.Open(ctx, zopts)
}

// zooKeeperServers are the host:port addresses of a cluster.
func zooKeeperServers(zc *config.ZooKeeper) []string {
	var servers []string
	for _, s := range zc.Servers {
		servers = append(servers, net.JoinHostPort(s.Host, strconv.Itoa(s.Port)))
	}
	return servers
}

// ZooKeeperTLS is the TLS of nodepool's zookeeper-tls: the client certificate
// and key, and the CA the servers' certificates are checked against (by the
// ZooKeeper backend, as nodepool checks them). When both are wrong, the error
// says both.
func ZooKeeperTLS(t *config.ZooKeeperTLS) (*tls.Config, error) {
	var errs []error
	cert, err := tls.LoadX509KeyPair(t.Cert, t.Key)
	if err != nil {
		errs = append(errs, fmt.Errorf("load the client certificate %s and key %s: %w", t.Cert, t.Key, err))
	}
	pool := x509.NewCertPool()
	if pem, err := os.ReadFile(t.CA); err != nil {
		errs = append(errs, fmt.Errorf("read the CA %s: %w", t.CA, err))
	} else if !pool.AppendCertsFromPEM(pem) {
		errs = append(errs, fmt.Errorf("the CA file %s holds no PEM certificate", t.CA))
	}
	switch len(errs) {
	case 1:
		return nil, errs[0]
	case 2:
		return nil, fmt.Errorf("%w; and %w", errs[0], errs[1])
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}
