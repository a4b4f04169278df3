package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/nodepool-builder/nodepool-builder/artifacts"
	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/dib"
	"github.com/nodepool-builder/nodepool-builder/poller"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/uploader"
	"github.com/nodepool-builder/nodepool-builder/uploader/openstack"
	"github.com/nodepool-builder/nodepool-builder/zuulapi"
)

const (
	// uploadInterval is how often the daemon reconciles the store against the clouds
	// when no new build arrives: admin deletes, retries, deletions the cloud refused.
	uploadInterval = 10 * time.Second
	// sweepInterval is how often the daemon lists the clouds for leaked images.
	sweepInterval = 10 * time.Minute
	// dibInterval is how often the daemon checks whether a diskimage is due.
	dibInterval = 10 * time.Second
	// configCheckInterval is how often the daemon looks for a changed config file.
	configCheckInterval = 5 * time.Second
)

// builder is one running builder: the images-dir lock and the store, which last
// for the whole run, and the parts made from the current config.
type builder struct {
	log   *slog.Logger
	lock  *store.Lock
	store *store.Store
}

// parts are what a config makes: they are rebuilt when the config changes.
type parts struct {
	cfg      *config.Config
	poller   *poller.Poller
	uploader *uploader.Uploader
	dib      *dib.Builder
}

// openBuilder takes the images-dir lock and opens the store.
func openBuilder(ctx context.Context, cfg *config.Config, log *slog.Logger) (*builder, error) {
	if cfg.ImagesDir == "" {
		return nil, withCode(exitUsage, fmt.Errorf("%s: images-dir is not set; the builder needs a directory for image files and its state", cfg.Path))
	}
	lock, err := store.LockDir(cfg.ImagesDir)
	if err != nil {
		if errors.Is(err, store.ErrLocked) {
			return nil, withCode(exitLocked, err)
		}
		return nil, withCode(exitFailed, err)
	}
	st, err := store.Open(ctx, store.Options{ImagesDir: cfg.ImagesDir, DBPath: cfg.Builder.StateDB})
	if err != nil {
		lock.Unlock()
		return nil, withCode(exitFailed, err)
	}
	log.Info("builder ready", "builder_id", st.BuilderID(), "images_dir", cfg.ImagesDir)
	return &builder{log: log, lock: lock, store: st}, nil
}

func (b *builder) close() {
	b.store.Close()
	b.lock.Unlock()
}

// openClouds opens every provider's cloud and settles the format each takes.
func openClouds(ctx context.Context, cfg *config.Config, log *slog.Logger) (map[string]uploader.Cloud, error) {
	clouds := map[string]uploader.Cloud{}
	for i := range cfg.Providers {
		p := &cfg.Providers[i]
		cloud, err := openstack.Open(ctx, openstack.Options{Cloud: p.Cloud, Region: p.RegionName, Logger: log})
		if err != nil {
			return nil, withCode(exitUsage, fmt.Errorf("provider %s: %w", p.Name, err))
		}
		if p.ImageFormat == "" {
			// The format a provider takes is part of what images need; settle it now.
			p.ImageFormat = config.NormalizeFormat(cloud.ImageFormat())
		}
		clouds[p.Name] = cloud
	}
	return clouds, nil
}

// assemble makes the parts for a config. It checks everything a config can get
// wrong (clouds.yaml entries, Zuul URLs) before anything runs.
func (b *builder) assemble(ctx context.Context, cfg *config.Config) (*parts, error) {
	if cfg.ImagesDir != b.store.Dir() {
		return nil, withCode(exitUsage, fmt.Errorf("images-dir changed from %s to %s; restart the builder to move it", b.store.Dir(), cfg.ImagesDir))
	}
	clouds, err := openClouds(ctx, cfg, b.log)
	if err != nil {
		return nil, err
	}
	clients := map[string]poller.Builds{}
	fetchers := map[string]*artifacts.Fetcher{}
	for _, zi := range cfg.ZuulImages {
		hc, err := downloadClient(zi.CACert)
		if err != nil {
			return nil, withCode(exitUsage, fmt.Errorf("zuul-image %s: %w", zi.Name, err))
		}
		fetchers[zi.Name] = &artifacts.Fetcher{PartialDir: b.store.PartialDir(), HTTPClient: hc, Logger: b.log}
		client, err := zuulapi.New(zuulapi.Options{
			APIURL:     zi.APIURL,
			Tenant:     zi.Tenant,
			TokenFile:  zi.AuthTokenFile,
			CACertFile: zi.CACert,
			Logger:     b.log,
		})
		if err != nil {
			return nil, withCode(exitUsage, fmt.Errorf("zuul-image %s: %w", zi.Name, err))
		}
		clients[zi.Name] = client
	}
	return &parts{
		cfg: cfg,
		poller: poller.New(poller.Options{
			Store:    b.store,
			Config:   cfg,
			Fetchers: fetchers,
			Clients:  clients,
			Logger:   b.log,
		}),
		uploader: uploader.New(uploader.Options{Store: b.store, Config: cfg, Clouds: clouds, Logger: b.log}),
		dib:      dib.New(dib.Options{Store: b.store, Config: cfg, Logger: b.log}),
	}, nil
}

