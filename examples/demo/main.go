// Command demo runs nodepool-builder's main job end to end on this machine: a
// throwaway Glance on loopback, a stand-in Zuul that serves small generated images
// (a qcow2 made by qemu-img and a zstd-compressed raw), one --once run and the
// resulting image-list, then the daemon with its status page until Enter is
// pressed. Everything it starts is stopped and removed at the end.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

func main() {
	builder := flag.String("builder", "bin/nodepool-builder", "the nodepool-builder binary to run")
	keep := flag.Bool("keep", false, "keep the demo's directory (images, state, logs) instead of removing it")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := demo(ctx, *builder, *keep); err != nil {
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
}

func step(format string, args ...any) { fmt.Printf("\n==> "+format+"\n", args...) }

func demo(ctx context.Context, builder string, keep bool) error {
	builder, err := filepath.Abs(builder)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "nodepool-builder-demo-")
	if err != nil {
		return err
	}
	if keep {
		defer fmt.Printf("\nThe demo's files are kept in %s\n", dir)
	} else {
		defer os.RemoveAll(dir)
	}

	step("Generating a small disk image: raw, and qcow2 with qemu-img")
	raw, qcow2, err := makeImages(ctx, dir)
	if err != nil {
		return err
	}

	step("Starting a throwaway Glance on loopback")
	glance, stopGlance, err := testenv.StartGlance(ctx, filepath.Join(dir, "glance"), nil)
	if err != nil {
		return err
	}
	defer stopGlance()
	fmt.Println("Glance at", glance.Endpoint)

	step("Starting a stand-in Zuul that publishes the image as build artifacts")
	zuul := zuultest.NewServer(zuultest.ServerOptions{Tenant: "example"})
	defer zuul.Close()
	zb, err := zuul.AddBuild(zuultest.BuildSpec{
		Job:      "build-debian-bookworm-image",
		Project:  "org/images",
		Pipeline: "periodic",
		Artifacts: []zuultest.ArtifactSpec{
			{Name: "debian-bookworm qcow2", Path: qcow2, Metadata: meta("qcow2")},
			{Name: "debian-bookworm raw", Path: raw, Compress: "zst", Metadata: meta("raw")},
			// Published, but no provider takes vhd: it is never downloaded.
			{Name: "debian-bookworm vhd", Path: raw, Compress: "zst", Metadata: meta("vhd")},
		},
	})
	if err != nil {
		return err
	}
	fmt.Printf("Zuul at %s, build %s publishes:\n", zuul.URL(), zb.UUID)
	for _, a := range zb.Artifacts {
		fmt.Printf("  %-24s %s (%d bytes served)\n", a.Name, a.URL, a.ServedSize)
	}

	port, err := freePort()
	if err != nil {
		return err
	}
	// nodepool.yaml is nodepool's file, which a launcher reads too; the
	// builder's own settings are in nodepool-builder.yaml beside it.
	cfgPath := filepath.Join(dir, "nodepool.yaml")
	cfg := fmt.Sprintf(nodepoolTemplate, filepath.Join(dir, "images"))
	// Two clouds of the one Glance, each with the image_format nodepool and
	// the builder take a provider's format from.
	cloudsFile := filepath.Join(dir, "clouds.yaml")
	clouds := fmt.Sprintf(cloudsTemplate, glance.Endpoint, glance.Endpoint)
	if err := os.WriteFile(cloudsFile, []byte(clouds), 0o600); err != nil {
		return err
	}
	own := fmt.Sprintf(builderTemplate, port, zuul.URL())
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "nodepool-builder.yaml"), []byte(own), 0o644); err != nil {
		return err
	}
	step("nodepool.yaml")
	fmt.Print(cfg)
	step("nodepool-builder.yaml")
	fmt.Print(own)

	env := append(os.Environ(), "OS_CLIENT_CONFIG_FILE="+cloudsFile)
	step("nodepool-builder --once")
	if err := runBuilder(ctx, env, builder, "-c", cfgPath, "--once"); err != nil {
		return fmt.Errorf("nodepool-builder --once: %w", err)
	}
	step("nodepool-builder dib-image-list")
	if err := runBuilder(ctx, env, builder, "-c", cfgPath, "dib-image-list"); err != nil {
		return err
	}
	step("nodepool-builder image-list")
	if err := runBuilder(ctx, env, builder, "-c", cfgPath, "image-list"); err != nil {
		return err
	}
	step("What Glance holds")
	if err := showGlance(ctx, glance.Endpoint); err != nil {
		return err
	}
	for _, a := range zb.Artifacts {
		fmt.Printf("Zuul served %-24s %d bytes\n", a.Name, zuul.BytesServed(a.Path))
	}
	step("nodepool-builder (the daemon, with its status pages)")
	return serveStatus(ctx, env, builder, cfgPath, port)
}

