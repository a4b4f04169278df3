// Package zookeeper keeps the builder's state in ZooKeeper in nodepool's own
// schema, so that nodepool-launcher boots our uploads and several builders, ours
// and Python ones, share the work under kazoo-compatible locks.
package zookeeper

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/z-division/go-zookeeper/zk"

	"github.com/nodepool-builder/nodepool-builder/store"
)

// Options say which cluster to use and how.
type Options struct {
	// Servers are host:port addresses of the cluster.
	Servers []string
	// Chroot is a path every znode lives under ("" or like /nodepool-test).
	Chroot string
	// TLS, when set, makes every connection TLS with this config: the client
	// certificate, and in RootCAs the only CAs a server's certificate may come
	// from, as nodepool's zookeeper-tls. A server's certificate is checked as
	// nodepool's client checks it (see tlsDialer), not as Go would.
	TLS *tls.Config
	// TLSCAFile is the file TLS's RootCAs were read from, named when a
	// server's certificate is refused.
	TLSCAFile string
	// Timeout is the session timeout; default 10s, as nodepool's.
	Timeout time.Duration
	// Hostname, when set, registers this process as a builder component under
	// /nodepool/components/builder, as nodepool's builders do.
	Hostname string
	// Version is registered with it.
	Version string
	// Snapshot reads the records once and sets no watches: for a command
	// that reads and exits (a listing), whose cache needs no updates, and
	// leaves the server no watches to register and drop.
	Snapshot bool
	Logger   *slog.Logger
	Now      func() time.Time
}

// Backend is a store.Backend in ZooKeeper.
type Backend struct {
	opts Options
	log  *slog.Logger
	// logGate silences log once the backend is closed.
	logGate *logGate
	conn    *zk.Conn
	now     func() time.Time

	cache *cache
	locks *lockSet

	// lastFailure is why the last connection attempt failed.
	lastFailure atomic.Value

	mu         sync.Mutex
	registered string // the component znode, once registered
	closed     bool
	adrift     *time.Timer   // runs while disconnected; at the session timeout, locks count as lost
	hadSession bool          // a session was had: a lost connection is then news
	done       chan struct{} // closed by Close
}

var _ store.Backend = (*Backend)(nil)

// Paths of nodepool's schema and of ours.
const (
	imageRoot     = "/nodepool/images"
	componentRoot = "/nodepool/components/builder"
	// ourRoot holds what nodepool has no node for: poll cursors, leak marks.
	ourRoot = "/nodepool-builder"
	// extraNode is the child of a build or upload znode that holds our fields
	// nodepool has none for. Python nodepool ignores it (its cache parses paths
	// by depth) and deletes it with its parent.
	extraNode = "nodepool-builder"
	lockNode  = "lock"
)

// ErrUnreachable is wrapped by Open's error when no server of the cluster
// answered within the session timeout.
var ErrUnreachable = errors.New("ZooKeeper cannot be reached")

