package uploader

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/nodepool-builder/nodepool-builder/store"
)

// attempt is one try at one upload: create the image, record its id, stream the
// file, wait for Glance to make it active, check it and run the post-upload hook.
func (u *Uploader) attempt(ctx context.Context, cloud Cloud, j job, rec *store.Upload, log *slog.Logger) error {
	timeout := j.provider.ImageUploadTimeout
	if timeout <= 0 {
		timeout = time.Hour
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	path := u.opts.Store.FilePath(j.build.Image, j.build.ID, j.file.Format)
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("open image file: %w", err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return fmt.Errorf("stat image file: %w", err)
	}

	nameFormat := j.provider.ImageNameFormat
	if nameFormat == "" {
		nameFormat = "{image_name}-{timestamp}"
	}
	spec := ImageSpec{
		Name:       ImageName(nameFormat, j.build.Image, j.build.ID, rec.ID, u.opts.Now()),
		DiskFormat: j.file.Format,
		Properties: u.Properties(j.provider, j.build, j.file, *rec),
	}
	id, err := cloud.Create(ctx, spec)
	if err != nil {
		return fmt.Errorf("create image: %w", err)
	}
	// Record the id before any data moves, so a crash leaves a findable image.
	rec.ExternalID, rec.ExternalName = id, spec.Name
	if err := u.opts.Store.UpdateUpload(ctx, *rec); err != nil {
		return err
	}
	log.Info("uploading", "external_id", id, "name", spec.Name, "format", j.file.Format, "bytes", info.Size())
	start := u.opts.Now()
	if err := cloud.Upload(ctx, id, &progressReader{r: f, size: info.Size(), log: log, now: u.opts.Now, last: start}, info.Size()); err != nil {
		return fmt.Errorf("upload data: %w", waitErr(ctx, err, timeout))
	}
	img, err := u.waitActive(ctx, cloud, id)
	if err != nil {
		return waitErr(ctx, err, timeout)
	}
	if j.file.MD5 != "" && img.Checksum != "" && !strings.EqualFold(img.Checksum, j.file.MD5) {
		return fmt.Errorf("cloud stored md5 %s but the file's md5 is %s", img.Checksum, j.file.MD5)
	}
	log.Info("image active", "external_id", id, "seconds", int(u.opts.Now().Sub(start).Seconds()))
	if hook := j.provider.PostUploadHook; hook != "" {
		if err := runHook(ctx, hook, j.provider.Name, id, path); err != nil {
			return err
		}
	}
	return nil
}

func (u *Uploader) waitActive(ctx context.Context, cloud Cloud, id string) (Image, error) {
	for {
		img, err := cloud.Get(ctx, id)
		if err != nil {
			return Image{}, fmt.Errorf("check image status: %w", err)
		}
		switch img.Status {
		case "active":
			return img, nil
		case "killed", "deleted", "pending_delete", "deactivated":
			return Image{}, fmt.Errorf("cloud put the image in state %q", img.Status)
		}
		select {
		case <-time.After(u.opts.PollInterval):
		case <-ctx.Done():
			return Image{}, fmt.Errorf("image still %q: %w", img.Status, ctx.Err())
		}
	}
}

func waitErr(ctx context.Context, err error, timeout time.Duration) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("image-upload-timeout (%s) exceeded: %w", timeout, err)
	}
	return err
}

// runHook runs the provider's post-upload-hook: <hook> <provider> <external_id> <file>.
func runHook(ctx context.Context, hook, provider, id, path string) error {
	cmd := exec.CommandContext(ctx, hook, provider, id, path)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(out.String())
		if len(msg) > 2000 {
			msg = msg[len(msg)-2000:]
		}
		return fmt.Errorf("post-upload-hook %s: %w: %s", hook, err, msg)
	}
	return nil
}

// progressReader logs upload progress at most every 30 seconds.
type progressReader struct {
	r    *os.File
	size int64
	done int64
	log  *slog.Logger
	now  func() time.Time
	last time.Time
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.done += int64(n)
	if t := p.now(); t.Sub(p.last) >= 30*time.Second {
		p.last = t
		pct := 0.0
		if p.size > 0 {
			pct = float64(p.done) * 100 / float64(p.size)
		}
		p.log.Info("upload progress", "bytes", p.done, "total", p.size, "percent", fmt.Sprintf("%.0f", pct))
	}
	return n, err
}
