package zookeeper

import (
	"context"
	"log/slog"
	"sync"
)

// quietAfterClose is a log handler that writes nothing once its backend is
// closed. The ZooKeeper client's goroutines, the cache's and the event
// callback outlive Close by a moment (the client does not wait for its loops
// to end) and would otherwise log into a writer the caller may be reading or
// have let go of. A message being written when Close comes is written before
// Close returns.
type quietAfterClose struct {
	inner slog.Handler
	gate  *logGate
}

type logGate struct {
	mu     sync.RWMutex
	closed bool
}

// close makes every later message a no-op, waiting for those being written.
func (g *logGate) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}

func (h quietAfterClose) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

func (h quietAfterClose) Handle(ctx context.Context, r slog.Record) error {
	h.gate.mu.RLock()
	defer h.gate.mu.RUnlock()
	if h.gate.closed {
		return nil
	}
	return h.inner.Handle(ctx, r)
}

func (h quietAfterClose) WithAttrs(attrs []slog.Attr) slog.Handler {
	return quietAfterClose{h.inner.WithAttrs(attrs), h.gate}
}

func (h quietAfterClose) WithGroup(name string) slog.Handler {
	return quietAfterClose{h.inner.WithGroup(name), h.gate}
}
