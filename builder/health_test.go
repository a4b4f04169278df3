package builder

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestLoopsCheck(t *testing.T) {
	var l loops
	now := time.Now()
	if err := l.check(now); err == nil || !strings.Contains(err.Error(), "not running") {
		t.Fatalf("check before Run = %v, want not running", err)
	}
	l.running.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	plan := l.start("plan uploads", time.Minute)
	plan.begin()
	plan.end()
	if err := l.check(now.Add(time.Hour)); err != nil {
		t.Fatalf("a loop between passes: %v", err)
	}
	plan.begin()
	if err := l.check(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatalf("a pass within its bound: %v", err)
	}
	if err := l.check(time.Now().Add(2 * time.Minute)); err == nil || !strings.Contains(err.Error(), `"plan uploads" is stuck`) {
		t.Fatalf("a pass past its bound = %v", err)
	}
	plan.end()

	sweep := l.start("leak sweep", time.Minute)
	sweep.exit(ctx, false)
	if err := l.check(time.Now()); err == nil || !strings.Contains(err.Error(), `"leak sweep" stopped`) {
		t.Fatalf("a loop that exited while the daemon runs = %v", err)
	}

	// An image's loop ends when the image leaves the config; a loop started
	// again under its name is not forgotten with the old one.
	old := l.start("zuul image a", time.Minute)
	again := l.start("zuul image a", time.Minute)
	old.exit(ctx, true)
	again.begin()
	if err := l.check(time.Now().Add(2 * time.Minute)); err == nil || !strings.Contains(err.Error(), `"zuul image a" is stuck`) {
		t.Fatalf("the restarted loop's stuck pass = %v", err)
	}
	again.exit(ctx, true)

	cancel()
	l2 := loops{}
	l2.running.Store(true)
	l2.start("lifecycle", time.Minute).exit(ctx, false)
	if err := l2.check(time.Now()); err != nil {
		t.Fatalf("a loop that stopped with the daemon: %v", err)
	}
}
