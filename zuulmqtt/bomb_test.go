package zuulmqtt

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/ratelimit"
	"github.com/nodepool-builder/nodepool-builder/zuulapi"
)

// bomb is a forged report as large as a message may be: a 512 KiB project
// that every one of its many builds shares, each build with a uuid of its
// own making. withUUIDs gives every build the same valid uuid (fewer builds
// then fit); otherwise each has a one-letter uuid.
func bomb(withUUIDs bool) []byte {
	project := strings.Repeat("p", 512<<10)
	build := `{"uuid":"a"}`
	if withUUIDs {
		build = `{"uuid":"` + buildUUID + `","job_name":"build-debian","result":"SUCCESS"}`
	}
	n := (MaxMessageSize - len(project) - 200) / (len(build) + 1)
	builds := strings.TrimSuffix(strings.Repeat(build+",", n), ",")
	msg := `{"action":"success","tenant":"example","pipeline":"post","project":"` + project +
		`","branch":"master","buildset":{"result":"SUCCESS","builds":[` + builds + `]}}`
	if len(msg) > MaxMessageSize || !json.Valid([]byte(msg)) {
		panic("the bomb is no message the listener reads")
	}
	return []byte(msg)
}

// wildImages are zuul-images whose filters hold wildcards, as Zuul's LIKE
// filters do: matching them must cost no more than an exact name.
func wildImages() []config.ZuulImage {
	images := testImages()
	wild := debianImage()
	wild.Name, wild.Project, wild.JobName, wild.Pipelines = "wild", "org/*", "build-*-image", []string{"peri*", "p*st"}
	return append(images, wild)
}

// TestMatchAllocatesNothing: whether a reported build could be a zuul-image's
// is a yes or a no, told without allocating, whether it matches or not, with
// wildcards or not, and however long the build's fields: a report's many
// builds cost comparisons, never reasons or compiled patterns.
func TestMatchAllocatesNothing(t *testing.T) {
	long := strings.Repeat("x", 64<<10)
	good := zuulapi.Build{UUID: buildUUID, JobName: "build-debian", Result: "SUCCESS", Pipeline: "post", Final: true,
		Ref: zuulapi.Ref{Project: "org/images", Branch: "master"}}
	for name, zb := range map[string]zuulapi.Build{
		"a match":      good,
		"another job":  func() zuulapi.Build { b := good; b.JobName = "build-evil"; return b }(),
		"long fields":  func() zuulapi.Build { b := good; b.Ref.Project, b.JobName, b.Ref.Branch = long, long, long; return b }(),
		"a bad uuid":   func() zuulapi.Build { b := good; b.UUID = long; return b }(),
		"a failure":    func() zuulapi.Build { b := good; b.Result = "FAILURE"; return b }(),
		"a wild match": func() zuulapi.Build { b := good; b.JobName = "build-debian-image"; return b }(),
	} {
		for _, zi := range wildImages() {
			if n := testing.AllocsPerRun(100, func() { couldBe(&zi, "example", zb) }); n != 0 {
				t.Errorf("%s against %s: %v allocations a match, want none", name, zi.Name, n)
			}
		}
	}
}

// TestBombCostsMilliseconds: a forged report of a megabyte, every build of it
// sharing a 512 KiB project, is read, found to hint at nothing and dropped in
// well under two seconds (it took minutes of CPU per zuul-image when every
// build was checked against every image with its reasons spelt out); a real
// report right after it hints at once.
func TestBombCostsMilliseconds(t *testing.T) {
	var hints []string
	l, err := New(config.ZuulMQTT{URL: "mqtt://127.0.0.1:1", Host: "127.0.0.1", Port: 1},
		Options{Images: wildImages, Hint: func(image string) { hints = append(hints, image) }})
	if err != nil {
		t.Fatal(err)
	}
	lim := ratelimit.New(DefaultHintBurst, DefaultHintInterval)
	for _, withUUIDs := range []bool{false, true} {
		payload := bomb(withUUIDs)
		done := make(chan time.Duration, 1)
		go func() {
			start := time.Now()
			l.handle(message{topic: topic, payload: payload}, lim)
			done <- time.Since(start)
		}()
		select {
		case took := <-done:
			t.Logf("a bomb of %d bytes (valid uuids: %v) handled in %s", len(payload), withUUIDs, took.Round(time.Millisecond))
		case <-time.After(2 * time.Second):
			t.Fatalf("a bomb of %d bytes (valid uuids: %v) is still being handled after 2s", len(payload), withUUIDs)
		}
	}
	if len(hints) != 0 {
		t.Errorf("the bombs hinted at %v, want nothing", hints)
	}
	l.handle(message{topic: topic, payload: zuulReport(nil)}, lim)
	if len(hints) != 1 || hints[0] != "debian" {
		t.Errorf("the real report after the bombs hinted at %v, want [debian]", hints)
	}
}

// TestReportBuildsBounded: a report's builds that cannot be a successful
// build a poll fetches are dropped before any zuul-image is looked at, and
// no more than maxReportBuilds are read.
func TestReportBuildsBounded(t *testing.T) {
	long := strings.Repeat("x", maxNameLen+1)
	other := strings.Repeat("b", 32)
	for name, tt := range map[string]struct {
		edit func(r, b map[string]any)
		want int
	}{
		"a build":             {nil, 1},
		"no builds":           {func(r, b map[string]any) { r["buildset"].(map[string]any)["builds"] = nil }, 0},
		"a failure":           {func(r, b map[string]any) { b["result"] = "FAILURE" }, 0},
		"a uuid of 31 digits": {func(r, b map[string]any) { b["uuid"] = buildUUID[1:] }, 0},
		"a long job":          {func(r, b map[string]any) { b["job_name"] = long }, 0},
		"a long project":      {func(r, b map[string]any) { b["change"].(map[string]any)["project"] = long }, 0},
		"a long pipeline":     {func(r, b map[string]any) { r["pipeline"] = long }, 0},
		"the same build twice": {func(r, b map[string]any) {
			r["buildset"].(map[string]any)["builds"] = []any{b, b}
		}, 1},
		"too many builds": {func(r, b map[string]any) {
			builds := make([]any, maxReportBuilds+1)
			for i := range builds {
				c := map[string]any{"job_name": "build-debian", "result": "SUCCESS", "uuid": fmt.Sprintf("%032x", i)}
				builds[i] = c
			}
			builds[maxReportBuilds] = map[string]any{"job_name": "build-debian", "result": "SUCCESS", "uuid": other}
			r["buildset"].(map[string]any)["builds"] = builds
		}, maxReportBuilds},
	} {
		t.Run(name, func(t *testing.T) {
			r, err := parseReport(zuulReport(tt.edit))
			if err != nil {
				t.Fatal(err)
			}
			builds, err := r.builds()
			if err != nil || len(builds) != tt.want {
				t.Fatalf("builds = %d builds, %v; want %d", len(builds), err, tt.want)
			}
			for _, b := range builds {
				if b.UUID == other {
					t.Errorf("a build after the first %d was read", maxReportBuilds)
				}
			}
		})
	}
}
