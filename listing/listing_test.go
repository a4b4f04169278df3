package listing

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/store"
)

func TestShorten(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"  spaces\n and\tlines ", 20, "spaces and lines"},
		{"upload debian to cloud-a: connection refused", 20, "upload...ion refused"},
	} {
		if got := Shorten(tc.in, tc.n); got != tc.want || len([]rune(got)) > tc.n {
			t.Errorf("Shorten(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

func TestAge(t *testing.T) {
	got := Age(time.Now().Add(-(26*time.Hour + 3*time.Minute + 4*time.Second)))
	if got != "01:02:03:04" && got != "01:02:03:05" {
		t.Errorf("Age = %q, want 01:02:03:04", got)
	}
	if got := Age(time.Now().Add(time.Hour)); got != "00:00:00:00" {
		t.Errorf("Age of a time to come = %q", got)
	}
}

func TestTable(t *testing.T) {
	tb := Table{Header: []string{"A", "Long header"}}
	tb.Add("wide cell", "x")
	var b bytes.Buffer
	tb.Write(&b)
	want := `+-----------+-------------+
| A         | Long header |
+-----------+-------------+
| wide cell | x           |
+-----------+-------------+
`
	if b.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", b.String(), want)
	}
}

// TestImageStatus checks the rows' reading: pauses from both places, a
// request pending until a build started after it runs, the newest ready build.
func TestImageStatus(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	cfg, err := config.Parse(filepath.Join(dir, "nodepool.yaml"), []byte(`images-dir: `+dir+`
diskimages:
  - name: dib-image
    pause: true
  - name: other
zuul-images:
  - name: debian
    api-url: http://zuul.invalid
    project: org/images
    job: build-debian
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(ctx, store.Options{ImagesDir: dir, Access: store.Create})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	mk := func(image string, state store.State) store.Build {
		b, err := st.CreateBuild(ctx, store.Build{Image: image, Source: store.SourceDIB})
		if err != nil {
			t.Fatal(err)
		}
		if state != store.Building {
			if err := st.SetBuildState(ctx, &b, state, ""); err != nil {
				t.Fatal(err)
			}
		}
		return b
	}
	mk("other", store.Ready)
	newest := mk("other", store.Ready)
	mk("other", store.Failed)
	if err := st.SetPaused(ctx, "dib-image", true); err != nil {
		t.Fatal(err)
	}
	if err := st.RequestBuild(ctx, "other"); err != nil {
		t.Fatal(err)
	}
	if err := st.Write(ctx, store.PutCursor(store.Cursor{Image: "debian", ZuulUUID: "zb1", Outcome: "failed", Reason: "bad checksum"})); err != nil {
		t.Fatal(err)
	}

	images, err := ImageStatus(ctx, st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(images) != 3 || images[0].Name != "dib-image" || images[1].Name != "other" || images[2].Name != "debian" {
		t.Fatalf("images = %+v", images)
	}
	if got := strings.Join(images[0].PausedBy, ","); got != PausedByConfig+","+PausedByCommand {
		t.Errorf("dib-image paused by %q", got)
	}
	if images[1].Newest == nil || images[1].Newest.ID != newest.ID || images[1].RequestState() != "pending" {
		t.Errorf("other: newest %v, request %q", images[1].Newest, images[1].RequestState())
	}
	j := images[2].JSON()
	if j.Source != "zuul" || j.LastZuulReason == nil || *j.LastZuulReason != "bad checksum" || j.NewestBuild != nil || j.PausedBy == nil {
		t.Errorf("debian = %+v", j)
	}

	mk("other", store.Building) // started after the request
	if images, err = ImageStatus(ctx, st, cfg); err != nil || images[1].RequestState() != "building" {
		t.Errorf("other with a build started after its request: %q, %v", images[1].RequestState(), err)
	}
	var b bytes.Buffer
	WriteImageStatus(&b, images)
	for _, w := range []string{"| dib-image | True ", "config,image-pause", "| other-" + newest.ID + " |", "zb1 (failed)"} {
		if !strings.Contains(b.String(), w) {
			t.Errorf("image-status table lacks %q:\n%s", w, b.String())
		}
	}
}
