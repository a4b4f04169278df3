package builder

import (
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// zuulImage is a config with one zuul-image polled every {{EVERY}} seconds
// from the stand-in Zuul at {{ZUUL}}; it needs raw, so every poll asks Zuul.
const zuulImage = `images-dir: %s
zuul-images:
  - name: zimg
    api-url: {{ZUUL}}
    tenant: example
    project: org/images
    job: build-zimg
    poll-interval: {{EVERY}}
    formats: [raw]
`

// TestReloadAppliesPollIntervalAtOnce: a zuul-image polled every hour whose
// poll-interval a reload lowers is polled again the new interval after its last
// poll, not at the end of the hour.
func TestReloadAppliesPollIntervalAtOnce(t *testing.T) {
	zuul := zuultest.NewServer(zuultest.ServerOptions{})
	t.Cleanup(zuul.Close)
	text := func(every string) string {
		return strings.NewReplacer("{{ZUUL}}", zuul.URL(), "{{EVERY}}", every).Replace(zuulImage)
	}
	r := newRig(t, text("3600"))
	polls := func() int { return len(zuul.BuildsCalls()) }
	r.run()
	waitFor(t, 10*time.Second, "the first poll", func() bool { return polls() == 1 })

	r.write(strings.Replace(text("0.2"), "%s", r.st.Dir(), 1))
	waitFor(t, 10*time.Second, "the reload", func() bool { return r.b.Config().ZuulImage("zimg").PollInterval == 200*time.Millisecond })
	waitFor(t, 10*time.Second, "a poll at the new interval", func() bool { return polls() >= 3 })

	// Raised again: the loop waits the new interval after its last poll.
	r.write(strings.Replace(text("3600"), "%s", r.st.Dir(), 1))
	waitFor(t, 10*time.Second, "the second reload", func() bool { return r.b.Config().ZuulImage("zimg").PollInterval == time.Hour })
	settled := polls()
	r.write(strings.Replace(text("3599"), "%s", r.st.Dir(), 1))
	waitFor(t, 10*time.Second, "the third reload", func() bool { return r.b.Config().ZuulImage("zimg").PollInterval == 3599*time.Second })
	if n := polls(); n > settled+1 {
		t.Errorf("%d polls after poll-interval went back to an hour, want at most the one under way", n-settled)
	}
}
