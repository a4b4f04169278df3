package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/builder"
	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/progress"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// TestDaemonShowsDownloadProgress: an artifact served through a proxy slowed
// to 1 MiB/s takes seconds to download; the daemon, with a short progress
// interval, logs lines with the bytes, rate and ETA of the download while it
// runs, and leaves the task where image-status reads it. No provider: the
// zuul-image asks for raw itself, so no cloud is needed.
func TestDaemonShowsDownloadProgress(t *testing.T) {
	e := &env{t: t, dir: t.TempDir(), qemuImg: testenv.RequireBinary(t, "qemu-img"), zuul: zuultest.NewServer(zuultest.ServerOptions{})}
	t.Cleanup(e.zuul.Close)
	slow := testenv.NewProxy(t, strings.TrimPrefix(e.zuul.URL(), "http://"))
	slow.SetRate(1 << 20)
	img := e.makeImage(1) // 3 MiB raw: about 3 s
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
`), 0o644); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, e.cfgPath, "--progress-interval", "300ms")

	// msg="download progress: 1.2 MiB of 3.0 MiB (40%), 1.0 MiB/s, 2s left" kind=download subject=debian-<id>.raw ...
	line := regexp.MustCompile(`msg="download progress: [0-9.]+ [KM]?i?B of 3\.0 MiB \([0-9]+%\), [0-9.]+ [KM]?i?B/s, [0-9]+s left" ` +
		`kind=download subject=debian-[0-9a-f]{32}\.raw done=[0-9]+ elapsed=\S+ total=3145728 bytes_per_second=[0-9]+ eta=[0-9]+s`)
	cfg, err := config.Load(e.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	st, err := builder.OpenState(context.Background(), cfg, builder.StateOptions{Access: store.ReadOnly})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// Both while the download runs: the log line, and the task in the file
	// image-status reads.
	var logged, filed bool
	waitFor(t, 15*time.Second, "a progress line of the raw download, and its task in the progress status file", func() bool {
		logged = logged || line.MatchString(d.logs.String())
		s, err := builder.ReadProgress(st)
		if err != nil {
			t.Fatal(err)
		}
		if s != nil && !s.Stale(time.Now()) {
			for _, k := range s.Tasks {
				if k.Kind == progress.Download && strings.HasSuffix(k.Subject, ".raw") && k.Total == 3<<20 && k.Done > 0 && k.Done < k.Total {
					filed = true
				}
			}
		}
		return logged && filed
	}, d.logs.String)
	for _, l := range strings.Split(d.logs.String(), "\n") {
		if strings.Contains(l, "progress: ") && strings.Contains(l, "/logs/") {
			t.Errorf("a progress line names the artifact's URL: %s", l)
		}
	}
}
