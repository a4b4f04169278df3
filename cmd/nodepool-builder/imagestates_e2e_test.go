package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/fqdn"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// stateGauge tells whether a statsd line is one of nodepool 11's builder
// gauges, which the daemon sends on every lifecycle pass.
func stateGauge(line string) bool {
	return strings.HasPrefix(line, "nodepool.builder.") || strings.HasPrefix(line, "nodepool.image.") ||
		strings.HasPrefix(line, "nodepool.image_build_requests:")
}

// waitStates reads statsd packets until a batch of nodepool 11's builder
// gauges (the lines up to nodepool.image_build_requests, which ends each)
// is want, in order, and returns the batches read meanwhile; the test fails,
// showing them, when deadline passes first.
func waitStates(t *testing.T, sd *testenv.Statsd, deadline time.Duration, what string, want []string, logs func() string) [][]string {
	t.Helper()
	end := time.Now().Add(deadline)
	var batches [][]string
	var cur []string
	for time.Now().Before(end) {
		for _, l := range sd.Packet(time.Until(end)) {
			if !stateGauge(l) {
				continue
			}
			cur = append(cur, l)
			if strings.HasPrefix(l, "nodepool.image_build_requests:") {
				batches = append(batches, cur)
				if slices.Equal(cur, want) {
					return batches
				}
				cur = nil
			}
		}
	}
	t.Fatalf("no batch of builder gauges %s within %s: want\n%q\ngot\n%q\n%s", what, deadline, want, batches, logs())
	return nil
}

// stateHook is a post-upload-hook that says it started, in
// {{DIR}}/hook-started-<provider>, and waits until {{DIR}}/hook-go exists.
const stateHook = `#!/bin/sh
: >'{{DIR}}/hook-started-'"$1"
while [ ! -e '{{DIR}}/hook-go' ]; do
	sleep 0.1
done
`

// stateConfig is a diskimage whose builds wait for {{DIR}}/dib-go, uploaded
// to cloud-q through stateHook, and listed by cloud-r, which pauses its
// uploads.
const stateConfig = `images-dir: {{IMAGES}}
build-log-dir: {{LOGS}}
diskimages:
  - name: dib-image
    dib-cmd: {{DIB}}
    elements: [debian-minimal]
    env-vars:
      FAKE_DIB_WAIT_FOR: {{DIR}}/dib-go
providers:
  - name: cloud-q
    cloud: {{CLOUD}}
    image-format: qcow2
    post-upload-hook: {{DIR}}/hook
    diskimages:
      - name: dib-image
  - name: cloud-r
    cloud: {{CLOUD}}
    image-format: raw
    diskimages:
      - name: dib-image
        pause: true
`

// TestImageStateGauges: the daemon sends nodepool 11's builder gauges, with
// nodepool's names and codes, at each lifecycle pass: building (1) while a
// DIB build runs, uploading (2) in a provider while an upload to a real
// Glance runs there, paused (3) for a paused image and for a provider that
// pauses its uploads, idle (0) otherwise; and the build requests pending.
func TestImageStateGauges(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	e.writeYAML(stateConfig)
	writeFileT(t, filepath.Join(e.dir, "hook"), strings.ReplaceAll(stateHook, "{{DIR}}", e.dir))
	if err := os.Chmod(filepath.Join(e.dir, "hook"), 0o755); err != nil {
		t.Fatal(err)
	}
	sd := testenv.NewStatsd(t)
	t.Setenv("STATSD_HOST", sd.Host)
	t.Setenv("STATSD_PORT", sd.Port)
	d := startDaemon(t, e.cfgPath)

	h := "nodepool.builder." + fqdn.Name(context.Background()) + ".image.dib-image."
	states := func(build, q, r, requests int) []string {
		return []string{
			fmt.Sprintf("%sbuild.state:%d|g", h, build),
			fmt.Sprintf("%sprovider.cloud-q.upload.state:%d|g", h, q),
			fmt.Sprintf("%sprovider.cloud-r.upload.state:%d|g", h, r),
			fmt.Sprintf("nodepool.image.dib-image.image_build_requests:%d|g", requests),
			fmt.Sprintf("nodepool.image_build_requests:%d|g", requests),
		}
	}
	touch := func(name string) {
		t.Helper()
		writeFileT(t, filepath.Join(e.dir, name), "")
	}
	exists := func(name string) func() bool {
		return func() bool {
			_, err := os.Stat(filepath.Join(e.dir, name))
			return err == nil
		}
	}
	const pass = 30 * time.Second // a lifecycle pass comes every 10 s

	// 1. The first build runs until the test lets it end.
	testenv.WaitFor(t, time.Minute, "the first build to start", exists("dib-go.started"), d.logs.String)
	batches := waitStates(t, sd, pass, "while building", states(1, 0, 3, 0), d.logs.String)
	for _, b := range batches[:len(batches)-1] {
		if !slices.Equal(b, states(0, 0, 3, 0)) {
			t.Errorf("a batch before the build: %q, want all idle but cloud-r's paused uploads", b)
		}
	}
	// A build requested meanwhile is pending: no build begun after it runs.
	e.must(0, []string{"image-build", "dib-image"})
	waitStates(t, sd, pass, "with the build requested", states(1, 0, 3, 1), d.logs.String)
	// Paused while it builds, the image stays building until the build ends:
	// the first batch may have been made before the pause, the second not.
	e.must(0, []string{"image-pause", "dib-image"})
	for range 2 {
		waitStates(t, sd, pass, "paused while building", states(1, 0, 3, 1), d.logs.String)
	}

	// 2. The build ends; its upload to cloud-q runs until the test lets it
	// end, and none goes to cloud-r. The request waits while the image is
	// paused.
	touch("dib-go")
	testenv.WaitFor(t, time.Minute, "the upload to cloud-q to reach its hook", exists("hook-started-cloud-q"), d.logs.String)
	waitStates(t, sd, pass, "while uploading", states(3, 2, 3, 1), d.logs.String)
	touch("hook-go")
	testenv.WaitFor(t, time.Minute, "the upload to be ready", func() bool {
		ups := e.uploadsJSON()
		return len(ups) == 1 && ups[0].State == "ready"
	}, d.logs.String)
	waitStates(t, sd, pass, "once uploaded", states(3, 0, 3, 1), d.logs.String)
	if exists("hook-started-cloud-r")() {
		t.Error("an upload went to cloud-r, which pauses them")
	}

	// 3. Unpaused, the image is built for the request, which then is no more.
	e.must(0, []string{"image-unpause", "dib-image"})
	testenv.WaitFor(t, 2*time.Minute, "the requested build and its upload", func() bool {
		ups := e.uploadsJSON()
		return len(ups) == 2 && ups[0].State == "ready" && ups[1].State == "ready"
	}, d.logs.String)
	waitStates(t, sd, pass, "once the request is answered", states(0, 0, 3, 0), d.logs.String)
}

