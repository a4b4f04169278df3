package poller

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/hostpattern"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/zuulapi"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

func hostPatterns(t *testing.T, hosts ...string) []hostpattern.Pattern {
	t.Helper()
	var out []hostpattern.Pattern
	for _, h := range hosts {
		p, err := hostpattern.Parse(h)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

// TestPollWaitsForAnArtifactHost: a Zuul build whose artifact is on a host
// the zuul-image does not allow is the operator's configuration, not a bad
// build: it is not fetched and not refused, nothing is recorded of it but
// the cursor saying what it waits for, the host gets no request, and the
// poll's error is due work not done. Once the host is allowed, the same build
// is fetched, and the cursor waits no more.
func TestPollWaitsForAnArtifactHost(t *testing.T) {
	f := newFixture(t, "qcow2")
	ctx := context.Background()
	data := f.image("qcow2", "1")
	objects := testenv.NewFileServer(t, data)
	zu, _ := url.Parse(f.zuul.URL())
	ou, _ := url.Parse(objects.URL)
	f.cfg.ZuulImages[0].ArtifactHosts = hostPatterns(t, zu.Host)
	zb := f.publish(zuultest.ArtifactSpec{Name: "qcow2", Data: data, Metadata: meta("qcow2"),
		Publish: func(string) string { return objects.URL + "/images/debian.qcow2" }})

	for range 2 {
		out, err := f.poll(ctx, "debian")
		var wait *WaitingForHost
		if !errors.As(err, &wait) || out.Ingested != nil {
			t.Fatalf("poll = %+v, %v; want nothing fetched, and a *WaitingForHost", out, err)
		}
		var nd interface{ NotDone() }
		if !errors.As(err, &nd) {
			t.Errorf("the wait is not due work left undone: %T", err)
		}
		for _, want := range []string{zb.UUID, ou.Host, "artifact-hosts", "add " + ou.Host} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("the wait does not say %q: %v", want, err)
			}
		}
		cur, _ := f.st.Cursor(ctx, "debian")
		if cur.Waiting != wait.Reason || cur.ZuulUUID != "" || cur.Outcome != "" {
			t.Errorf("cursor = %+v; want it to say what Zuul build %s waits for, and to settle nothing", cur, zb.UUID)
		}
		if builds, _ := f.st.Builds(ctx, store.BuildFilter{Image: "debian"}); len(builds) != 0 {
			t.Errorf("builds = %+v; want none recorded of a build that waits", builds)
		}
	}
	if n := objects.Requests(); n != 0 {
		t.Errorf("the host not allowed got %d requests", n)
	}

	f.cfg.ZuulImages[0].ArtifactHosts = hostPatterns(t, zu.Host, ou.Host)
	out, err := f.poll(ctx, "debian")
	if err != nil || out.Ingested == nil || out.Ingested.Zuul.UUID != zb.UUID || out.Ingested.State != store.Ready {
		t.Fatalf("poll once the host is allowed = %+v, %v; want Zuul build %s fetched", out, err, zb.UUID)
	}
	if cur, _ := f.st.Cursor(ctx, "debian"); cur.Waiting != "" || cur.ZuulUUID != zb.UUID || cur.Outcome != string(store.Ready) {
		t.Errorf("cursor once fetched = %+v; want it settled on %s, waiting for nothing", cur, zb.UUID)
	}
	if objects.Requests() == 0 {
		t.Error("the allowed host got no request")
	}
}

// TestPollRefusesAnUnfetchableURL: an artifact published at a URL no
// download can fetch (s3://, as newer Zuul launchers accept) is the build's
// to fix: it is refused once, saying the scheme and what the job should
// publish, and not tried again.
func TestPollRefusesAnUnfetchableURL(t *testing.T) {
	f := newFixture(t, "qcow2")
	ctx := context.Background()
	zb := f.publish(zuultest.ArtifactSpec{Name: "qcow2", Data: f.image("qcow2", "1"), Metadata: meta("qcow2"),
		Publish: func(string) string { return "s3://images/debian.qcow2" }})
	out, err := f.poll(ctx, "debian")
	if !errors.Is(err, ErrRefused) || out.Ingested != nil {
		t.Fatalf("poll = %+v, %v; want the build refused", out, err)
	}
	cur, _ := f.st.Cursor(ctx, "debian")
	if cur.ZuulUUID != zb.UUID || cur.Outcome != string(store.Failed) || !strings.Contains(cur.Reason, `unsupported URL scheme "s3"`) ||
		!strings.Contains(cur.Reason, "https URL") {
		t.Fatalf("cursor = %+v; want Zuul build %s refused, naming the scheme and what to publish", cur, zb.UUID)
	}
	out, err = f.poll(ctx, "debian")
	if err != nil || out.Ingested != nil {
		t.Fatalf("poll after the refusal = %+v, %v; want nothing", out, err)
	}
}

