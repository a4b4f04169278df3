package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/benchkit"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/listing"
	"github.com/nodepool-builder/nodepool-builder/uploader"
	"github.com/nodepool-builder/nodepool-builder/uploader/openstack"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

const (
	// streamImageSize is the raw image BenchmarkReportToActive moves.
	streamImageSize = 512 << 20
	// streamArtifactRate caps the artifact server, all its connections
	// together; streamLinkRate caps the link to each provider's Glance.
	streamArtifactRate = 12 << 20
	streamLinkRate     = 24 << 20
	// streamStepTimeout bounds each step of a repetition: at the caps the
	// slowest takes well under a minute.
	streamStepTimeout = 10 * time.Minute
)

// streamProviders are the providers of BenchmarkReportToActive, each on a
// Glance of its own.
var streamProviders = []string{"cloud-a", "cloud-b", "cloud-c"}

// BenchmarkReportToActive is the time from a Zuul build's MQTT report to its
// image active in every cloud: a 512 MiB raw image (a third random data, the
// rest zeros) published as .raw.zst on an artifact server capped at 12 MiB/s
// for all its connections together, and three providers taking raw, each a
// Glance of its own behind a link of 24 MiB/s. The product's time runs from
// mosquitto_pub starting to the last of the three uploads ready, by the
// daemon's log; the state is then checked to hold the three ready and each
// Glance to hold its image active with the image's md5 (untimed).
//
// The anchors are measured in the same repetition, through the same caps:
// fetching alone (curl | zstd -d into a file) and uploading alone (curl -T of
// that file to one Glance, into an image created untimed). The slower of the
// two is the floor of a builder that overlaps them: x_slower is the product's
// time over it. The ideal pipeline, curl | zstd -d | tee into three curl -T,
// is reported beside them (pipeline_s), as information: it shows the floor
// the caps set when every step overlaps.
//
// When the daemon's log says when each upload started (upload_start_first_s,
// upload_start_last_s) and when the download completed (download_s), these
// are reported too, from the report: an upload that starts before the
// download completes overlaps it.
//
// Each repetition is a new Zuul build; the images of earlier ones stay, for
// the builder's rotation to release as it would. The product and the anchors
// take turns going first.
func BenchmarkReportToActive(b *testing.B) {
	curl := testenv.RequireBinary(b, "curl")
	testenv.RequireBinary(b, "zstd")
	testenv.RequireBinary(b, "tee")
	bash := testenv.RequireBinary(b, "bash")
	testenv.RequireBinary(b, "qemu-img")
	broker := testenv.NewMosquitto(b, testenv.MosquittoOptions{})
	ctx := b.Context()
	dir := b.TempDir()
	raw := filepath.Join(dir, "disk.raw")
	benchkit.WriteDiskImage(b, raw, streamImageSize)

	zuul := zuultest.NewServer(zuultest.ServerOptions{Tenant: "example"})
	b.Cleanup(zuul.Close)
	// The builder asks Zuul's API and fetches the artifacts through the
	// capped link, which the published URLs name.
	zuulLink := testenv.NewProxy(b, strings.TrimPrefix(zuul.URL(), "http://"))
	zuulLink.SetLinkRate(streamArtifactRate)
	publish := func(u string) string { return strings.Replace(u, zuul.URL(), zuulLink.URL(), 1) }

	links := map[string]*testenv.Proxy{}
	clouds := map[string]*openstack.Cloud{}
	cloudsFile := filepath.Join(dir, "clouds.yaml")
	var cy strings.Builder
	cy.WriteString("clouds:\n")
	for _, name := range streamProviders {
		g := testenv.NewGlance(b)
		links[name] = testenv.NewProxy(b, strings.TrimPrefix(g.Endpoint, "http://"))
		links[name].SetLinkRate(streamLinkRate)
		fmt.Fprintf(&cy, "  %s:\n    auth_type: none\n    image_endpoint_override: %s\n", name, links[name].URL())
	}
	if err := os.WriteFile(cloudsFile, []byte(cy.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	b.Setenv("OS_CLIENT_CONFIG_FILE", cloudsFile)
	for _, name := range streamProviders {
		c, err := openstack.Open(ctx, openstack.Options{Cloud: name, CloudsFile: cloudsFile})
		if err != nil {
			b.Fatal(err)
		}
		clouds[name] = c
	}

	var cfg strings.Builder
	fmt.Fprintf(&cfg, `images-dir: %s
zuul-images:
  - name: debian
    api-url: %s
    tenant: example
    project: org/images
    job: build-debian
    formats: [raw]
    poll-interval: 3600
providers:
`, filepath.Join(dir, "images"), zuulLink.URL())
	for _, name := range streamProviders {
		fmt.Fprintf(&cfg, "  - name: %s\n    cloud: %s\n    image-format: raw\n    diskimages:\n      - name: debian\n", name, name)
	}
	fmt.Fprintf(&cfg, "builder:\n  zuul-mqtt:\n    url: %s\n", broker.URL)
	cfgPath := filepath.Join(dir, "nodepool.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	logs := &testenv.Buffer{}
	dctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() { done <- run(dctx, []string{"nodepool-builder", "-c", cfgPath}, logs, logs) }()
	b.Cleanup(func() {
		cancel()
		if code := <-done; code != 0 {
			b.Errorf("the daemon exited %d:\n%s", code, logs.String())
		}
	})
	testenv.WaitFor(b, 30*time.Second, "the daemon to listen to Zuul's reports", func() bool {
		return strings.Contains(logs.String(), `msg="listening to Zuul's reports"`)
	}, logs.String)
	testenv.WaitFor(b, 30*time.Second, "the first poll and the poll after the connect", func() bool {
		return len(zuul.BuildsCalls()) >= 2
	}, logs.String)

	fetched := filepath.Join(dir, "fetched.raw")
	var m streamMetrics
	rep := 0
	for b.Loop() {
		b.StopTimer() // only the product is timed
		rep++
		zb, err := zuul.AddBuild(zuultest.BuildSpec{Job: "build-debian", Artifacts: []zuultest.ArtifactSpec{{
			Name: "debian raw", File: "debian.raw.zst", Path: raw, Compress: "zst",
			Metadata: zuulImageMeta("raw"), Publish: publish}}})
		if err != nil {
			b.Fatal(err)
		}
		art := zb.Artifacts[0]
		product := func() streamProduct {
			return streamReportToActive(b, broker, zuul, zb, cfgPath, logs, clouds)
		}
		anchors := func() (fetch, upload time.Duration, pipeline time.Duration, ok bool) {
			fetch = streamFetch(b, bash, art.URL, fetched)
			upload = streamUpload(b, curl, clouds["cloud-a"], links["cloud-a"], fetched, art.MD5)
			pipeline, ok = streamPipeline(b, bash, art.URL, clouds, links, dir, art.MD5)
			return fetch, upload, pipeline, ok
		}
		var p streamProduct
		var fetch, upload, pipeline time.Duration
		var piped bool
		// Each goes first in every other repetition: neither always meets
		// the machine as the other left it.
		if rep%2 == 1 {
			p = product()
			fetch, upload, pipeline, piped = anchors()
		} else {
			fetch, upload, pipeline, piped = anchors()
			p = product()
		}
		m.add(b, rep, p, fetch, upload, pipeline, piped)
		b.StartTimer()
	}
	m.report(b)
}

// streamProduct is one repetition of the product, times from the report.
type streamProduct struct {
	took time.Duration
	// uploadStart is when each provider's upload started, by the log; a
	// provider is missing when its line is.
	uploadStart map[string]time.Duration
	// download is when the download completed, by the log; 0 when it does
	// not say.
	download time.Duration
}

// streamReportToActive reports the Zuul build zb over MQTT and waits until its
// uploads are ready in every provider. It returns the time from mosquitto_pub
// starting to the last upload ready, by the daemon's log, once the state holds
// the three uploads ready and each Glance holds its image active with the
// image's md5.
func streamReportToActive(b *testing.B, broker *testenv.Mosquitto, zuul *zuultest.Server, zb zuultest.Build,
	cfgPath string, logs *testenv.Buffer, clouds map[string]*openstack.Cloud) streamProduct {
	b.Helper()
	topic, payload, err := zuul.MQTTReport(zb.UUID)
	if err != nil {
		b.Fatal(err)
	}
	b.StartTimer()
	start := time.Now()
	broker.Publish(b, topic, payload)
	testenv.WaitFor(b, time.Minute, "the download of "+zb.UUID+" to start", func() bool {
		_, ok := streamLogTime(b, logs.String(), "new Zuul build", "zuul_build", zb.UUID)
		return ok
	}, logs.String)
	// The builder's id of the build, which its upload lines name.
	var id string
	testenv.WaitFor(b, time.Minute, "the build of "+zb.UUID+" in the state", func() bool {
		for _, bd := range streamList[listing.Build](b, cfgPath, "dib-image-list") {
			if bd.ZuulBuildUUID == zb.UUID {
				id = bd.BuildID
			}
		}
		return id != ""
	}, logs.String)
	var end time.Time
	testenv.WaitFor(b, streamStepTimeout, "the uploads of build "+id+" to be ready", func() bool {
		text := logs.String()
		end = time.Time{}
		for _, name := range streamProviders {
			at, ok := streamLogTime(b, text, "upload ready", "build", id, "provider", name)
			if !ok {
				return false
			}
			end = later(end, at)
		}
		return true
	}, logs.String)
	b.StopTimer()

	p := streamProduct{took: end.Sub(start), uploadStart: map[string]time.Duration{}}
	text := logs.String()
	for _, name := range streamProviders {
		if at, ok := streamLogTime(b, text, "upload started", "build", id, "provider", name); ok {
			p.uploadStart[name] = at.Sub(start)
		}
	}
	// The download's line names its file, which is named after the Zuul build.
	for line := range strings.Lines(text) {
		if strings.Contains(line, `msg="download complete"`) && strings.Contains(line, zb.UUID) {
			if at, ok := logLineTime(b, line, `msg="download complete"`); ok {
				p.download = at.Sub(start)
			}
		}
	}

	ready := map[string]listing.Upload{}
	for _, up := range streamList[listing.Upload](b, cfgPath, "image-list") {
		if up.BuildID == id && up.State == "ready" {
			ready[up.Provider] = up
		}
	}
	for _, name := range streamProviders {
		up, ok := ready[name]
		if !ok {
			b.Fatalf("the state holds no ready upload of build %s to %s\n%s", id, name, logs.String())
		}
		img, err := clouds[name].Get(context.Background(), up.ExternalID)
		if err != nil || img.Status != "active" || img.Checksum != zb.Artifacts[0].MD5 {
			b.Fatalf("%s holds image %s as %+v (%v); want it active with md5 %s", name, up.ExternalID, img, err, zb.Artifacts[0].MD5)
		}
	}
	return p
}

// streamFetch downloads url, a .zst, through the artifact server's cap and
// decompresses it into out with curl and zstd, and returns their time.
func streamFetch(b *testing.B, bash, url, out string) time.Duration {
	b.Helper()
	if err := os.Remove(out); err != nil && !os.IsNotExist(err) {
		b.Fatal(err)
	}
	took, err := streamShell(b, bash, streamFetchScript, url, out)
	if err != nil {
		b.Fatalf("curl | zstd -d: %v", err)
	}
	return took
}

// streamUpload uploads file with curl -T through a provider's link into an
// image created as the uploader creates one, and returns curl's time: Glance
// stores the data before it answers. The image is checked active with md5 and
// deleted, untimed.
func streamUpload(b *testing.B, curl string, cloud *openstack.Cloud, link *testenv.Proxy, file, md5 string) time.Duration {
	b.Helper()
	ctx := context.Background()
	id, err := cloud.Create(ctx, uploader.ImageSpec{Name: "bench-curl", DiskFormat: "raw"})
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, curl, "-sS", "--fail", "-o", "/dev/null", "-X", "PUT",
		"-H", "Content-Type: application/octet-stream", "-T", file, link.URL()+"/v2/images/"+id+"/file")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(start)
	if err != nil {
		b.Fatalf("curl -T: %v: %s", err, out)
	}
	streamCheckImage(b, cloud, id, md5)
	return took
}

// streamPipeline fetches url through the artifact server's cap, decompresses
// it and uploads it to every provider at once through its link, with curl,
// zstd and tee into images created untimed, and returns the time of the whole;
// false, logged, when the pipeline fails. The images are checked active with
// md5 and deleted, untimed.
func streamPipeline(b *testing.B, bash, url string, clouds map[string]*openstack.Cloud, links map[string]*testenv.Proxy,
	dir, md5 string) (time.Duration, bool) {
	b.Helper()
	ctx := context.Background()
	ids := map[string]string{}
	args := []string{url}
	var fifos []string
	for i, name := range streamProviders {
		id, err := clouds[name].Create(ctx, uploader.ImageSpec{Name: "bench-pipeline", DiskFormat: "raw"})
		if err != nil {
			b.Fatal(err)
		}
		ids[name] = id
		args = append(args, links[name].URL()+"/v2/images/"+id+"/file")
		if i > 0 {
			fifo := filepath.Join(dir, fmt.Sprintf("pipe-%d", i))
			os.Remove(fifo)
			if err := syscall.Mkfifo(fifo, 0o600); err != nil {
				b.Fatal(err)
			}
			fifos = append(fifos, fifo)
		}
	}
	args = append(args, fifos...)
	took, err := streamShell(b, bash, streamPipelineScript, args...)
	for _, f := range fifos {
		os.Remove(f)
	}
	if err != nil {
		b.Logf("the ideal pipeline failed, so it is not reported: %v", err)
		for _, name := range streamProviders {
			clouds[name].Delete(ctx, ids[name])
		}
		return 0, false
	}
	for _, name := range streamProviders {
		streamCheckImage(b, clouds[name], ids[name], md5)
	}
	return took, true
}

// streamFetchScript fetches $1 and decompresses it into $2.
const streamFetchScript = `set -o pipefail; curl -sS --fail "$1" | zstd -d -q -f -o "$2"`

// streamPipelineScript fetches $1, decompresses it and uploads it to the
// image data URLs $2, $3 and $4 at once; $5 and $6 are the fifos tee feeds
// the second and third upload through. The uploads are chunked, as a client
// that streams sends them.
const streamPipelineScript = `set -o pipefail
put() { curl -sS --fail -o /dev/null -X PUT -H 'Content-Type: application/octet-stream' -T - "$1"; }
put "$3" <"$5" & second=$!
put "$4" <"$6" & third=$!
curl -sS --fail "$1" | zstd -d -q -c | tee "$5" "$6" | put "$2"
status=$?
wait $second || status=1
wait $third || status=1
exit $status`

// streamShell runs script with bash, args as $1 and on, in a process group of
// its own that a timeout ends whole, and returns its time.
func streamShell(b *testing.B, bash, script string, args ...string) (time.Duration, error) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), streamStepTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bash, append([]string{"-c", script, "bench"}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	took := time.Since(start)
	if err != nil {
		return took, fmt.Errorf("%w: %s", err, out.String())
	}
	return took, nil
}

// streamCheckImage fails the benchmark unless the cloud holds image id active
// with md5, then deletes it.
func streamCheckImage(b *testing.B, cloud *openstack.Cloud, id, md5 string) {
	b.Helper()
	ctx := context.Background()
	img, err := cloud.Get(ctx, id)
	if err != nil || img.Status != "active" || img.Checksum != md5 {
		b.Fatalf("image %s: %+v, %v; want it active with md5 %s", id, img, err, md5)
	}
	if err := cloud.Delete(ctx, id); err != nil {
		b.Fatal(err)
	}
}

// streamList runs a listing command with --json against the daemon's state.
func streamList[T any](b *testing.B, cfgPath, command string) []T {
	b.Helper()
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"nodepool-builder", "-c", cfgPath, command, "--json"}, &out, &errb); code != 0 {
		b.Fatalf("%s exited %d: %s", command, code, errb.String())
	}
	var rows []T
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil {
		b.Fatalf("%s --json: %v\n%s", command, err, out.String())
	}
	return rows
}

