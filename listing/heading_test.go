package listing

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/status"
)

// TestGearmanStatusHeading: the line over the gearman worker's status says
// that there is none yet, that the daemon no longer serves (with how old what
// follows is), or the daemon's pid and counts.
func TestGearmanStatusHeading(t *testing.T) {
	now := time.Now()
	fresh := &status.Gearman{Stamp: status.Stamp{Updated: now, PID: 42}, Serving: true, Functions: 3, Served: 7, Failed: 1}
	stopped := *fresh
	stopped.Serving = false
	stopped.Updated = now.Add(-2 * time.Hour)
	for _, c := range []struct {
		name string
		gs   *status.Gearman
		want string
	}{
		{"none", nil, "\nGearman: no status yet; the daemon writes it once it runs with gearman-servers.\n"},
		{"stopped", &stopped, "\nGearman: the daemon is not running; what it last said, 00:02:00:00 ago:\n"},
		{"serving", fresh, "\nGearman (daemon pid 42, 3 functions, 7 jobs served, 1 failed):\n"},
	} {
		var b bytes.Buffer
		WriteGearmanStatus(&b, c.gs, now)
		if !strings.HasPrefix(b.String(), c.want) {
			t.Errorf("%s: heading is not %q:\n%s", c.name, c.want, b.String())
		}
	}
}