// Open connects to the cluster, loads the image records into a cache that
// watches keep fresh, and registers this builder as a nodepool component.
func Open(ctx context.Context, opts Options) (*Backend, error) {
	if len(opts.Servers) == 0 {
		return nil, errors.New("open ZooKeeper: no servers")
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 10 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	gate := &logGate{}
	log := slog.New(quietAfterClose{opts.Logger.Handler(), gate}).With("zookeeper", strings.Join(opts.Servers, ","))
	b := &Backend{opts: opts, log: log, logGate: gate, now: opts.Now, done: make(chan struct{})}
	b.cache = newCache(b)
	b.locks = newLockSet(b)
	connected, err := b.connect(ctx)
	if err != nil {
		return nil, err
	}
	if err := b.awaitSession(ctx, connected); err != nil {
		return nil, err
	}
	if err := b.prepare(); err != nil {
		b.abort()
		return nil, err
	}
	return b, nil
}

// connect starts the client, which connects in the background; the channel
// tells when it has a session. The client retries a failed connection until
// the session timeout and says why only in its log: the last reason is kept
// for awaitSession's error.
func (b *Backend) connect(ctx context.Context) (<-chan struct{}, error) {
	connected := make(chan struct{}, 1)
	logOpt := zk.WithLogger(zkLogger{b})
	eventOpt := zk.WithEventCallback(func(ev zk.Event) {
		if ev.Type == zk.EventSession && ev.State == zk.StateHasSession {
			select {
			case connected <- struct{}{}:
			default:
			}
		}
		b.event(ev)
	})
	servers, err := resolveServers(ctx, b.opts.Servers, net.DefaultResolver.LookupHost, b.log)
	if err != nil {
		return nil, err
	}
	dial := func(ctx context.Context, address string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", address)
	}
	if b.opts.TLS != nil {
		d := newTLSDialer(b.opts.TLS, b.opts.TLSCAFile, b.log)
		dial = func(ctx context.Context, address string) (net.Conn, error) {
			return d.dial(ctx, address, servers.host(address))
		}
	}
	dialOpt := zk.WithDialer(func(_, address string, timeout time.Duration) (net.Conn, error) {
		dctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		c, err := dial(dctx, address)
		if err != nil {
			b.lastFailure.Store(err.Error())
		}
		return c, err
	})
	conn, _, err := zk.Connect(b.opts.Servers, b.opts.Timeout, logOpt, eventOpt, dialOpt, zk.WithHostProvider(servers))
	if err != nil {
		return nil, fmt.Errorf("connect to ZooKeeper at %s: %w", strings.Join(b.opts.Servers, ", "), err)
	}
	b.conn = conn
	return connected, nil
}

// awaitSession waits for the first session, within the session timeout or
// until ctx ends; when there is none, it ends the connection, since Open
// returns no Backend to close.
func (b *Backend) awaitSession(ctx context.Context, connected <-chan struct{}) error {
	t := time.NewTimer(b.opts.Timeout)
	defer t.Stop()
	select {
	case <-connected:
		return nil
	case <-t.C:
		b.abort()
		last, _ := b.lastFailure.Load().(string)
		return unreachable(b.opts.Servers, b.opts.Timeout, last)
	case <-ctx.Done():
		b.abort()
		return ctx.Err()
	}
}

// unreachable is the error of an Open that had no session within timeout,
// with the last reason a connection failed, if one is known: the client
// retries quietly, and without it the operator would not know why.
func unreachable(servers []string, timeout time.Duration, lastFailure string) error {
	why := ""
	if lastFailure != "" {
		why = " (last: " + lastFailure + ")"
	}
	return fmt.Errorf("%w: no session with %s within %s%s; check zookeeper-servers and zookeeper-tls, and that the cluster runs",
		ErrUnreachable, strings.Join(servers, ", "), timeout, why)
}

// prepare makes what a connected builder needs before it serves: the roots of
// nodepool's schema and of ours, the cache of the image records, and, with a
// hostname, this builder's component registration.
func (b *Backend) prepare() error {
	for _, p := range []string{imageRoot, componentRoot, ourRoot + "/cursors", ourRoot + "/leaks"} {
		if err := b.ensure(p); err != nil {
			return fmt.Errorf("prepare ZooKeeper: %w", err)
		}
	}
	if err := b.cache.load(); err != nil {
		return fmt.Errorf("read the image records from ZooKeeper: %w", err)
	}
	if b.opts.Hostname != "" {
		return b.register()
	}
	return nil
}

// abort ends the connection of an Open that failed.
func (b *Backend) abort() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	close(b.done)
	b.cache.stop()
	b.conn.Close()
	b.logGate.close()
}

// Close unregisters the builder and ends the session, which drops every lock.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	if b.adrift != nil {
		b.adrift.Stop()
	}
	b.mu.Unlock()
	close(b.done)
	b.cache.stop()
	b.conn.Close()
	b.logGate.close()
	return nil
}

// Connected tells whether the session with the cluster is up now.
func (b *Backend) Connected() bool { return b.conn.State() == zk.StateHasSession }

