package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// TestDaemonShowsDownloadProgress: an artifact served through a proxy slowed
// to 1 MiB/s takes seconds to download; the daemon, with a short progress
// interval, logs lines with the bytes, rate and ETA of the download while it
// runs, and image-status shows the task as the daemon leaves it in the images-dir. No provider: the
// zuul-image asks for raw itself, so no cloud is needed.
func TestDaemonShowsDownloadProgress(t *testing.T) {
	e := &env{t: t, dir: t.TempDir(), qemuImg: testenv.RequireBinary(t, "qemu-img"), zuul: zuultest.NewServer(zuultest.ServerOptions{})}
	t.Cleanup(e.zuul.Close)
	slow := testenv.NewProxy(t, strings.TrimPrefix(e.zuul.URL(), "http://"))
	// Slow enough that the download still runs when a loaded machine has
	// started the daemon and run image-status a few times.
	slow.SetRate(128 << 10)
	img := e.makeImage(1) // 3 MiB raw: about 24 s
	e.addBuild(img, zuultest.BuildSpec{Artifacts: []zuultest.ArtifactSpec{{Name: "debian raw", Path: img.raw, Metadata: zuulImageMeta("raw"),
		Publish: func(u string) string { return strings.Replace(u, e.zuul.URL(), slow.URL(), 1) }}}})
	e.cfgPath = filepath.Join(e.dir, "nodepool.yaml")
	if err := os.WriteFile(e.cfgPath, []byte(`images-dir: `+filepath.Join(e.dir, "images")+`
zuul-images:
  - name: debian
    api-url: `+e.zuul.URL()+`
    tenant: example
    project: org/images
    job: build-debian
    formats: [raw]
    artifact-hosts: [127.0.0.1] # the slow proxy is on another port of loopback
`), 0o644); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, e.cfgPath, "--progress-interval", "300ms")

	// msg="download progress: 1.2 MiB of 3.0 MiB (40%), 1.0 MiB/s, 2s left" kind=download subject=debian-<id>.raw ...
	line := regexp.MustCompile(`msg="download progress: [0-9.]+ [KM]?i?B of 3\.0 MiB \([0-9]+%\), [0-9.]+ [KM]?i?B/s, ([0-9]+m)?[0-9]+s left" ` +
		`kind=download subject=debian-[0-9a-f]{32}\.raw done=[0-9]+ elapsed=\S+ total=3145728 bytes_per_second=[0-9]+ eta=([0-9]+m)?[0-9]+s`)
	// image-status shows the running download as the daemon left it in the
	// images-dir.
	row := regexp.MustCompile(`(?m)^\| download \| debian-[0-9a-f]{32}\.raw \| [0-9.]+ [KM]?i?B of 3\.0 MiB \([0-9]+%\), [0-9.]+ [KM]?i?B/s(, ([0-9]+m)?[0-9]+s left)? +\| 00:00:0[0-9]:[0-5][0-9] \|$`)
	// Both while the download runs: the log line, and the row of image-status.
	var logged, shown bool
	testenv.WaitFor(t, 40*time.Second, "a progress line of the raw download, and its row in image-status", func() bool {
		logged = logged || line.MatchString(d.logs.String())
		out := e.must(0, []string{"image-status"}).stdout
		shown = shown || (strings.Contains(out, "Running now (daemon pid ") && row.MatchString(out))
		return logged && shown
	}, d.logs.String)
	for _, l := range strings.Split(d.logs.String(), "\n") {
		if strings.Contains(l, "progress: ") && strings.Contains(l, "/logs/") {
			t.Errorf("a progress line names the artifact's URL: %s", l)
		}
	}
}
