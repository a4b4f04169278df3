package uploader

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/redact"
	"github.com/nodepool-builder/nodepool-builder/progress"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// attempt is one try at one upload.
type attempt struct {
	u        *Uploader
	planned  Planned
	cloud    Cloud
	provider *config.Provider
	build    store.Build
	file     store.File
	rec      *store.Upload
	prev     *store.Upload // the failed upload this attempt retries, as it was; nil for a new one
	log      *slog.Logger
	created  bool // the cloud image exists (rec.ExternalID names it)
	// stream, for an upload that follows the download of a build being made,
	// feeds it; file is then the file as declared until it is verified.
	stream *Streams
	// uri, for an upload of a build being made whose cloud fetches the
	// artifact itself (web-download), is its address; webWhy, for one of a
	// web-download provider that does not, says why.
	uri, webWhy string
}

// run creates the image, records its id, streams the file, waits for Glance to
// make it active, checks it and runs the post-upload hook. The upload is ready
// only once all of that passed.
func (a *attempt) run(ctx context.Context) error {
	u, rec := a.u, a.rec
	timeout := a.provider.UploadTimeout()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	how, err := a.how(ctx)
	if err != nil {
		return err // before the image is made: nothing is left half-made
	}
	importer := how.imp
	var path string
	var data io.Reader
	size := a.file.Size
	if how.uri == "" {
		if path, err = u.opts.Store.FilePath(a.build.Image, a.build.ID, a.file.Format); err != nil {
			return err
		}
		if data, size, err = a.open(ctx, path); err != nil {
			return err
		}
		if c, ok := data.(io.Closer); ok {
			defer c.Close()
		}
	}

	nameFormat := a.provider.ImageNameFormat
	if nameFormat == "" {
		nameFormat = "{image_name}-{timestamp}"
	}
	spec := ImageSpec{
		Name:       ImageName(nameFormat, a.build.Image, a.build.ID, rec.ID, u.opts.Now()),
		DiskFormat: a.file.Format,
		Properties: u.Properties(a.provider, a.build, a.file, *rec),
	}
	id, err := a.cloud.Create(ctx, spec)
	if err != nil {
		return fmt.Errorf("create image: %w", waitErr(ctx, err, timeout))
	}
	// Record the id before any data moves, so a crash leaves a findable image.
	a.created = true
	if err := u.opts.Store.RecordUploadImage(ctx, rec, id, spec.Name); err != nil {
		return err
	}
	// from says whether the data comes from the file, follows the download
	// that writes it, or is fetched by the cloud at the artifact's URL.
	from := "file"
	switch {
	case how.uri != "":
		from = "url"
	case a.stream != nil:
		from = "download"
	}
	a.log.Info("upload started", "external_id", id, "name", spec.Name, "format", a.file.Format, "bytes", size, "from", from,
		"method", how.method)
	start := u.opts.Now()
	if how.uri == "" {
		if err := a.send(ctx, id, how, data, size); err != nil {
			return err
		}
	}
	if importer != nil {
		if err := importer.Import(ctx, id, how.method, how.uri); err != nil {
			return fmt.Errorf("import: %w", waitErr(ctx, err, timeout))
		}
	}
	img, err := u.waitActive(ctx, a.cloud, importer, id)
	if err != nil {
		return waitErr(ctx, err, timeout)
	}
	switch {
	case importer != nil && !strings.EqualFold(img.DiskFormat, a.file.Format):
		// The cloud converted the image as it imported it: its checksum is
		// of the converted bytes. What was staged is the file, sent whole
		// (or what the cloud fetched, which nothing here can check); the
		// image carries the file's checksums as its properties.
		a.log.Info("the cloud converted the image as it imported it", "external_id", id, "from", a.file.Format,
			"to", img.DiskFormat)
	case how.uri != "":
		if err := checkFetched(img, a.file); err != nil {
			return err
		}
	default:
		if err := checkStored(img, a.file); err != nil {
			return err
		}
	}
	a.log.Info("image active", "external_id", id, "seconds", int(u.opts.Now().Sub(start).Seconds()))
	if hook := a.provider.PostUploadHook; hook != "" {
		if err := runHook(ctx, hook, a.provider.Name, id, path); err != nil {
			return err
		}
		a.log.Info("post-upload hook passed", "external_id", id, "hook", hook)
	}
	return nil
}

