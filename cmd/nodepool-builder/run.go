package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/nodepool-builder/nodepool-builder/artifacts"
	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/poller"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/uploader"
	"github.com/nodepool-builder/nodepool-builder/uploader/openstack"
	"github.com/nodepool-builder/nodepool-builder/zuulapi"
)

// uploadInterval is how often the daemon reconciles uploads when no new build
// arrives: retries, deletions that the cloud refused before, the leak sweep.
const uploadInterval = time.Minute

// builder is one running builder: the images-dir lock, the store, and the parts
// that work on it.
type builder struct {
	cfg      *config.Config
	log      *slog.Logger
	lock     *store.Lock
	store    *store.Store
	poller   *poller.Poller
	uploader *uploader.Uploader
}

// openBuilder takes the images-dir lock and wires the parts together.
func openBuilder(c *cli.Context) (*builder, error) {
	log, err := newLogger(c)
	if err != nil {
		return nil, err
	}
	cfg, err := loadConfig(c)
	if err != nil {
		return nil, err
	}
	if cfg.ImagesDir == "" {
		return nil, withCode(exitUsage, fmt.Errorf("%s: images-dir is not set; the builder needs a directory for image files and its state", cfg.Path))
	}
	ctx := c.Context
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
	clients := map[string]poller.Builds{}
	for _, zi := range cfg.ZuulImages {
		client, err := zuulapi.New(zuulapi.Options{
			APIURL:     zi.APIURL,
			Tenant:     zi.Tenant,
			TokenFile:  zi.AuthTokenFile,
			CACertFile: zi.CACert,
			Logger:     log,
		})
		if err != nil {
			return nil, withCode(exitUsage, fmt.Errorf("zuul-image %s: %w", zi.Name, err))
		}
		clients[zi.Name] = client
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
	b := &builder{cfg: cfg, log: log, lock: lock, store: st}
	b.poller = poller.New(poller.Options{
		Store:   st,
		Config:  cfg,
		Fetcher: &artifacts.Fetcher{PartialDir: st.PartialDir(), Logger: log},
		Clients: clients,
		Logger:  log,
	})
	b.uploader = uploader.New(uploader.Options{Store: st, Config: cfg, Clouds: clouds, Logger: log})
	log.Info("builder ready", "builder_id", st.BuilderID(), "images_dir", cfg.ImagesDir,
		"zuul_images", len(cfg.ZuulImages), "providers", len(cfg.Providers))
	return b, nil
}

func (b *builder) close() {
	b.store.Close()
	b.lock.Unlock()
}

// runOnce does every due step once, to completion, and reports what failed.
func runOnce(c *cli.Context) error {
	b, err := openBuilder(c)
	if err != nil {
		return err
	}
	defer b.close()
	ctx := c.Context
	var failures []error
	if err := b.uploader.Recover(ctx); err != nil {
		failures = append(failures, fmt.Errorf("recover: %w", err))
	}
	for _, zi := range b.cfg.ZuulImages {
		out, err := b.poller.Poll(ctx, zi.Name)
		if err != nil {
			failures = append(failures, err)
			continue
		}
		if out.Skipped != "" {
			b.log.Info("nothing fetched", "image", zi.Name, "reason", out.Skipped)
		}
	}
	if err := b.uploader.Step(ctx); err != nil {
		failures = append(failures, err)
	}
	if len(failures) > 0 {
		return withCode(exitFailed, fmt.Errorf("%d step(s) failed:\n%w", len(failures), errors.Join(failures...)))
	}
	return nil
}

// runDaemon polls each zuul-image on its interval and reconciles uploads whenever
// a build arrives and every minute, until the context ends (SIGTERM, SIGINT).
func runDaemon(c *cli.Context) error {
	b, err := openBuilder(c)
	if err != nil {
		return err
	}
	defer b.close()
	ctx := c.Context
	if err := b.uploader.Recover(ctx); err != nil {
		b.log.Error("recovery incomplete; continuing", "error", err)
	}
	arrived := make(chan struct{}, 1)
	var wg sync.WaitGroup
	for _, zi := range b.cfg.ZuulImages {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b.pollLoop(ctx, zi, arrived)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		b.uploadLoop(ctx, arrived)
	}()
	<-ctx.Done()
	b.log.Info("stopping")
	wg.Wait()
	b.log.Info("stopped")
	return nil
}

func (b *builder) pollLoop(ctx context.Context, zi config.ZuulImage, arrived chan<- struct{}) {
	interval := zi.PollInterval
	if interval <= 0 {
		interval = b.cfg.Builder.PollInterval
	}
	if interval <= 0 {
		interval = time.Minute
	}
	for {
		out, err := b.poller.Poll(ctx, zi.Name)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			b.log.Error("poll failed", "image", zi.Name, "error", err)
		case out.Ingested != nil:
			select {
			case arrived <- struct{}{}:
			default:
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}

func (b *builder) uploadLoop(ctx context.Context, arrived <-chan struct{}) {
	for {
		if err := b.uploader.Step(ctx); err != nil && ctx.Err() == nil {
			b.log.Error("upload step had failures", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-arrived:
		case <-time.After(uploadInterval):
		}
	}
}
