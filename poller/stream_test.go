package poller

import (
	"strings"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/internal/follow"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// countingStreamer counts the uploads asked to follow a download.
type countingStreamer struct{ asked int }

func (c *countingStreamer) Stream(store.Build, string, store.File, *follow.File) Streaming {
	c.asked++
	return nil
}

// TestStreamTakesOnlyDigests: the digests a Zuul build declares tag the cloud
// images before the download is checked against them, so an upload follows
// the download only when both are digests as they are written.
func TestStreamTakesOnlyDigests(t *testing.T) {
	sha, md := strings.Repeat("ab", 32), strings.Repeat("cd", 16)
	for _, tc := range []struct {
		name, sha256, md5 string
		want              int
	}{
		{"both", sha, md, 1},
		{"no md5", sha, "", 0},
		{"no sha256", "", md, 0},
		{"not hex", strings.Repeat("zz", 32), md, 0},
		{"too short", sha[:60], md, 0},
		{"a sha256 for an md5", sha, sha, 0},
		{"text around it", sha, md + "\x1b[2J", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &countingStreamer{}
			p := New(Options{Streamer: s})
			p.stream(store.Build{Image: "debian"}, store.File{Format: "raw", SHA256: tc.sha256, MD5: tc.md5})
			if s.asked != tc.want {
				t.Errorf("uploads asked to follow the download %d times, want %d", s.asked, tc.want)
			}
		})
	}
}
