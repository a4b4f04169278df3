package metrics

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
)

// gaugeLines are gauges as "name:value" lines, for comparing.
func gaugeLines(gs []gauge) []string {
	out := make([]string, len(gs))
	for i, g := range gs {
		out[i] = fmt.Sprintf("%s:%d", g.Name, g.Value)
	}
	return out
}

// TestImageStatesFollowTheWork: the codes of nodepool's builder as builds and
// uploads of this process start, fail and end, and as images and their
// uploads are paused; the gauges come in nodepool's order.
func TestImageStatesFollowTheWork(t *testing.T) {
	m, err := New(Options{Hostname: "b1.example.com"})
	if err != nil {
		t.Fatal(err)
	}
	s := ImageStates{
		Images:    []string{"fedora", "debian"},
		Paused:    map[string]bool{},
		Providers: map[string]map[string]bool{"debian": {"pb": true, "pa": false}},
		Requested: map[string]bool{"fedora": true},
	}
	const h = "nodepool.builder.b1.example.com.image."
	// check compares the gauges with want, in order: names and values.
	check := func(step string, want ...string) {
		t.Helper()
		if got := gaugeLines(m.imageStateGauges(s)); !slices.Equal(got, want) {
			t.Errorf("%s: gauges\n%q\nwant\n%q", step, got, want)
		}
	}
	// states are the gauges of the two images: debian's build state, its
	// upload states in pa and pb, fedora's build state.
	states := func(debian, pa, pb, fedora int) []string {
		return []string{
			fmt.Sprintf("%sdebian.build.state:%d", h, debian),
			fmt.Sprintf("%sdebian.provider.pa.upload.state:%d", h, pa),
			fmt.Sprintf("%sdebian.provider.pb.upload.state:%d", h, pb),
			"nodepool.image.debian.image_build_requests:0",
			fmt.Sprintf("%sfedora.build.state:%d", h, fedora),
			"nodepool.image.fedora.image_build_requests:1",
			"nodepool.image_build_requests:1",
		}
	}
	idle := states(StatusIdle, StatusIdle, StatusPaused, StatusIdle)
	check("nothing running", idle...)

	built := m.Building("debian")
	check("a build running", states(StatusBuilding, StatusIdle, StatusPaused, StatusIdle)...)
	built() // it failed, or ended: the same to nodepool's builder
	built() // and ending twice counts once
	check("the build failed", idle...)

	s.Paused["debian"] = true
	check("builds paused", states(StatusPaused, StatusIdle, StatusPaused, StatusIdle)...)
	built = m.Building("debian") // begun before the pause, say
	check("a build running while paused", states(StatusBuilding, StatusIdle, StatusPaused, StatusIdle)...)
	built()
	check("the build ended while paused", states(StatusPaused, StatusIdle, StatusPaused, StatusIdle)...)
	s.Paused["debian"] = false

	first := m.Uploading("debian", "pa")
	second := m.Uploading("debian", "pa") // another build's upload to pa
	check("two uploads running", states(StatusIdle, StatusUploading, StatusPaused, StatusIdle)...)
	first()
	check("one upload ended", states(StatusIdle, StatusUploading, StatusPaused, StatusIdle)...)
	second()
	check("both uploads ended", idle...)
	paused := m.Uploading("debian", "pb") // begun before pb paused it, say
	check("an upload running where uploads are paused", states(StatusIdle, StatusIdle, StatusUploading, StatusIdle)...)
	paused()
	check("that upload ended", idle...)

	// Work that a reload took from the config still shows while it runs.
	up := m.Uploading("debian", "pc")
	built = m.Building("ubuntu")
	check("work the config no longer has",
		h+"debian.build.state:0", h+"debian.provider.pa.upload.state:0", h+"debian.provider.pb.upload.state:3",
		h+"debian.provider.pc.upload.state:2", "nodepool.image.debian.image_build_requests:0",
		h+"fedora.build.state:0", "nodepool.image.fedora.image_build_requests:1",
		h+"ubuntu.build.state:1", "nodepool.image.ubuntu.image_build_requests:0",
		"nodepool.image_build_requests:1")
	up()
	built()
	check("that work ended", idle...)

	s.Requested["debian"] = true
	want := states(StatusIdle, StatusIdle, StatusPaused, StatusIdle)
	want[3], want[6] = "nodepool.image.debian.image_build_requests:1", "nodepool.image_build_requests:2"
	check("two requests", want...)
}

// TestSendImageStates sends the gauges to a UDP listener: with the prefix, as
// gauges, in one packet.
func TestSendImageStates(t *testing.T) {
	sd := testenv.NewStatsd(t)
	m, err := New(Options{Getenv: sd.Getenv("site"), Hostname: "b1"})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	defer m.Building("debian")()
	m.SendImageStates(ImageStates{Images: []string{"debian"}, Providers: map[string]map[string]bool{"debian": {"pa": false}}})
	want := []string{
		"site.nodepool.builder.b1.image.debian.build.state:1|g",
		"site.nodepool.builder.b1.image.debian.provider.pa.upload.state:0|g",
		"site.nodepool.image.debian.image_build_requests:0|g",
		"site.nodepool.image_build_requests:0|g",
	}
	if got := sd.Packet(5 * time.Second); !slices.Equal(got, want) {
		t.Errorf("statsd packet = %q, want %q", got, want)
	}
	if extra := sd.Quiet(200 * time.Millisecond); len(extra) > 0 {
		t.Errorf("more statsd lines: %q", extra)
	}
}

// TestPackets: a batch is packed as Python's statsd client packs a pipeline:
// packets of fewer than 512 bytes, lines in order.
func TestPackets(t *testing.T) {
	line := func(n int) string { return strings.Repeat("x", n) }
	for _, c := range []struct {
		name  string
		lines []string
		want  []string
	}{
		{"none", nil, nil},
		{"one", []string{"a:1|g"}, []string{"a:1|g"}},
		{"joined by newlines", []string{"a:1|g", "b:2|g"}, []string{"a:1|g\nb:2|g"}},
		{"511 bytes fit", []string{line(255), line(255)}, []string{line(255) + "\n" + line(255)}},
		{"512 bytes do not", []string{line(255), line(256)}, []string{line(255), line(256)}},
		{"a long line goes alone", []string{"a", line(600), "b"}, []string{"a", line(600), "b"}},
	} {
		if got := packets(c.lines); !slices.Equal(got, c.want) {
			t.Errorf("%s: packets = %q, want %q", c.name, got, c.want)
		}
	}
}
