package builder

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/store/zookeeper"
)

// StateOptions say how to open the state of a config.
type StateOptions struct {
	Access store.Access
	Logger *slog.Logger
	// Register makes this process a builder component in ZooKeeper: the
	// builder itself, not a listing or an admin command.
	Register bool
	Version  string
}

// OpenState opens the images-dir and the state of a config: in ZooKeeper when
// zookeeper-servers are set, else in SQLite.
func OpenState(ctx context.Context, cfg *config.Config, opts StateOptions) (*store.Store, error) {
	sopts := store.Options{ImagesDir: cfg.ImagesDir, DBPath: cfg.Builder.StateDB, Access: opts.Access}
	if cfg.ZooKeeper == nil {
		return store.Open(ctx, sopts)
	}
	// The images-dir is checked before a connection is made.
	if opts.Access != store.Create {
		if fi, err := os.Stat(cfg.ImagesDir); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("images-dir %s does not exist or is not a directory: %w", cfg.ImagesDir, store.ErrNotInitialized)
		}
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

// OpenZooKeeper connects to the cluster of a config.
func OpenZooKeeper(ctx context.Context, zc *config.ZooKeeper, opts StateOptions) (*zookeeper.Backend, error) {
	var servers []string
	for _, s := range zc.Servers {
		servers = append(servers, net.JoinHostPort(s.Host, strconv.Itoa(s.Port)))
	}
	zopts := zookeeper.Options{Servers: servers, Chroot: zc.Servers[0].Chroot, Timeout: zc.Timeout, Logger: opts.Logger,
		Version: opts.Version}
	if opts.Register {
		zopts.Hostname, _ = os.Hostname()
	}
	if zc.TLS != nil {
		tc, err := zooKeeperTLS(zc.TLS)
		if err != nil {
			return nil, fmt.Errorf("%w: zookeeper-tls: %w", ErrConfig, err)
		}
		zopts.TLS = tc
	}
	return zookeeper.Open(ctx, zopts)
}

// zooKeeperTLS is the TLS of nodepool's zookeeper-tls: the client certificate
// and key, and the CA the servers' certificates are checked against.
func zooKeeperTLS(t *config.ZooKeeperTLS) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(t.Cert, t.Key)
	if err != nil {
		return nil, fmt.Errorf("load the client certificate %s and key %s: %w", t.Cert, t.Key, err)
	}
	pem, err := os.ReadFile(t.CA)
	if err != nil {
		return nil, fmt.Errorf("read the CA %s: %w", t.CA, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("the CA file %s holds no PEM certificate", t.CA)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}
