package testenv

import (
	"bytes"
	"context"
	"image"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// Browser is Debian's headless Chromium, a real browser for checking a page.
type Browser struct {
	path string
	home string // a profile of the test's own, so runs never share one
}

// NewBrowser finds Chromium; it skips (fails under CI) when it is not installed.
func NewBrowser(t testing.TB) *Browser {
	t.Helper()
	return &Browser{path: RequireBinary(t, "chromium"), home: t.TempDir()}
}

// run runs Chromium headless on url with extra flags, and returns its stdout.
func (b *Browser) run(t testing.TB, url string, flags ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	args := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--no-first-run", "--hide-scrollbars",
		// Nothing that reaches out: the tests have no network, and waiting on it costs seconds.
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-extensions",
		"--disable-default-apps", "--user-data-dir=" + filepath.Join(b.home, "profile")}, flags...)
	cmd := exec.CommandContext(ctx, b.path, append(args, url)...)
	cmd.Env = append(os.Environ(), "HOME="+b.home)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %s: %v\n%s", url, err, stderr.String())
	}
	return stdout.Bytes()
}

// DOM returns the page at url as the browser parsed it, serialized.
func (b *Browser) DOM(t testing.TB, url string) string {
	t.Helper()
	return string(b.run(t, url, "--dump-dom"))
}

// Screenshot renders the page at url in a window of w x h pixels, saves the
// PNG at path and returns it decoded.
func (b *Browser) Screenshot(t testing.TB, url, path string, w, h int) image.Image {
	t.Helper()
	b.run(t, url, "--screenshot="+path, "--window-size="+strconv.Itoa(w)+","+strconv.Itoa(h))
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("screenshot of %s: %v", url, err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("screenshot of %s is not a PNG: %v", url, err)
	}
	return img
}

// DarkPixels counts the pixels of img darker than mid-grey: text drawn on a
// light page.
func DarkPixels(img image.Image) int {
	n := 0
	r := img.Bounds()
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			cr, cg, cb, _ := img.At(x, y).RGBA()
			if (cr+cg+cb)/3 < 0x8000 {
				n++
			}
		}
	}
	return n
}
