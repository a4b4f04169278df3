package main

import (
	"os"
	"strings"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// TestOnceTakesOnlyBuildsAskedFor: a hostile Zuul answers, whatever it is asked,
// a failed, retried check build of another project and job, on another branch.
// --once fetches nothing of it, and once the build asked for is there, behind a
// newer such answer, it takes that one.
func TestOnceTakesOnlyBuildsAskedFor(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example", IgnoreFilters: true})
	e.oneProvider("qcow2", "    pipelines: [periodic, post]\n    branch: master\n", "")
	hostile := zuultest.BuildSpec{Project: "org/evil", Job: "build-evil", Result: "FAILURE", NonFinal: true,
		Pipeline: "check", Branch: "feature"}
	first := e.addBuild(e.makeImage(1), hostile)
	r := e.once(0)
	if !strings.Contains(r.stderr, "skipping a build Zuul answered") || !strings.Contains(r.stderr, first.UUID) {
		t.Errorf("--once does not say it skipped %s:\n%s", first.UUID, r.stderr)
	}
	if bs := e.buildsJSON(); len(bs) != 0 {
		t.Fatalf("a build Zuul was not asked for was taken: %+v", bs)
	}

	asked := e.addBuild(e.makeImage(2), zuultest.BuildSpec{Pipeline: "post"})
	second := e.addBuild(e.makeImage(3), hostile)
	e.once(0)
	b, ok := e.zuulBuildOf(asked.UUID)
	if !ok || b.State != "ready" {
		t.Fatalf("the build asked for, behind a hostile answer, was not taken: %+v", e.buildsJSON())
	}
	e.checkUploaded("cloud-x", b, "qcow2")
	for _, zb := range []zuultest.Build{first, second} {
		if n := e.zuul.BytesServed(e.artifact(zb, "debian qcow2").Path); n != 0 {
			t.Errorf("%d bytes of %s, a build not asked for, were fetched", n, zb.UUID)
		}
		if _, ok := e.zuulBuildOf(zb.UUID); ok {
			t.Errorf("%s, a build not asked for, is in the store", zb.UUID)
		}
	}
	if imgs := e.images("cloud-x"); len(imgs) != 1 {
		t.Errorf("cloud-x holds %d images, want the one of the build asked for", len(imgs))
	}
}

// TestOnceUUIDWithControlCharacters: a build whose uuid would clear the screen
// and forge a line is skipped; the --once summary (of the build behind it,
// refused for lack of a format) and image-status show no raw control
// character and no line of its making.
func TestOnceUUIDWithControlCharacters(t *testing.T) {
	const forged = "FORGED level=INFO msg=ready"
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	e.oneProvider("qcow2", "", "")
	logsOnly := []zuultest.ArtifactSpec{{Name: "logs", Data: []byte("no image here"), Metadata: map[string]any{"type": "logs"}}}
	behind := e.addBuild(image{}, zuultest.BuildSpec{Artifacts: logsOnly})
	hostile := e.addBuild(image{}, zuultest.BuildSpec{UUID: "0123456789abcdef0123456789abcdef\x1b[2J\n" + forged, Artifacts: logsOnly})

	r := e.once(exitFailed)
	summary := r.stderr[strings.LastIndex(r.stderr, "nodepool-builder: "):]
	if !strings.Contains(summary, "fetch Zuul build "+behind.UUID+" of debian") {
		t.Errorf("the summary does not name the refused build %s:\n%s", behind.UUID, summary)
	}
	if !strings.Contains(r.stderr, `0123456789abcdef0123456789abcdef\x1b[2J\nFORGED`) {
		t.Errorf("the log does not name the skipped build, escaped:\n%s", r.stderr)
	}
	status := e.run("image-status")
	if status.code != 0 || !strings.Contains(status.stdout, behind.UUID+" (failed)") {
		t.Errorf("image-status: exit %d, does not show %s failed:\n%s%s", status.code, behind.UUID, status.stdout, status.stderr)
	}
	list := e.run("dib-image-list")
	for what, out := range map[string]string{"--once": r.stderr, "image-status": status.stdout, "dib-image-list": list.stdout} {
		if strings.ContainsRune(out, '\x1b') {
			t.Errorf("%s prints a raw escape:\n%q", what, out)
		}
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, forged) {
				t.Errorf("%s prints a line of the uuid's making: %q", what, line)
			}
		}
	}
	if _, ok := e.zuulBuildOf(hostile.UUID); ok {
		t.Errorf("the build with a hostile uuid is in the store")
	}
}

