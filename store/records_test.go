package store

import (
	"strings"
	"testing"
	"time"
)

func TestNewestReady(t *testing.T) {
	at := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	b := func(id, image string, st State, minutes int) Build {
		return Build{ID: id, Image: image, State: st, StateTime: at.Add(time.Duration(minutes) * time.Minute)}
	}
	for _, c := range []struct {
		name   string
		builds []Build // as listed: newest created first
		want   string
	}{
		{"none", nil, ""},
		{"no ready build", []Build{b("1", "debian", Failed, 9), b("2", "debian", Building, 10)}, ""},
		{"another image's", []Build{b("1", "fedora", Ready, 9)}, ""},
		{"the only ready one", []Build{b("1", "debian", Failed, 9), b("2", "debian", Ready, 1)}, "2"},
		// Created later, ready earlier (another builder's, or imported): the
		// one that became ready last is the newest, as nodepool ranks them.
		{"by state time, not list order", []Build{b("1", "debian", Ready, 1), b("2", "debian", Ready, 5)}, "2"},
		{"a tie keeps list order", []Build{b("1", "debian", Ready, 5), b("2", "debian", Ready, 5)}, "1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := NewestReady(c.builds, "debian")
			switch {
			case c.want == "" && got != nil:
				t.Fatalf("NewestReady = %s, want none", got.ID)
			case c.want != "" && (got == nil || got.ID != c.want):
				t.Fatalf("NewestReady = %v, want %s", got, c.want)
			}
		})
	}
}

func TestPausedBy(t *testing.T) {
	paused := map[string]time.Time{"debian": time.Now()}
	for _, c := range []struct {
		image    string
		inConfig bool
		want     string
	}{
		{"fedora", false, ""},
		{"fedora", true, PausedByConfig},
		{"debian", false, PausedByCommand},
		{"debian", true, PausedByConfig + "," + PausedByCommand},
	} {
		if got := strings.Join(PausedBy(paused, c.image, c.inConfig), ","); got != c.want {
			t.Errorf("PausedBy(%s, in config %v) = %q, want %q", c.image, c.inConfig, got, c.want)
		}
	}
}