// send sends the image's data into the cloud image id: by PUT, or staged
// for an import.
func (a *attempt) send(ctx context.Context, id string, how sending, data io.Reader, size int64) error {
	task := a.u.opts.Progress.Start(progress.Upload, a.build.Name()+" to "+a.provider.Name, max(size, 0))
	defer task.End()
	send := a.cloud.Upload
	if how.imp != nil {
		send = how.imp.Stage
	}
	if err := send(ctx, id, &progressReader{r: data, size: size, now: a.u.opts.Now, task: task,
		report: a.report()}, size); err != nil {
		if a.stream != nil {
			if serr := a.stream.src.Err(); serr != nil {
				return &abandonedError{serr}
			}
		}
		return fmt.Errorf("upload data: %w", waitErr(ctx, err, a.provider.UploadTimeout()))
	}
	if a.stream != nil {
		// All of it was sent: the download was verified, and the file is the
		// verified one.
		a.file = a.stream.verified()
	}
	return nil
}

// open opens the data to send: the build's file at path, or, for an upload
// that follows the download, a reader of the file as it is written. size is
// its length, -1 when unknown.
func (a *attempt) open(ctx context.Context, path string) (io.Reader, int64, error) {
	if a.stream != nil {
		size := a.stream.declared.Size
		if size <= 0 {
			size = -1
		}
		return a.stream.src.NewReader(ctx), size, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, fmt.Errorf("open image file: %w", err)
	}
	info, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("stat image file: %w", err)
	}
	return f, info.Size(), nil
}

// importer is how the attempt reaches a provider whose upload-method is an
// import: nil for a plain PUT. A cloud that cannot import, or does not offer
// the method, is an error before anything is made in it.
func (a *attempt) importer(ctx context.Context, method string) (Importer, error) {
	if method == config.UploadPut {
		return nil, nil
	}
	imp, ok := a.cloud.(Importer)
	if !ok {
		return nil, fmt.Errorf("upload-method %s: this provider's cloud client cannot import images", method)
	}
	cctx, cancel := a.u.cloudCtx(ctx)
	defer cancel()
	if err := imp.CheckImportMethod(cctx, method); err != nil {
		return nil, fmt.Errorf("upload-method %s of provider %s (builder.providers in %s): %w", method, a.provider.Name,
			config.BuilderFileName, err)
	}
	return imp, nil
}

// checkStored compares what the cloud stored with the file that was sent.
func checkStored(img CloudImage, f store.File) error {
	if f.MD5 != "" && img.Checksum != "" && !strings.EqualFold(img.Checksum, f.MD5) {
		return fmt.Errorf("cloud stored md5 %s but the file's md5 is %s", img.Checksum, f.MD5)
	}
	return nil
}

// waitActive waits for the image to be active. For an import (importer
// set), a failure of the import ends the wait with Glance's reason: a failed
// import may leave the image importing, or send it back to queued.
func (u *Uploader) waitActive(ctx context.Context, cloud Cloud, importer Importer, id string) (CloudImage, error) {
	for {
		img, err := cloud.Get(ctx, id)
		if err != nil {
			return CloudImage{}, fmt.Errorf("check image status: %w", err)
		}
		switch img.Status {
		case "active":
			return img, nil
		case "killed", "deleted", "pending_delete", "deactivated":
			return CloudImage{}, fmt.Errorf("cloud put the image in state %q", img.Status)
		}
		if importer != nil {
			why, err := importer.ImportFailure(ctx, id)
			if err != nil {
				return CloudImage{}, fmt.Errorf("check the import: %w", err)
			}
			if why != "" {
				return CloudImage{}, fmt.Errorf("the cloud's import failed (image %s): %s", img.Status, why)
			}
		}
		t := time.NewTimer(u.opts.PollInterval)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return CloudImage{}, fmt.Errorf("image still %q: %w", img.Status, ctx.Err())
		}
	}
}

func waitErr(ctx context.Context, err error, timeout time.Duration) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("image-upload-timeout (%s) exceeded: %w", timeout, err)
	}
	return err
}

// runHook runs the provider's post-upload-hook: <hook> <provider> <external_id> <file>,
// in hookEnv's environment. A failure's error holds the tail of what the hook
// printed (see hookOutput).
func runHook(ctx context.Context, hook, provider, id, path string) error {
	cmd := exec.CommandContext(ctx, hook, provider, id, path)
	cmd.Env = hookEnv(os.Environ())
	out := &tail{max: hookOutputMax}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("post-upload-hook %s: %w%s", hook, err, out.shown())
	}
	return nil
}