// statesNodepoolYAML is the nodepool.yaml of nodepool's builder and ours in
// TestImageStateGaugesAsNodepools: dib-image paused, so that neither builds
// it, listed by cloud-q and by cloud-r, which pauses its uploads.
const statesNodepoolYAML = `images-dir: '%(NODEPOOL_IMAGES_DIR)'
build-log-dir: '%(NODEPOOL_BUILD_LOG_DIR)'
labels:
  - name: dib-label
diskimages:
  - name: dib-image
    elements: [debian-minimal]
    pause: true
providers:
  - name: cloud-q
    cloud: qcloud
    diskimages:
      - name: dib-image
    pools:
      - name: main
        labels:
          - name: dib-label
            diskimage: dib-image
            min-ram: 1024
  - name: cloud-r
    cloud: rcloud
    diskimages:
      - name: dib-image
        pause: true
    pools:
      - name: main
        labels:
          - name: dib-label
            diskimage: dib-image
            min-ram: 1024
`

// TestImageStateGaugesAsNodepools runs nodepool's own builder (the vendored
// Python code) and ours on one TLS ZooKeeper and one nodepool.yaml, each with
// its statsd listener, and reads the same batch of builder gauges from both:
// the same names, host included, values and order, for an image of their
// config and for an image only ZooKeeper has, each with a build request.
func TestImageStateGaugesAsNodepools(t *testing.T) {
	b := newBeside(t)
	b.e.writeYAML(statesNodepoolYAML + nodepoolZKKeys(t, b.z))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, image := range []string{"dib-image", "other-image"} {
		if _, err := testenv.RunKazoo(ctx, kazooConn(b.z), requestBuild, image); err != nil {
			t.Fatal(err)
		}
	}
	h := "nodepool.builder." + fqdn.Name(context.Background()) + ".image."
	want := []string{
		h + "dib-image.build.state:3|g",
		h + "dib-image.provider.cloud-q.upload.state:0|g",
		h + "dib-image.provider.cloud-r.upload.state:3|g",
		"nodepool.image.dib-image.image_build_requests:1|g",
		h + "other-image.build.state:0|g",
		"nodepool.image.other-image.image_build_requests:1|g",
		"nodepool.image_build_requests:2|g",
	}

	py := testenv.NewStatsd(t)
	b.pyEnv = append(b.pyEnv, py.Env()...)
	b.startPython(b.e.cfgPath)
	ours := testenv.NewStatsd(t)
	t.Setenv("STATSD_HOST", ours.Host)
	t.Setenv("STATSD_PORT", ours.Port)
	b.ours = startDaemon(t, b.e.cfgPath)
	// nodepool's builder sends a batch when it starts and every 60 s; the
	// first may come before its workers have looked at the images.
	got := waitStates(t, py, 3*time.Minute, "from nodepool's builder", want, b.logs)
	t.Logf("nodepool's builder sent %q", got[len(got)-1])
	waitStates(t, ours, time.Minute, "from ours", want, b.logs)
}