// TestOnceTakesNamesWithTheirCase: the zuul-image asks for branch master.
// Zuul's database, on MySQL, answers it builds of branch MASTER (another
// branch, which whoever may push can make), of job Build-Debian and of
// project Org/Images, newer than the build asked for. --once fetches none of
// them, says that only case differs, and uploads the build asked for.
func TestOnceTakesNamesWithTheirCase(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	e.oneProvider("qcow2", "    branch: master\n", "")
	asked := e.addBuild(e.makeImage(1), zuultest.BuildSpec{Branch: "master"})
	others := []zuultest.Build{
		e.addBuild(e.makeImage(2), zuultest.BuildSpec{Branch: "MASTER"}),
		e.addBuild(e.makeImage(3), zuultest.BuildSpec{Job: "Build-Debian"}),
		e.addBuild(e.makeImage(4), zuultest.BuildSpec{Project: "Org/Images"}),
	}
	r := e.once(0)
	for _, says := range []string{`branch \"MASTER\" is not \"master\" (only case differs`, `job \"Build-Debian\" is not \"build-debian\" (only case differs`,
		`project \"Org/Images\" is not \"org/images\" (only case differs`} {
		if !strings.Contains(r.stderr, says) {
			t.Errorf("--once does not say %s:\n%s", says, r.stderr)
		}
	}
	b, ok := e.zuulBuildOf(asked.UUID)
	if !ok || b.State != "ready" {
		t.Fatalf("the build asked for, behind builds of names in other case, was not taken: %+v", e.buildsJSON())
	}
	e.checkUploaded("cloud-x", b, "qcow2")
	for _, zb := range others {
		if n := e.zuul.BytesServed(e.artifact(zb, "debian qcow2").Path); n != 0 {
			t.Errorf("%d bytes of %s, a build of a name in other case, were fetched", n, zb.UUID)
		}
		if _, ok := e.zuulBuildOf(zb.UUID); ok {
			t.Errorf("%s, a build of a name in other case, is in the store", zb.UUID)
		}
	}
	if imgs := e.images("cloud-x"); len(imgs) != 1 {
		t.Errorf("cloud-x holds %d images, want the one of the build asked for", len(imgs))
	}
}

// TestOnceChecksTheProjectAPI: a zuul-image's project is written by its
// canonical name, and Zuul's project API answers a wildcard for it. --once
// fails saying to check project, asks the builds API nothing and fetches
// nothing, though the newest build, of another project, is what the wildcard
// would take.
func TestOnceChecksTheProjectAPI(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example", ProjectAnswer: map[string]string{"name": "*"}})
	e.oneProvider("qcow2", "", "")
	cfg, err := os.ReadFile(e.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	e.writeYAML(strings.Replace(string(cfg), "project: org/images", "project: review.example.com/org/images", 1))
	e.addBuild(e.makeImage(1), zuultest.BuildSpec{})
	evil := e.addBuild(e.makeImage(2), zuultest.BuildSpec{Project: "evil/other"})
	r := e.once(exitFailed)
	if !strings.Contains(r.stderr, `answered name "*"`) || !strings.Contains(r.stderr, "check api-url and project") {
		t.Errorf("--once does not say Zuul's project API answered a wildcard:\n%s", r.stderr)
	}
	if calls := e.zuul.BuildsCalls(); len(calls) != 0 {
		t.Errorf("the builds API was asked for %q", calls[0].RawQuery)
	}
	if n := e.zuul.BytesServed(e.artifact(evil, "debian qcow2").Path); n != 0 || len(e.buildsJSON()) != 0 {
		t.Errorf("%d bytes of a build of another project were fetched; builds: %+v", n, e.buildsJSON())
	}
}
