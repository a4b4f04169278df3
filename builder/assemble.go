package builder

import (
	"context"
	"fmt"
	"net/http"

	"github.com/nodepool-builder/nodepool-builder/artifacts"
	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/dib"
	"github.com/nodepool-builder/nodepool-builder/poller"
	"github.com/nodepool-builder/nodepool-builder/source"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/uploader"
	"github.com/nodepool-builder/nodepool-builder/zuulapi"
	"github.com/nodepool-builder/nodepool-builder/zuulmqtt"
)

// parts are what one config makes: its sources and its uploader. A reload makes
// new parts; work already running keeps the parts it started with.
type parts struct {
	cfg      *config.Config
	sources  map[store.SourceName]source.Source
	uploader *uploader.Uploader
	// mqtt is the listener of builder.zuul-mqtt, not started; nil without it.
	// The daemon runs it, or keeps the one it runs when the settings are the same.
	mqtt *zuulmqtt.Listener
}

// assemble makes the parts of a config. It checks what a config can get wrong
// (clouds.yaml entries, Zuul URLs, ca-certs) before anything runs.
func (b *Builder) assemble(ctx context.Context, cfg *config.Config) (*parts, error) {
	if cfg.ImagesDir != b.store.Dir() {
		return nil, fmt.Errorf("%w: images-dir changed from %s to %s; restart the builder to move it", config.ErrUnusable, b.store.Dir(), cfg.ImagesDir)
	}
	// Said at start and on every reload, as the clients' warnings are.
	for _, w := range secretFileWarnings(cfg) {
		b.log.Warn(w)
	}
	clouds, err := b.openClouds(ctx, cfg)
	if err != nil {
		return nil, err
	}
	clients, fetchers, err := b.zuulClients(cfg)
	if err != nil {
		return nil, err
	}
	var listener *zuulmqtt.Listener
	if z := cfg.Builder.ZuulMQTT; z != nil {
		if listener, err = b.newListener(*z); err != nil {
			return nil, fmt.Errorf("%w: builder.%w", config.ErrUnusable, err)
		}
	}
	up := uploader.New(uploader.Options{
		Store:        b.store,
		Config:       cfg,
		Clouds:       clouds,
		Logger:       b.log,
		RetryBase:    b.opts.RetryBase,
		CleanupGrace: b.opts.CleanupGrace,
		OnSent:       b.uploadProgress,
		Metrics:      b.opts.Metrics,
		Progress:     b.opts.Progress,
	})
	return &parts{
		cfg:  cfg,
		mqtt: listener,
		sources: map[store.SourceName]source.Source{
			store.SourceZuul: poller.New(poller.Options{
				Store:    b.store,
				Config:   cfg,
				Fetchers: fetchers,
				Clients:  clients,
				Logger:   b.log,
				Metrics:  b.opts.Metrics,
				Streamer: streamer{b: b, up: up},
			}),
			store.SourceDIB: dib.New(dib.Options{
				Store:         b.store,
				Config:        cfg,
				Logger:        b.log,
				CheckInterval: b.opts.Intervals.DIBCheck,
				Metrics:       b.opts.Metrics,
				Progress:      b.opts.Progress,
			}),
		},
		uploader: up,
	}, nil
}

// openClouds opens the clouds of the config's providers as alien-image-list
// does too (OpenClouds): one client per cloud and region.
func (b *Builder) openClouds(ctx context.Context, cfg *config.Config) (map[string]uploader.Cloud, error) {
	open := b.opts.OpenCloud
	if open == nil {
		open = OpenStack(b.log)
	}
	clouds, err := OpenClouds(ctx, cfg.Providers, open)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", config.ErrUnusable, err)
	}
	return clouds, nil
}

// zuulClients makes, for every zuul-image by name, its Zuul API client and its
// artifact fetcher. The zuul-images that trust the same ca-cert share one
// HTTP client and its connections: 500 images of one Zuul would otherwise
// hold 500 connections to it, and make as many TLS handshakes on each --once.
func (b *Builder) zuulClients(cfg *config.Config) (map[string]poller.Builds, map[string]*artifacts.Fetcher, error) {
	clients := map[string]poller.Builds{}
	fetchers := map[string]*artifacts.Fetcher{}
	shared := map[string]*http.Client{}
	for _, zi := range cfg.ZuulImages {
		hc, ok := shared[zi.CACert]
		if !ok {
			var err error
			if hc, err = zuulClient(zi.CACert); err != nil {
				return nil, nil, fmt.Errorf("%w: zuul-image %s: %w", config.ErrUnusable, zi.Name, err)
			}
			shared[zi.CACert] = hc
		}
		fetchers[zi.Name] = &artifacts.Fetcher{HTTPClient: hc, Logger: b.log,
			MaxSize: cfg.Builder.MaxImageSize, Connections: cfg.Builder.DownloadConnections, NAT64Prefixes: cfg.Builder.NAT64Prefixes,
			Progress: b.opts.Progress}
		client, err := zuulapi.New(zuulapi.Options{
			APIURL:     zi.APIURL,
			Tenant:     zi.Tenant,
			TokenFile:  zi.AuthTokenFile,
			HTTPClient: hc, // it trusts zi.CACert
			// The client warns, with this, of credentials it would send over http.
			Logger: b.log.With("zuul_image", zi.Name),
		})
		if err != nil {
			return nil, nil, fmt.Errorf("%w: zuul-image %s: %w", config.ErrUnusable, zi.Name, err)
		}
		clients[zi.Name] = client
	}
	return clients, fetchers, nil
}

// uploadProgress tells the gearman jobs waiting for an upload how it goes.
func (b *Builder) uploadProgress(j uploader.Planned, sent, total int64) {
	if g := b.gearman.Load(); g != nil {
		g.uploadProgress(j, sent, total)
	}
}

// zuulIdleConns is how many idle connections to one Zuul the zuul-images
// sharing a client keep: as many as polls run at once in --once, so that each
// finds one open.
const zuulIdleConns = onceParallel

// zuulClient is the HTTP client for zuul-images that trust caCert, for their
// API queries and artifacts: it trusts caCert besides the system roots, and has
// no overall timeout (the API client sets its own; the downloader, which
// takes a copy on a transport of its own, guards against stalls, since a large
// image may take an hour).
func zuulClient(caCert string) (*http.Client, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = zuulIdleConns
	hc := &http.Client{Transport: tr}
	if caCert == "" {
		return hc, nil
	}
	if err := zuulapi.TrustCA(hc, caCert); err != nil {
		return nil, err
	}
	return hc, nil
}