// streamLogTime is the time of the first log line of message msg whose
// fields hold each of the key-value pairs kv.
func streamLogTime(b *testing.B, logs, msg string, kv ...string) (time.Time, bool) {
	b.Helper()
lines:
	for line := range strings.Lines(logs) {
		line = strings.TrimRight(line, "\n")
		if !strings.Contains(line, ` msg="`+msg+`" `) {
			continue
		}
		for i := 0; i+1 < len(kv); i += 2 {
			if !strings.Contains(line+" ", " "+kv[i]+"="+kv[i+1]+" ") {
				continue lines
			}
		}
		return logLineTime(b, line, `msg="`+msg+`"`)
	}
	return time.Time{}, false
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// streamMetrics collects the repetitions of BenchmarkReportToActive.
type streamMetrics struct {
	product, fetch, upload, ratio, pipeline []float64
	firstStart, lastStart, download         []float64
}

func (m *streamMetrics) add(b *testing.B, rep int, p streamProduct, fetch, upload, pipeline time.Duration, piped bool) {
	b.Helper()
	floor := max(fetch, upload)
	m.product = append(m.product, p.took.Seconds())
	m.fetch = append(m.fetch, fetch.Seconds())
	m.upload = append(m.upload, upload.Seconds())
	m.ratio = append(m.ratio, p.took.Seconds()/floor.Seconds())
	line := fmt.Sprintf("repetition %d: product %.2fs, fetch %.2fs, upload %.2fs: x_slower %.3f",
		rep, p.took.Seconds(), fetch.Seconds(), upload.Seconds(), p.took.Seconds()/floor.Seconds())
	if piped {
		m.pipeline = append(m.pipeline, pipeline.Seconds())
		line += fmt.Sprintf("; ideal pipeline %.2fs", pipeline.Seconds())
	}
	if p.download > 0 {
		m.download = append(m.download, p.download.Seconds())
		line += fmt.Sprintf("; download complete at %.2fs", p.download.Seconds())
	}
	if len(p.uploadStart) == len(streamProviders) {
		var starts []float64
		var each []string
		for _, name := range streamProviders {
			starts = append(starts, p.uploadStart[name].Seconds())
			each = append(each, fmt.Sprintf("%s %.2fs", name, p.uploadStart[name].Seconds()))
		}
		m.firstStart = append(m.firstStart, slices.Min(starts))
		m.lastStart = append(m.lastStart, slices.Max(starts))
		line += "; uploads started at " + strings.Join(each, ", ")
	} else {
		line += "; the log does not say when every upload started"
	}
	b.Log(line)
}

// report reports the medians; those the log did not give in every repetition
// are left out.
func (m *streamMetrics) report(b *testing.B) {
	b.Helper()
	if len(m.product) == 0 {
		return
	}
	n := len(m.product)
	b.ReportMetric(benchkit.Median(m.product), "product_s")
	b.ReportMetric(benchkit.Median(m.fetch), "fetch_s")
	b.ReportMetric(benchkit.Median(m.upload), "upload_s")
	b.ReportMetric(benchkit.Median(m.ratio), "x_slower")
	for _, s := range []struct {
		xs   []float64
		unit string
	}{
		{m.pipeline, "pipeline_s"},
		{m.download, "download_s"},
		{m.firstStart, "upload_start_first_s"},
		{m.lastStart, "upload_start_last_s"},
	} {
		if len(s.xs) == n {
			b.ReportMetric(benchkit.Median(s.xs), s.unit)
		}
	}
}
