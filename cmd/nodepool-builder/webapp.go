package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/webapp"
)

// serveWebapp serves the status pages on the config's webapp address until
// stop is called. A port that cannot be bound fails here, before any loop runs.
func serveWebapp(ctx context.Context, log *slog.Logger, cfg *config.Config, opts webapp.Options) (stop func(), err error) {
	addr := net.JoinHostPort(cfg.Webapp.ListenAddress, strconv.Itoa(cfg.Webapp.Port))
	srv, err := webapp.Listen(addr, opts)
	if err != nil {
		return nil, withCode(exitUsage, fmt.Errorf("%w; stop what holds the port, or change webapp's port or listen_address in %s",
			err, cfg.Path))
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ctx); err != nil {
			log.Error("status pages stopped", "error", err)
		}
	}()
	log.Info("status pages served", "url", srv.URL())
	return func() { cancel(); <-done }, nil
}