// downloadClient is the HTTP client for a zuul-image's artifacts: it trusts the
// image's ca-cert besides the system roots, and has no overall timeout (the
// downloader guards against stalls; a large image may take an hour).
func downloadClient(caCert string) (*http.Client, error) {
	if caCert == "" {
		return &http.Client{}, nil
	}
	pem, err := os.ReadFile(caCert)
	if err != nil {
		return nil, fmt.Errorf("read ca-cert: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("ca-cert %s holds no PEM certificate", caCert)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	return &http.Client{Transport: tr}, nil
}

// start loads the config, takes the lock and assembles the parts.
func start(c *cli.Context) (*builder, *parts, error) {
	log, err := newLogger(c)
	if err != nil {
		return nil, nil, err
	}
	cfg, err := loadConfig(c)
	if err != nil {
		return nil, nil, err
	}
	b, err := openBuilder(c.Context, cfg, log)
	if err != nil {
		return nil, nil, err
	}
	p, err := b.assemble(c.Context, cfg)
	if err != nil {
		b.close()
		return nil, nil, err
	}
	log.Info("config loaded", "config", cfg.Path, "diskimages", len(cfg.DiskImages),
		"zuul_images", len(cfg.ZuulImages), "providers", len(cfg.Providers))
	return b, p, nil
}

// recover settles what a builder that is gone left in flight: its DIB processes
// are stopped first, so that their files can go.
func (p *parts) recover(ctx context.Context) error {
	return errors.Join(p.dib.Recover(ctx), p.uploader.Recover(ctx))
}

// runOnce does every due step once, to completion, and reports what failed.
func runOnce(c *cli.Context) error {
	b, p, err := start(c)
	if err != nil {
		return err
	}
	defer b.close()
	ctx := c.Context
	var failures []error
	if err := p.recover(ctx); err != nil {
		failures = append(failures, fmt.Errorf("recover: %w", err))
	}
	for _, zi := range p.cfg.ZuulImages {
		out, err := p.poller.Poll(ctx, zi.Name)
		if err != nil {
			failures = append(failures, err)
			continue
		}
		if out.Skipped != "" {
			b.log.Info("nothing fetched", "image", zi.Name, "reason", out.Skipped)
		}
	}
	if err := p.dib.Step(ctx); err != nil {
		failures = append(failures, err)
	}
	if err := p.uploader.Step(ctx); err != nil {
		failures = append(failures, err)
	}
	if err := p.uploader.Sweep(ctx); err != nil {
		failures = append(failures, err)
	}
	if len(failures) > 0 {
		return withCode(exitFailed, fmt.Errorf("%d step(s) failed:\n%w", len(failures), errors.Join(failures...)))
	}
	return nil
}

// runDaemon runs the loops until SIGTERM or SIGINT. SIGHUP or a change of the
// config file reloads the config: the loops finish the step they are in, then
// start again with the new config. A config that does not load is reported and
// the old one stays.
func runDaemon(c *cli.Context) error {
	b, p, err := start(c)
	if err != nil {
		return err
	}
	defer b.close()
	ctx := c.Context
	if err := p.recover(ctx); err != nil {
		b.log.Error("recovery incomplete; continuing", "error", err)
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	changed := watchFile(ctx, p.cfg.Path, configCheckInterval)

	for {
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			p.run(ctx, b.log, stop)
			close(done)
		}()
		next, ok := b.nextConfig(c, hup, changed)
		if !ok {
			b.log.Info("stopping")
			<-done
			b.log.Info("stopped")
			return nil
		}
		b.log.Info("reloading config; waiting for running steps to finish")
		close(stop)
		<-done
		p = next
		b.log.Info("config reloaded", "diskimages", len(p.cfg.DiskImages), "zuul_images", len(p.cfg.ZuulImages),
			"providers", len(p.cfg.Providers))
	}
}

// nextConfig waits for SIGHUP or a change of the config file and returns the parts
// of the new config; a config that does not load is reported and waited past, the
// running one stays. It returns false when the daemon is stopping.
func (b *builder) nextConfig(c *cli.Context, hup <-chan os.Signal, changed <-chan struct{}) (*parts, bool) {
	for {
		var why string
		select {
		case <-c.Context.Done():
			return nil, false
		case <-hup:
			why = "SIGHUP"
		case <-changed:
			why = "config file changed"
		}
		next, err := reload(c, b)
		if err != nil {
			b.log.Error("config not reloaded; the running one stays", "reason", why, "error", err)
			continue
		}
		b.log.Info("new config loaded", "reason", why)
		return next, true
	}
}

func reload(c *cli.Context, b *builder) (*parts, error) {
	cfg, err := loadConfig(c)
	if err != nil {
		return nil, err
	}
	return b.assemble(c.Context, cfg)
}

// watchFile reports on the returned channel when the file's content changes.
func watchFile(ctx context.Context, path string, every time.Duration) <-chan struct{} {
	changed := make(chan struct{}, 1)
	last, _ := os.ReadFile(path)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(every):
			}
			now, err := os.ReadFile(path)
			if err != nil || bytes.Equal(now, last) {
				continue
			}
			last = now
			select {
			case changed <- struct{}{}:
			default:
			}
		}
	}()
	return changed
}