// event handles what the connection reports: watch events go to the cache; a
// session that expired takes every lock and ephemeral node with it.
func (b *Backend) event(ev zk.Event) {
	if ev.Type != zk.EventSession {
		if ev.Path != "" {
			b.cache.changed(b.unroot(ev.Path), ev.Type)
		}
		return
	}
	switch ev.State {
	case zk.StateExpired:
		b.log.Warn("ZooKeeper session expired: every lock held is lost; work under them stops")
		// Its watches went with it; the client tells so only on the channels
		// of each watch, which the cache does not read.
		b.cache.watchesLost()
		b.locks.lost()
	case zk.StateHasSession:
		b.mu.Lock()
		b.hadSession = true
		if b.adrift != nil {
			b.adrift.Stop()
			b.adrift = nil
			b.log.Info("ZooKeeper connection back")
		}
		b.mu.Unlock()
		// A new session after an expiry: the cache and the registration are
		// rebuilt, since every watch and ephemeral node of the old one is gone.
		if b.cache.needsReload() {
			go b.resync()
		}
	case zk.StateDisconnected:
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.closed || !b.hadSession || b.adrift != nil {
			return // a first connection failing is Open's to report
		}
		b.log.Warn("ZooKeeper connection lost; reconnecting")
		// What failed before the loss is not why the reconnects fail.
		b.lastFailure.Store("")
		// The server expires the session a session timeout after it last heard
		// from us, and another builder may then take our locks, before we can
		// learn of the expiry: past that time they count as lost already.
		b.adrift = time.AfterFunc(b.opts.Timeout, func() {
			attrs := []any{}
			// The client retries quietly: a server that now presents a
			// certificate another CA signed is told only here.
			if last, _ := b.lastFailure.Load().(string); last != "" {
				attrs = append(attrs, "last_failure", last)
			}
			b.log.Warn("no ZooKeeper connection for the session timeout: every lock held counts as lost; work under them stops", attrs...)
			b.locks.lost()
		})
	}
}

// resync reloads the cache and registers again after a new session.
func (b *Backend) resync() {
	b.mu.Lock()
	closed := b.closed
	b.registered = ""
	b.mu.Unlock()
	if closed {
		return
	}
	b.log.Info("new ZooKeeper session: reading the image records again")
	// Until it works: a cache that missed a reload would follow nothing.
	for delay := time.Second; ; delay = min(2*delay, 30*time.Second) {
		err := b.cache.load()
		if err == nil && b.opts.Hostname != "" {
			err = b.register()
		}
		if err == nil {
			return
		}
		b.log.Error("reload the image records and register after a new ZooKeeper session; trying again", "error", err, "in", delay)
		select {
		case <-b.done:
			return
		case <-time.After(delay):
		}
	}
}

// root puts a path under the chroot.
func (b *Backend) root(p string) string {
	if b.opts.Chroot == "" {
		return p
	}
	return b.opts.Chroot + p
}

// unroot takes the chroot off a path the server reported.
func (b *Backend) unroot(p string) string {
	if b.opts.Chroot == "" {
		return p
	}
	return strings.TrimPrefix(p, b.opts.Chroot)
}

// The requests below take paths without the chroot.

func (b *Backend) get(p string) ([]byte, *zk.Stat, error) {
	return b.conn.Get(b.root(p))
}

// getW, childrenW and existsW read a node and set a watch on it, unless the
// backend is a snapshot.
func (b *Backend) getW(p string) ([]byte, *zk.Stat, error) {
	if b.opts.Snapshot {
		return b.conn.Get(b.root(p))
	}
	data, stat, _, err := b.conn.GetW(b.root(p))
	return data, stat, err
}

func (b *Backend) children(p string) ([]string, *zk.Stat, error) {
	return b.conn.Children(b.root(p))
}

func (b *Backend) childrenW(p string) ([]string, *zk.Stat, error) {
	if b.opts.Snapshot {
		return b.conn.Children(b.root(p))
	}
	c, stat, _, err := b.conn.ChildrenW(b.root(p))
	return c, stat, err
}

