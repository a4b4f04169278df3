package testenv

import (
	"strings"
	"testing"
	"time"
)

// WaitFor polls cond until it holds, failing the test when timeout passes
// first; the failure names what was awaited and adds what each of show
// returns (a daemon's log, the state seen). It polls every 5 ms at first, then
// less often, up to every 200 ms, so that a cond that is cheap is seen at once
// and one that is dear (a command run, a page fetched) is not run in a loop.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool, show ...func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	pause := 5 * time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			var b strings.Builder
			for _, s := range show {
				b.WriteString("\n")
				b.WriteString(s())
			}
			t.Fatalf("timed out after %s waiting for %s%s", timeout, what, b.String())
		}
		time.Sleep(pause)
		pause = min(2*pause, 200*time.Millisecond)
	}
}