// hookEnvKeys are the variables of the daemon's environment a post-upload-hook
// gets: what a program needs to run (the path, the user, the locale, the time
// zone, a temporary directory), to reach the network as the host does (the
// proxies and CA bundles) and to find the clouds.yaml the builder uses, as the
// openstack CLI reads it. Nothing else: the daemon's environment may hold
// cloud passwords and tokens (OS_PASSWORD, a %(NODEPOOL_...) value), which a
// hook has no need of and might print into the reason the pages show.
var hookEnvKeys = map[string]bool{
	"PATH": true, "HOME": true, "USER": true, "LOGNAME": true,
	"LANG": true, "LANGUAGE": true, "TZ": true, "TMPDIR": true,
	"http_proxy": true, "https_proxy": true, "no_proxy": true, "all_proxy": true,
	"HTTP_PROXY": true, "HTTPS_PROXY": true, "NO_PROXY": true, "ALL_PROXY": true,
	"SSL_CERT_FILE": true, "SSL_CERT_DIR": true,
	"OS_CLIENT_CONFIG_FILE": true, "OS_CLIENT_SECURE_FILE": true, "OS_CLOUD": true, "XDG_CONFIG_HOME": true,
}

// hookEnv is the part of environ a post-upload-hook gets: hookEnvKeys and
// the locale's LC_* variables.
func hookEnv(environ []string) []string {
	env := []string{} // never nil: a nil Env is the whole environment
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		if hookEnvKeys[k] || strings.HasPrefix(k, "LC_") {
			env = append(env, kv)
		}
	}
	return env
}

// hookOutputMax bounds what of a failed post-upload-hook's output is kept: its
// last lines, as the reason of the failed upload, which listings and the status
// pages show.
const hookOutputMax = 4 << 10

// tail keeps the last max bytes written to it, and counts them all, in at most
// twice max of memory whatever the hook prints.
type tail struct {
	max   int
	buf   []byte
	total int64
}

func (t *tail) Write(p []byte) (int, error) {
	t.total += int64(len(p))
	if len(p) >= t.max {
		t.buf = append(t.buf[:0], p[len(p)-t.max:]...)
		return len(p), nil
	}
	t.buf = append(t.buf, p...)
	if len(t.buf) > 2*t.max {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-t.max:]...)
	}
	return len(p), nil
}

// shown is the output as a failure reason holds it: ": <output>", or "" when
// there was none. A hook may print its environment or its config, and the
// reason is stored and served on the status pages, so secrets are taken out
// (the userinfo of URLs, the values of PASSWORD=, TOKEN=, SECRET=, KEY=,
// CREDENTIAL= and the like, of Authorization: headers and of flags such as
// --os-password, and bearer tokens). Output longer than max is cut to its last whole
// lines, never inside one: a line cut short would lose the key that says its
// value is a secret, and show the value.
func (t *tail) shown() string {
	out := t.buf
	cut := t.total > int64(len(out)) || len(out) > t.max
	if len(out) > t.max {
		out = out[len(out)-t.max:]
	}
	if cut {
		if i := bytes.IndexByte(out, '\n'); i >= 0 {
			out = out[i+1:]
		} else {
			out = nil
		}
	}
	msg := strings.TrimSpace(redact.Secrets(redact.Userinfo(string(out))))
	switch {
	case cut && msg == "":
		return fmt.Sprintf(": its output of %d bytes is not shown: the last %d hold no whole line", t.total, t.max)
	case cut:
		return fmt.Sprintf(": output cut to its last %d of %d bytes: %s", len(out), t.total, msg)
	case msg == "":
		return ""
	}
	return ": " + msg
}

// report is the attempt's progress callback, nil when nobody listens.
func (a *attempt) report() func(sent, total int64) {
	onSent := a.u.opts.OnSent
	if onSent == nil {
		return nil
	}
	return func(sent, total int64) { onSent(a.planned, sent, total) }
}

// progressReader counts the bytes sent on the attempt's task, and reports them
// at most every second.
type progressReader struct {
	r    io.Reader
	size int64
	done int64
	now  func() time.Time
	task *progress.Task
	// report, when set, is told the bytes sent; lastReport is when it was last.
	report     func(sent, total int64)
	lastReport time.Time
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.done += int64(n)
	p.task.Add(int64(n))
	t := p.now()
	if p.report != nil && (t.Sub(p.lastReport) >= time.Second || err != nil) {
		p.lastReport = t
		p.report(p.done, p.size)
	}
	return n, err
}

// Seek moves the image file, for a cloud that must send the data again (Glance
// refused the token just as the upload began): it can then send all of it, and
// the upload's task counts the bytes once.
func (p *progressReader) Seek(offset int64, whence int) (int64, error) {
	s, ok := p.r.(io.Seeker)
	if !ok {
		return 0, errors.New("the data cannot be sent again")
	}
	n, err := s.Seek(offset, whence)
	if err != nil {
		return n, err
	}
	p.done = n
	p.task.Set(n)
	return n, nil
}
