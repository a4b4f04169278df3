package zuulmqtt

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

const buildUUID = "0123456789abcdef0123456789abcdef"

// zuulReport is a report as Zuul's MQTT reporter publishes it
// (zuul/driver/mqtt/mqttreporter.py), of the periodic-style post build of one
// job on a branch; edit changes it before it is encoded. Fields the listener
// does not read are there too, to be ignored.
func zuulReport(edit func(r map[string]any, build map[string]any)) []byte {
	// A branch has no number, patchset, commit id or owner: Zuul sends "".
	change := func() map[string]any {
		return map[string]any{
			"project":    "org/images",
			"branch":     "master",
			"change_url": "https://review.example.com/gitweb?p=org/images.git;a=commitdiff;h=abc",
			"change":     "",
			"patchset":   "",
			"commit_id":  "",
			"owner":      "",
			"ref":        "refs/heads/master",
		}
	}
	build := map[string]any{
		"job_name": "build-debian", "job_uuid": "3f2a9c1e5b7d4e6f8a0b1c2d3e4f5a6b", "voting": true,
		"change": change(), "uuid": buildUUID, "start_time": 1.7e9 + 0.25, "end_time": 1.7e9 + 600.5, "execute_time": 1.7e9 + 0.75,
		"log_url": "https://logs.example.com/x/", "web_url": "https://zuul.example.com/t/example/build/" + buildUUID,
		"result": "SUCCESS", "dependencies": []string{}, "job_dependencies": map[string]any{}, "artifacts": []any{
			map[string]any{"name": "raw image", "url": "https://evil.example.com/image.raw", "metadata": map[string]any{"type": "zuul_image", "format": "raw", "sha256": "00"}},
		},
		"events": []any{},
	}
	buildset := map[string]any{"uuid": "b5a1d0c3e8f24a7690b1c2d3e4f5a6b7", "result": "SUCCESS", "builds": []any{build}, "retry_builds": []any{}}
	item := change()
	r := map[string]any{
		"timestamp": 1.7e9 + 601.125, "action": "success", "tenant": "example",
		"zuul_ref": "Z" + buildset["uuid"].(string), "pipeline": "post", "changes": []any{change()},
		"project": item["project"], "branch": item["branch"], "change_url": item["change_url"], "change": item["change"],
		"patchset": item["patchset"], "commit_id": item["commit_id"], "owner": item["owner"], "ref": item["ref"],
		"message": "Build succeeded.", "trigger_time": 1.7e9 - 1.5, "enqueue_time": 1.7e9 - 1.25,
		"uuid": "0f1e2d3c4b5a69788796a5b4c3d2e1f0", "buildset": buildset, "zuul_event_id": "e0d1c2b3a4958677869584a3b2c1d0e0",
	}
	if edit != nil {
		edit(r, build)
	}
	data, err := json.Marshal(r)
	if err != nil {
		panic(err)
	}
	return data
}

// debianImage is the zuul-image zuulReport's build is of.
func debianImage() config.ZuulImage {
	return config.ZuulImage{Name: "debian", Tenant: "example", Project: "org/images", Branch: "master",
		Pipelines: []string{"periodic", "post"}, JobName: "build-debian"}
}

// matches tells whether any build of the report could be zi's.
func matches(t *testing.T, zi config.ZuulImage, payload []byte) bool {
	t.Helper()
	r, err := parseReport(payload)
	if err != nil {
		t.Fatalf("parseReport: %v", err)
	}
	if !r.finished() {
		return false
	}
	builds, err := r.builds()
	if err != nil {
		t.Fatalf("builds: %v", err)
	}
	for _, zb := range builds {
		if couldBe(&zi, r.Tenant, zb) {
			return true
		}
	}
	return false
}