// run runs the loops of one config until stop is closed or ctx ends. A step in
// progress finishes when stop closes; ctx ending interrupts it.
func (p *parts) run(ctx context.Context, log *slog.Logger, stop <-chan struct{}) {
	arrived := make(chan struct{}, 1)
	notify := func() {
		select {
		case arrived <- struct{}{}:
		default:
		}
	}
	var wg sync.WaitGroup
	for _, zi := range p.cfg.ZuulImages {
		wg.Add(1)
		go func() {
			defer wg.Done()
			interval := zi.PollInterval
			if interval <= 0 {
				interval = p.cfg.Builder.PollInterval
			}
			every(ctx, stop, interval, nil, func() {
				out, err := p.poller.Poll(ctx, zi.Name)
				switch {
				case ctx.Err() != nil:
				case err != nil:
					log.Error("poll failed", "image", zi.Name, "error", err)
				case out.Ingested != nil:
					notify()
				}
			})
		}()
	}
	if len(p.cfg.DiskImages) > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			every(ctx, stop, dibInterval, nil, func() {
				for _, di := range p.cfg.DiskImages {
					if ctx.Err() != nil || isClosed(stop) {
						return
					}
					reason, err := p.dib.Due(ctx, di.Name)
					if err != nil {
						log.Error("cannot tell whether an image is due", "image", di.Name, "error", err)
						continue
					}
					if reason == "" {
						continue
					}
					log.Info("building image", "image", di.Name, "reason", reason)
					if _, err := p.dib.Build(ctx, di.Name); err != nil {
						if ctx.Err() == nil {
							log.Error("build failed", "image", di.Name, "error", err)
						}
						continue
					}
					notify()
				}
			})
		}()
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		every(ctx, stop, uploadInterval, arrived, func() {
			if err := p.uploader.Step(ctx); err != nil && ctx.Err() == nil {
				log.Error("upload step had failures", "error", err)
			}
		})
	}()
	go func() {
		defer wg.Done()
		every(ctx, stop, sweepInterval, nil, func() {
			if err := p.uploader.Sweep(ctx); err != nil && ctx.Err() == nil {
				log.Error("leak sweep had failures", "error", err)
			}
		})
	}()
	wg.Wait()
}

// every runs step now and then each interval, or sooner when wake fires, until
// stop closes or ctx ends.
func every(ctx context.Context, stop <-chan struct{}, interval time.Duration, wake <-chan struct{}, step func()) {
	if interval <= 0 {
		interval = time.Minute
	}
	for {
		step()
		t := time.NewTimer(interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-stop:
			t.Stop()
			return
		case <-wake:
		case <-t.C:
		}
		t.Stop()
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