// serveStatus runs the daemon until Enter is pressed, stdin ends or the demo
// is interrupted; with stdin not a terminal it stops as soon as the page
// answers, so that the demo also runs unattended.
func serveStatus(ctx context.Context, env []string, bin, cfgPath string, port int) error {
	cmd := exec.Command(bin, "-c", cfgPath)
	cmd.Env = env
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	var waitErr error // how the daemon exited; set before exited is closed
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	stop := func() error {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
			if waitErr != nil {
				return fmt.Errorf("the daemon stopped with %w:\n%s", waitErr, logs.String())
			}
			return nil
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-exited
			return fmt.Errorf("the daemon did not stop within 30 s of SIGTERM")
		}
	}
	url := fmt.Sprintf("http://127.0.0.1:%d/", port)
	if err := waitPage(ctx, url+"healthz", exited); err != nil {
		stop()
		return fmt.Errorf("%w\n%s", err, logs.String())
	}
	fmt.Printf("Status page: %s (press Enter to stop)\n", url)
	if fi, err := os.Stdin.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
		// The read cannot be cancelled; it ends with the demo.
		enter := make(chan struct{})
		go func() {
			bufio.NewReader(os.Stdin).ReadString('\n')
			close(enter)
		}()
		select {
		case <-enter:
		case <-ctx.Done():
		case <-exited:
			return fmt.Errorf("the daemon stopped by itself: %v\n%s", waitErr, logs.String())
		}
	}
	fmt.Println("Stopping the daemon")
	return stop()
}

// waitPage waits until url answers 200, the daemon exits, or 30 s pass.
func waitPage(ctx context.Context, url string, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-exited:
			return errors.New("the daemon exited at start")
		case <-ctx.Done():
			return fmt.Errorf("the status page at %s did not answer: %w", url, ctx.Err())
		case <-t.C:
		}
	}
}

// freePort returns a TCP port on loopback that nothing listens on now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port for the status pages: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func meta(format string) map[string]any {
	return map[string]any{"type": "zuul_image", "image_name": "debian-bookworm", "format": format}
}

const nodepoolTemplate = `images-dir: %s
# The zuul-image, declared to nodepool: providers and labels name it.
diskimages:
  - name: debian-bookworm
    pause: true
labels:
  - name: debian-bookworm
providers:
  - name: cloud-qcow2
    cloud: cloud-qcow2
    diskimages:
      - name: debian-bookworm
    pools:
      - name: main
        max-servers: 2
        labels:
          - name: debian-bookworm
            diskimage: debian-bookworm
            min-ram: 1024
  - name: cloud-raw
    cloud: cloud-raw
    diskimages:
      - name: debian-bookworm
        meta:
          hw_disk_bus: scsi
`

const cloudsTemplate = `clouds:
  cloud-qcow2:
    auth_type: none
    image_endpoint_override: %s
    image_format: qcow2
  cloud-raw:
    auth_type: none
    image_endpoint_override: %s
    image_format: raw
`

const builderTemplate = `builder:
  webapp:
    listen-address: 127.0.0.1
    port: %d
zuul-images:
  - name: debian-bookworm
    api-url: %s
    tenant: example
    project: org/images
    job: build-debian-bookworm-image
`

// makeImages writes a 16 MiB raw disk with some content and its qcow2 conversion.
func makeImages(ctx context.Context, dir string) (raw, qcow2 string, err error) {
	raw, qcow2 = filepath.Join(dir, "disk.raw"), filepath.Join(dir, "disk.qcow2")
	f, err := os.Create(raw)
	if err != nil {
		return "", "", err
	}
	block := []byte(strings.Repeat("nodepool-builder demo disk ", 40)[:1024])
	for i := 0; i < 4*1024; i++ { // 4 MiB of content in a 16 MiB disk
		if _, err := f.Write(block); err != nil {
			f.Close()
			return "", "", err
		}
	}
	if err := f.Truncate(16 << 20); err != nil {
		f.Close()
		return "", "", err
	}
	if err := f.Close(); err != nil {
		return "", "", err
	}
	out, err := exec.CommandContext(ctx, "qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, qcow2).CombinedOutput()
	if err != nil {
		return "", "", fmt.Errorf("qemu-img convert: %w: %s", err, out)
	}
	return raw, qcow2, nil
}

func runBuilder(ctx context.Context, env []string, bin string, args ...string) error {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stdout
	return cmd.Run()
}

func showGlance(ctx context.Context, endpoint string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(endpoint, "/")+"/v2/images", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("list Glance images: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var list struct {
		Images []map[string]any `json:"images"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return fmt.Errorf("list Glance images: %w: %s", err, body)
	}
	for _, img := range list.Images {
		size, _ := img["size"].(float64)
		fmt.Printf("  %-36v %-30v %-6v %-7v %10.0f bytes  provider=%v\n", img["id"], img["name"], img["disk_format"],
			img["status"], size, img["nodepool_provider_name"])
	}
	return nil
}