func TestReportMatches(t *testing.T) {
	// An older Zuul: no change object in the build, the change at the top.
	older := func(change any) func(r, b map[string]any) {
		return func(r, b map[string]any) {
			delete(b, "change")
			delete(r, "changes")
			r["change"] = change
		}
	}
	tests := []struct {
		name  string
		image func(*config.ZuulImage)
		edit  func(r, b map[string]any)
		want  bool
	}{
		{"the image's build", nil, nil, true},
		{"another job", nil, func(r, b map[string]any) { b["job_name"] = "build-ubuntu" }, false},
		{"a failed build", nil, func(r, b map[string]any) { b["result"] = "FAILURE" }, false},
		{"a build with no result", nil, func(r, b map[string]any) { b["result"] = nil }, false},
		{"a job that did not run", nil, func(r, b map[string]any) { delete(b, "uuid"); delete(b, "result") }, false},
		{"a uuid that is not Zuul's", nil, func(r, b map[string]any) { b["uuid"] = "../../etc" }, false},
		{"another tenant", nil, func(r, b map[string]any) { r["tenant"] = "other" }, false},
		{"another pipeline", nil, func(r, b map[string]any) { r["pipeline"] = "check" }, false},
		{"another branch", nil, func(r, b map[string]any) { b["change"].(map[string]any)["branch"] = "stable" }, false},
		{"another project", nil, func(r, b map[string]any) { b["change"].(map[string]any)["project"] = "org/other" }, false},
		{"the build's change wins over the item's", nil, func(r, b map[string]any) { r["project"] = "org/other" }, true},
		// Zuul's reporters send a project's name, and so does its database
		// hold it: a canonical name matches neither.
		{"the canonical project name", func(zi *config.ZuulImage) { zi.Project = "review.example.com/org/images" }, nil, false},
		{"a branch pattern", func(zi *config.ZuulImage) { zi.Branch = "ma*" }, nil, true},
		{"any branch", func(zi *config.ZuulImage) { zi.Branch = "" }, func(r, b map[string]any) { b["change"].(map[string]any)["branch"] = "stable" }, true},
		{"any pipeline", func(zi *config.ZuulImage) { zi.Pipelines = nil }, func(r, b map[string]any) { r["pipeline"] = "gate" }, true},
		{"a white-label image takes any tenant", func(zi *config.ZuulImage) { zi.Tenant = "" }, func(r, b map[string]any) { r["tenant"] = "other" }, true},
		{"an unmerged change in check", func(zi *config.ZuulImage) { zi.Pipelines = nil }, func(r, b map[string]any) {
			r["pipeline"] = "check"
			b["change"].(map[string]any)["change"] = 12345
		}, false},
		{"an unmerged change, allowed", func(zi *config.ZuulImage) { zi.Pipelines, zi.AllowUnmergedChanges = nil, true }, func(r, b map[string]any) {
			r["pipeline"] = "check"
			b["change"].(map[string]any)["change"] = 12345
		}, true},
		{"change 0 is no change", nil, func(r, b map[string]any) { b["change"].(map[string]any)["change"] = "0" }, true},
		{"older Zuul, a branch", nil, older(""), true},
		{"older Zuul, null change", nil, older(nil), true},
		{"older Zuul, an unmerged change", nil, older(42), false},
		{"older Zuul, an unmerged change as text", nil, older("42"), false},
		{"a second build matches", nil, func(r, b map[string]any) {
			other := map[string]any{"job_name": "lint", "uuid": strings.Repeat("a", 32), "result": "FAILURE"}
			r["buildset"].(map[string]any)["builds"] = []any{other, b}
		}, true},
		{"a forged start report", nil, func(r, b map[string]any) { r["action"] = "start" }, false},
		{"an enqueue report", nil, func(r, b map[string]any) { r["action"] = "enqueue" }, false},
		{"a failed buildset with this build successful", nil, func(r, b map[string]any) {
			r["action"] = "failure"
			r["buildset"].(map[string]any)["result"] = "FAILURE"
		}, true},
		{"a dequeued item with this build successful", nil, func(r, b map[string]any) { r["action"] = "dequeue" }, true},

		// A job's success-message and failure-message stand in for its
		// build's result (formatJobResult in zuul/model.py).
		{"a success-message in a success report", nil, func(r, b map[string]any) { b["result"] = "Image built." }, true},
		{"a success-message in the report of a disabled pipeline's success", nil, func(r, b map[string]any) {
			r["action"] = "disabled"
			b["result"] = "Image built."
		}, true},
		{"a success-message of another job", nil, func(r, b map[string]any) {
			b["job_name"], b["result"] = "build-ubuntu", "Image built."
		}, false},
		{"a failure-message in a failure report", nil, func(r, b map[string]any) {
			r["action"], r["buildset"].(map[string]any)["result"] = "failure", "FAILURE"
			b["result"] = "Image build broke, see the log."
		}, false},
		{"a failure-message in a disabled pipeline's failure report", nil, func(r, b map[string]any) {
			r["action"], r["buildset"].(map[string]any)["result"] = "disabled", "FAILURE"
			b["result"] = "Image build broke, see the log."
		}, false},
		{"a dequeued item's build with a message", nil, func(r, b map[string]any) {
			r["action"], r["buildset"].(map[string]any)["result"] = "dequeue", "DEQUEUED"
			b["result"] = "Image built."
		}, false},
		{"a non-voting job's FAILURE in a success report", nil, func(r, b map[string]any) {
			b["voting"], b["result"] = false, "FAILURE"
		}, false},
		{"a skipped build in a success report", nil, func(r, b map[string]any) { b["result"] = "SKIPPED" }, false},
		{"a message in a start report", nil, func(r, b map[string]any) {
			r["action"], r["buildset"].(map[string]any)["result"] = "start", nil
			b["result"] = "Image built."
		}, false},

		// Zuul's names are case-sensitive: a report of a name in other case
		// is of another branch, job, project or pipeline, which a poll
		// would not take, though MySQL answers it.
		{"the project in other case", nil, func(r, b map[string]any) { b["change"].(map[string]any)["project"] = "Org/Images" }, false},
		{"the job in other case", nil, func(r, b map[string]any) { b["job_name"] = "Build-Debian" }, false},
		{"the pipeline in other case", nil, func(r, b map[string]any) { r["pipeline"] = "Post" }, false},
		{"the branch in other case", nil, func(r, b map[string]any) { b["change"].(map[string]any)["branch"] = "MASTER" }, false},
		{"the tenant in other case", nil, func(r, b map[string]any) { r["tenant"] = "Example" }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			zi := debianImage()
			if tt.image != nil {
				tt.image(&zi)
			}
			if got := matches(t, zi, zuulReport(tt.edit)); got != tt.want {
				t.Errorf("matches = %t, want %t", got, tt.want)
			}
		})
	}
}

