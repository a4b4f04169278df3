package service

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/webapp"
)

// serveWebapp serves the status pages where builder.webapp says until stop is
// called; without builder.webapp it serves none. A port that cannot be bound
// fails here, before any loop runs. nodepool's top-level webapp is the
// launcher's: the builder never listens there.
func serveWebapp(ctx context.Context, log *slog.Logger, cfg *config.Config, opts webapp.Options) (stop func(), err error) {
	w := cfg.Builder.Webapp
	if w == nil {
		if cfg.LauncherWebapp != nil {
			log.Info("status pages not served: the top-level webapp section is nodepool-launcher's; "+
				"set builder.webapp to serve the builder's own", "config", cfg.Path, "builder_config", cfg.OwnPath(),
				"default_port", config.DefaultBuilderWebappPort)
		}
		return func() {}, nil
	}
	addr := net.JoinHostPort(w.ListenAddress, strconv.Itoa(w.Port))
	opts.HostNames = append(opts.HostNames, w.HostNames...)
	srv, err := webapp.Listen(addr, opts)
	if err != nil {
		return nil, unusable{fmt.Errorf("%w; stop what holds %s, or set builder.webapp.port (or builder.webapp.listen-address) in %s to a free one",
			err, addr, cfg.OwnPath())}
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