func (b *Backend) existsW(p string) (bool, *zk.Stat, error) {
	if b.opts.Snapshot {
		return b.conn.Exists(b.root(p))
	}
	ok, stat, _, err := b.conn.ExistsW(b.root(p))
	return ok, stat, err
}

func (b *Backend) exists(p string) (bool, *zk.Stat, error) {
	return b.conn.Exists(b.root(p))
}

func (b *Backend) create(p string, data []byte, flags int32) (string, error) {
	created, err := b.conn.Create(b.root(p), data, flags, zk.WorldACL(zk.PermAll))
	return b.unroot(created), err
}

func (b *Backend) set(p string, data []byte, version int32) (*zk.Stat, error) {
	return b.conn.Set(b.root(p), data, version)
}

func (b *Backend) delete(p string, version int32) error {
	return b.conn.Delete(b.root(p), version)
}

func (b *Backend) multi(ops ...any) ([]zk.MultiResponse, error) {
	for _, op := range ops {
		switch o := op.(type) {
		case *zk.CreateRequest:
			o.Path = b.root(o.Path)
		case *zk.SetDataRequest:
			o.Path = b.root(o.Path)
		case *zk.DeleteRequest:
			o.Path = b.root(o.Path)
		case *zk.CheckVersionRequest:
			o.Path = b.root(o.Path)
		}
	}
	res, err := b.conn.Multi(ops...)
	for i := range res {
		res[i].String = b.unroot(res[i].String)
	}
	return res, err
}

// ensure creates a path and its parents when missing, as kazoo's ensure_path.
func (b *Backend) ensure(p string) error {
	if b.opts.Chroot != "" {
		if err := b.ensureAbs(b.opts.Chroot); err != nil {
			return err
		}
	}
	return b.ensureAbs(b.root(p))
}

func (b *Backend) ensureAbs(abs string) error {
	ok, _, err := b.conn.Exists(abs)
	if err != nil || ok {
		return err
	}
	if parent := path.Dir(abs); parent != "/" {
		if err := b.ensureAbs(parent); err != nil {
			return err
		}
	}
	_, err = b.conn.Create(abs, nil, 0, zk.WorldACL(zk.PermAll))
	if errors.Is(err, zk.ErrNodeExists) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("create %s: %w", abs, err)
	}
	return nil
}

// componentContent is what nodepool's component registry reads of a builder.
type componentContent struct {
	Hostname string `json:"hostname"`
	Kind     string `json:"kind"`
	ModelAPI int    `json:"model_api"`
	State    string `json:"state"`
	Version  string `json:"version"`
}

// registeredModelAPI is above any model API nodepool has used: nodepool's
// components run at the lowest one registered, and the records we write are
// the same in every model, so our registration must never lower it.
const registeredModelAPI = 1000

// register creates this builder's ephemeral component znode, as nodepool's
// builders do: /nodepool/components/builder/<hostname><sequence>.
func (b *Backend) register() error {
	data, err := json.Marshal(componentContent{Hostname: b.opts.Hostname, Kind: "builder", ModelAPI: registeredModelAPI,
		State: "running", Version: b.opts.Version})
	if err != nil {
		return err
	}
	p, err := b.create(componentRoot+"/"+b.opts.Hostname, data, zk.FlagEphemeral|zk.FlagSequence)
	if err != nil {
		return fmt.Errorf("register the builder under %s: %w", componentRoot, err)
	}
	b.mu.Lock()
	b.registered = p
	b.mu.Unlock()
	b.log.Info("registered in ZooKeeper", "component", p)
	return nil
}

// zkLogger sends the client's messages to slog at debug level: it reports
// every reconnect, which the session events already tell. A failure it
// reports is kept for the error of a connection that never came.
type zkLogger struct{ b *Backend }

func (l zkLogger) Printf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if strings.Contains(strings.ToLower(msg), "fail") {
		l.b.lastFailure.Store(msg)
	}
	l.b.log.Debug(msg)
}
