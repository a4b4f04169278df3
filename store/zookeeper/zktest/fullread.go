// Package zktest reads nodepool's tree in ZooKeeper the plain way, for the
// tests and benchmarks that measure the backend against it.
package zktest

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/z-division/go-zookeeper/zk"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
)

// FullRead is what a backend without a cache reads on every step, and the
// floor of one that reads the whole tree once: the children of every node down
// to the uploads, and the data of every build and upload with its extra node,
// in parallel on one connection as a good client pipelines them. It counts the
// requests it sends and the znodes it reads the data of.
type FullRead struct {
	conn     *zk.Conn
	root     string // the chroot's /nodepool/images
	Requests atomic.Int64
	Znodes   atomic.Int64
}

// NewFullRead connects to z (over TLS when it serves TLS) and reads the tree
// under chroot.
func NewFullRead(tb testing.TB, z *testenv.ZooKeeper, chroot string) *FullRead {
	tb.Helper()
	var tc *tls.Config
	if z.TLS {
		var err error
		if tc, err = z.ClientTLSConfig(); err != nil {
			tb.Fatal(err)
		}
	}
	dial := zk.WithDialer(func(network, address string, timeout time.Duration) (net.Conn, error) {
		d := &net.Dialer{Timeout: timeout}
		if tc == nil {
			return d.Dial(network, address)
		}
		return (&tls.Dialer{NetDialer: d, Config: tc}).Dial(network, address)
	})
	conn, events, err := zk.Connect([]string{z.Addr}, 10*time.Second, dial, zk.WithLogger(quiet{}))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(conn.Close)
	deadline := time.After(30 * time.Second)
	for conn.State() != zk.StateHasSession {
		select {
		case <-events:
		case <-deadline:
			tb.Fatalf("no ZooKeeper session with %s within 30s", z.Addr)
		}
	}
	return &FullRead{conn: conn, root: chroot + "/nodepool/images"}
}

type quiet struct{}

func (quiet) Printf(string, ...any) {}

// Read reads the whole tree once. A node deleted meanwhile is no error.
func (r *FullRead) Read() error {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	var mu sync.Mutex
	var errs []error
	do := func(f func() error) {
		wg.Go(func() {
			sem <- struct{}{}
			err := f()
			<-sem
			if err != nil && !errors.Is(err, zk.ErrNoNode) {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	children := func(p string) ([]string, error) {
		r.Requests.Add(1)
		kids, _, err := r.conn.Children(p)
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", p, err)
		}
		out := kids[:0]
		for _, k := range kids {
			if k != "lock" {
				out = append(out, k)
			}
		}
		return out, nil
	}
	get := func(p string) error {
		r.Requests.Add(1)
		r.Znodes.Add(1)
		if _, _, err := r.conn.Get(p); err != nil {
			return fmt.Errorf("read %s: %w", p, err)
		}
		return nil
	}
	record := func(p string) {
		do(func() error { return get(p) })
		do(func() error { return get(p + "/nodepool-builder") })
	}
	// Each level lists the next: image, its builds, a build's data and
	// providers, a provider's uploads, an upload's data.
	uploadsOf := func(p string) error {
		ids, err := children(p + "/images")
		for _, id := range ids {
			record(p + "/images/" + id)
		}
		return err
	}
	buildsOf := func(image string) error {
		ids, err := children(r.root + "/" + image + "/builds")
		for _, id := range ids {
			bp := r.root + "/" + image + "/builds/" + id
			record(bp)
			do(func() error {
				providers, err := children(bp + "/providers")
				for _, p := range providers {
					do(func() error { return uploadsOf(bp + "/providers/" + p) })
				}
				return err
			})
		}
		return err
	}
	images, err := children(r.root)
	if err != nil {
		return err
	}
	for _, image := range images {
		do(func() error { return buildsOf(image) })
	}
	wg.Wait()
	return errors.Join(errs...)
}