func TestReportMalformed(t *testing.T) {
	tests := map[string][]byte{
		"not JSON":                  []byte("{not json"),
		"empty":                     nil,
		"a list":                    []byte(`[{"action": "success"}]`),
		"a string":                  []byte(`"success"`),
		"trailing garbage":          append(zuulReport(nil), "x"...),
		"no action":                 zuulReport(func(r, b map[string]any) { delete(r, "action") }),
		"no tenant":                 zuulReport(func(r, b map[string]any) { r["tenant"] = "" }),
		"no pipeline":               zuulReport(func(r, b map[string]any) { delete(r, "pipeline") }),
		"a tenant that is a number": zuulReport(func(r, b map[string]any) { r["tenant"] = 7 }),
		"builds not a list":         zuulReport(func(r, b map[string]any) { r["buildset"] = map[string]any{"builds": "x"} }),
		"a change that is a list":   zuulReport(func(r, b map[string]any) { r["change"] = []int{1} }),
	}
	for name, payload := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := parseReport(payload); !errors.Is(err, errMalformed) {
				t.Errorf("parseReport = %v, want errMalformed", err)
			}
		})
	}
	// A build's change that is no change object is found when the builds are read.
	r, err := parseReport(zuulReport(func(r, b map[string]any) { b["change"] = map[string]any{"change": []int{1}} }))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.builds(); !errors.Is(err, errMalformed) {
		t.Errorf("builds = %v, want errMalformed", err)
	}
}

// TestStandInZuulReports: the reports the stand-in Zuul publishes for the
// tests of the daemon are read as this package reads Zuul's: its report of a
// successful post or periodic build of the job is a zuul-image's, with its
// result or its job's success-message; of a check build of a change, a failed
// build, with its result or a failure-message, or a build that runs not.
func TestStandInZuulReports(t *testing.T) {
	s := zuultest.NewServer(zuultest.ServerOptions{})
	defer s.Close()
	zi := debianImage()
	for _, c := range []struct {
		spec zuultest.BuildSpec
		want bool
	}{
		{zuultest.BuildSpec{Job: "build-debian", Pipeline: "post"}, true},
		{zuultest.BuildSpec{Job: "build-debian", Pipeline: "periodic"}, true},
		{zuultest.BuildSpec{Job: "build-debian", Pipeline: "post", SuccessMessage: "Image built."}, true},
		{zuultest.BuildSpec{Job: "build-debian", Pipeline: "post", Result: "FAILURE"}, false},
		{zuultest.BuildSpec{Job: "build-debian", Pipeline: "post", Result: "FAILURE", SuccessMessage: "Image built.",
			FailureMessage: "No image."}, false},
		{zuultest.BuildSpec{Job: "build-debian", Pipeline: "post", InProgress: true}, false},
		{zuultest.BuildSpec{Job: "build-debian", Pipeline: "check", Change: 123, Patchset: "1"}, false},
		{zuultest.BuildSpec{Job: "build-ubuntu", Pipeline: "post"}, false},
	} {
		b, err := s.AddBuild(c.spec)
		if err != nil {
			t.Fatal(err)
		}
		_, payload, err := s.MQTTReport(b.UUID)
		if err != nil {
			t.Fatal(err)
		}
		if got := matches(t, zi, payload); got != c.want {
			t.Errorf("the stand-in's report of %+v: a build of %s %v, want %v", c.spec, zi.Name, got, c.want)
		}
	}
	check := debianImage()
	check.Pipelines, check.AllowUnmergedChanges = nil, true
	b, _ := s.AddBuild(zuultest.BuildSpec{Job: "build-debian", Pipeline: "check", Change: 124, Patchset: "1"})
	if _, payload, _ := s.MQTTReport(b.UUID); !matches(t, check, payload) {
		t.Error("a check build of a change is not taken by a zuul-image with allow-unmerged-changes")
	}
}