// TestPollProjectByCanonicalName: Zuul stores a project's builds under its
// short name and filters on it, so a zuul-image whose project is written by
// its canonical name is polled by the short name Zuul's project API gives,
// looked up once; the MQTT listener matches reports with the same name. A
// project Zuul does not know is asked for as written.
func TestPollProjectByCanonicalName(t *testing.T) {
	f := newFixture(t, "qcow2")
	ctx := context.Background()
	f.cfg.ZuulImages[0].Project = "review.example.com/org/images"
	zb := f.publishAt(0, time.Time{}, "1")
	f.pollIngests("a poll by the canonical name", zb)
	f.pollIngests("a newer build", f.publishAt(0, time.Time{}, "2"))
	for _, c := range f.zuul.BuildsCalls() {
		if got := c.Query.Get("project"); got != "org/images" {
			t.Errorf("a poll asked Zuul for project %q, want org/images", got)
		}
	}
	if got := f.p.Project(f.cfg.ZuulImages[0]); got != "org/images" {
		t.Errorf("Project = %q, want org/images, as the polls ask", got)
	}

	f.cfg.ZuulImages[0].Project = "git.example.org/org/images"
	out, err := f.poll(ctx, "debian")
	if err != nil || out.Ingested != nil {
		t.Fatalf("poll of a project Zuul does not know = %+v, %v; want nothing", out, err)
	}
	calls := f.zuul.BuildsCalls()
	if got := calls[len(calls)-1].Query.Get("project"); got != "git.example.org/org/images" {
		t.Errorf("the poll asked for project %q, want it as written", got)
	}
	if !strings.Contains(f.logs.String(), "knows no project of this name") {
		t.Errorf("no warning that Zuul knows no such project:\n%s", f.logs.String())
	}
	if _, err := f.poll(ctx, "debian"); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(f.logs.String(), "knows no project of this name"); n != 1 {
		t.Errorf("the unknown project was warned of %d times, want once", n)
	}
}

// TestPollChecksTheProjectAPI: the name Zuul's project API answers for a
// project written by its canonical name becomes the filter of the polls, so
// an answer of a wildcard, or of another project, fails the poll: the builds
// API is not asked and nothing is fetched, though the newest build, of
// another project, is what such a filter would take. Once the API answers the
// project asked, its build is fetched.
func TestPollChecksTheProjectAPI(t *testing.T) {
	f := newFixture(t, "qcow2")
	ctx := context.Background()
	f.cfg.ZuulImages[0].Project = "review.example.com/org/images"
	good := f.publish(zuultest.ArtifactSpec{Name: "qcow2", Data: f.image("qcow2", "good"), Metadata: meta("qcow2")})
	evil, err := f.zuul.AddBuild(zuultest.BuildSpec{Job: "build-debian", Project: "evil/other",
		Artifacts: []zuultest.ArtifactSpec{{Name: "qcow2", Data: f.image("qcow2", "evil"), Metadata: meta("qcow2")}}})
	if err != nil {
		t.Fatal(err)
	}
	for what, answer := range map[string]map[string]string{
		"a wildcard":             {"name": "*", "canonical_name": "review.example.com/*"},
		"another project":        {"name": "evil/other", "canonical_name": "review.example.com/evil/other"},
		"another canonical name": {"name": "evil/other", "canonical_name": "review.example.com/org/images"},
	} {
		f.zuul.SetProjectAnswer(answer)
		out, err := f.poll(ctx, "debian")
		if !errors.Is(err, zuulapi.ErrUnexpected) || out.Ingested != nil || !strings.Contains(err.Error(), "check api-url and project") {
			t.Errorf("%s: poll = %+v, %v; want it failed, saying to check project", what, out, err)
		}
	}
	if calls := f.zuul.BuildsCalls(); len(calls) != 0 {
		t.Errorf("the builds API was asked %d times, first for %q, with no project Zuul answered for", len(calls), calls[0].RawQuery)
	}
	if n := f.zuul.BytesServed(evil.Artifacts[0].Path); n != 0 {
		t.Errorf("%d bytes of a build of another project were fetched", n)
	}
	f.zuul.SetProjectAnswer(nil)
	f.pollIngests("the build of the project asked, once Zuul's project API answers it", good)
}
