package diskimage

import (
	"os"
	"slices"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/source"
	"github.com/nodepool-builder/nodepool-builder/store"
)

const (
	id1 = "0123456789abcdef0123456789abcdef"
	id2 = "11111111111111111111111111111111"
)

func TestFormats(t *testing.T) {
	cfg, err := config.Parse("nodepool.yaml", []byte(`
images-dir: /images
diskimages:
  - name: lonely
    elements: [e]
  - name: tarred
    elements: [e]
    formats: [tar]
  - name: shared
    elements: [e]
    formats: [vhd]
providers:
  - name: a
    cloud: a
    diskimages: [{name: shared}]
  - name: b
    cloud: b
    image-format: raw
    diskimages: [{name: shared, pause: true}]
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	for image, want := range map[string][]string{
		"lonely": {"qcow2"},
		"tarred": {"tar"},
		"shared": {"qcow2", "raw", "vhd"},
	} {
		if got := Formats(cfg, image); !slices.Equal(got, want) {
			t.Errorf("Formats(%s) = %q, want %q", image, got, want)
		}
	}
}

// TestLastFailure: what holds a diskimage's next build back is its newest
// failed build since its newest ready one, unless the builder stopped that
// build; the next attempt is when the backoff has passed, or, when the image has
// a fresh ready build (an operator asked for the build that failed), when that
// build is rebuild-age old.
func TestLastFailure(t *testing.T) {
	logs := t.TempDir()
	cfg, err := config.Parse("nodepool.yaml", []byte(`
images-dir: /images
build-log-dir: `+logs+`
diskimages:
  - name: debian
    elements: [debian-minimal]
    formats: [raw]
    rebuild-age: 3600
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	build := func(id string, state store.State, reason string, age time.Duration, formats ...string) store.Build {
		b := store.Build{ID: id, Image: "debian", State: state, Reason: reason, StateTime: at.Add(-age)}
		for _, ft := range formats {
			b.SetFile(store.File{Format: ft, Present: true})
		}
		return b
	}
	if err := os.WriteFile(LogPath(logs, "debian", id1), []byte("Exit code: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	backoff := 10 * time.Minute
	for _, tc := range []struct {
		name   string
		builds []store.Build // newest first
		want   string        // the failed build's id; "" for none
		next   time.Time     // the next attempt
	}{
		{"none", nil, "", time.Time{}},
		{"ready", []store.Build{build(id1, store.Ready, "", 0, "raw")}, "", time.Time{}},
		{"failed", []store.Build{build(id1, store.Failed, "exited with code 1", time.Minute)}, id1, at.Add(9 * time.Minute)},
		{"failed before the newest ready", []store.Build{build(id2, store.Ready, "", 0, "raw"), build(id1, store.Failed, "x", time.Hour)}, "", time.Time{}},
		{"building after a failure", []store.Build{build(id2, store.Building, "", 0), build(id1, store.Failed, "x", time.Minute)}, id1, at.Add(9 * time.Minute)},
		{"interrupted", []store.Build{build(id1, store.Failed, source.InterruptedReason+": DIB was cancelled", time.Minute)}, "", time.Time{}},
		{"interrupted after a failure", []store.Build{build(id2, store.Failed, source.InterruptedReason, 0), build(id1, store.Failed, "x", time.Minute)}, id1, at.Add(9 * time.Minute)},
		{"another image", []store.Build{{ID: id2, Image: "fedora", State: store.Failed, StateTime: at}}, "", time.Time{}},
		{"failed after an old ready build", []store.Build{build(id1, store.Failed, "x", time.Minute), build(id2, store.Ready, "", 2*time.Hour, "raw")}, id1, at.Add(9 * time.Minute)},
		{"failed after a fresh ready build", []store.Build{build(id1, store.Failed, "x", time.Minute), build(id2, store.Ready, "", 20*time.Minute, "raw")}, id1, at.Add(40 * time.Minute)},
		{"failed after a fresh build that lacks a format", []store.Build{build(id1, store.Failed, "x", time.Minute), build(id2, store.Ready, "", 20*time.Minute, "qcow2")}, id1, at.Add(9 * time.Minute)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := LastFailure(cfg, "debian", tc.builds, backoff)
			switch {
			case tc.want == "" && got != nil:
				t.Fatalf("LastFailure = %+v, want none", got)
			case tc.want == "":
				return
			case got == nil || got.Build.ID != tc.want:
				t.Fatalf("LastFailure = %+v, want build %s", got, tc.want)
			}
			if !got.NextAttempt.Equal(tc.next) {
				t.Errorf("next attempt %s, want %s", got.NextAttempt, tc.next)
			}
			if want := LogPath(logs, "debian", id1); got.Log != want {
				t.Errorf("log %q, want %q", got.Log, want)
			}
		})
	}
}
