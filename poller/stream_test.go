package poller

import (
	"strings"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/artifacts"
	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/follow"
	"github.com/nodepool-builder/nodepool-builder/internal/hostpattern"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// countingStreamer counts the uploads asked to follow a download, and keeps
// the artifact it was last given.
type countingStreamer struct {
	asked    int
	artifact Artifact
}

func (c *countingStreamer) Stream(_ store.Build, a Artifact, src *follow.File) (Streaming, bool) {
	if src != nil {
		c.asked++
	}
	c.artifact = a
	return nil, true
}

// TestStreamTakesOnlyDigests: the digests a Zuul build declares tag the cloud
// images before the download is checked against them, so an upload follows
// the download only when both are digests as they are written; nor does a
// cloud fetch the artifact itself, which is checked against them.
func TestStreamTakesOnlyDigests(t *testing.T) {
	sha, md := strings.Repeat("ab", 32), strings.Repeat("cd", 16)
	zi := &config.ZuulImage{Name: "debian", APIURL: "https://zuul.example.org/"}
	c := artifacts.Candidate{URL: "https://zuul.example.org/logs/debian.raw"}
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
			p.stream(zi, store.Build{Image: "debian"}, c, store.File{Format: "raw", SHA256: tc.sha256, MD5: tc.md5})
			if s.asked != tc.want {
				t.Errorf("uploads asked to follow the download %d times, want %d", s.asked, tc.want)
			}
			if web := s.artifact.URL != ""; web != (tc.want == 1) {
				t.Errorf("the cloud may fetch the artifact itself: %v (%q), want %v", web, s.artifact.NotWeb, tc.want == 1)
			}
			if s.artifact.URL == "" && s.artifact.NotWeb == "" {
				t.Error("no URL for the cloud, and no reason why")
			}
		})
	}
}

// TestWebURL: a cloud fetches an artifact itself only when it is the image
// as it is, at a URL with no secret in it, on a host the operator named.
func TestWebURL(t *testing.T) {
	swift, err := hostpattern.Parse("swift.example.org")
	if err != nil {
		t.Fatal(err)
	}
	named := &config.ZuulImage{Name: "debian", APIURL: "https://zuul.example.org/",
		ArtifactHosts: []hostpattern.Pattern{swift}}
	byAPI := &config.ZuulImage{Name: "debian", APIURL: "https://zuul.example.org/"}
	for _, tc := range []struct {
		name string
		zi   *config.ZuulImage
		url  string
		why  string // "" when the URL is handed on
	}{
		{"named host", named, "https://swift.example.org/c/debian.qcow2", ""},
		{"api-url's host", byAPI, "https://zuul.example.org/logs/debian.qcow2", ""},
		{"zstd", named, "https://swift.example.org/c/debian.raw.zst", "served compressed (zst)"},
		{"gzip", named, "https://swift.example.org/c/debian.qcow2.gz", "served compressed (gz)"},
		{"a signed URL", named, "https://swift.example.org/c/debian.qcow2?temp_url_sig=abc", "holds credentials"},
		{"userinfo", named, "https://user:pw@swift.example.org/c/debian.qcow2", "holds credentials"},
		{"a host not named", named, "https://logs.example.org/c/debian.qcow2", "not named in the zuul-image's artifact-hosts"},
		{"log_url's host only", byAPI, "https://logs.example.org/c/debian.qcow2", "not named"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why := webURL(tc.zi, artifacts.Candidate{URL: tc.url})
			switch {
			case tc.why == "" && (got != tc.url || why != ""):
				t.Errorf("webURL = %q, %q; want the URL as it is", got, why)
			case tc.why != "" && (got != "" || !strings.Contains(why, tc.why)):
				t.Errorf("webURL = %q, %q; want no URL, and a reason with %q", got, why, tc.why)
			}
			if strings.Contains(why, "pw") || strings.Contains(why, "abc") {
				t.Errorf("the reason shows a secret: %q", why)
			}
		})
	}
}
