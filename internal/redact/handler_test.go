package redact

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"testing"
)

// TestHandler: whatever form a URL with a password takes in a log record, the
// line shows it without its userinfo, in text and JSON alike; what holds none is
// rendered as the handler under it renders it.
func TestHandler(t *testing.T) {
	const secret = "pa55-w0rd"
	u, _ := url.Parse("https://ci:" + secret + "@zuul.example.org/api")
	for _, format := range []string{"text", "json"} {
		t.Run(format, func(t *testing.T) {
			var buf bytes.Buffer
			var h slog.Handler = slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})
			if format == "json" {
				h = slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})
			}
			log := slog.New(Handler(h)).With("root", u.String()).WithGroup("g").With("pre", []string{"x", u.String()})
			log.Debug("polling "+u.String(),
				"url", u,
				"error", fmt.Errorf("get %s: %w", u, errors.New("refused")),
				"files", []string{"a", "http://a:" + secret + "@h/"},
				"struct", struct{ Where string }{u.String()},
				"grp", slog.GroupValue(slog.String("inner", u.String())),
				"valuer", valuer{u.String()},
				"count", 3,
				"plain", []string{"kept"},
			)
			out := buf.String()
			if strings.Contains(out, secret) || strings.Contains(out, "ci:") {
				t.Errorf("the password shows:\n%s", out)
			}
			for _, want := range []string{"zuul.example.org/api", "polling https://zuul.example.org/api", "refused", "kept", "3"} {
				if !strings.Contains(out, want) {
					t.Errorf("the line lacks %q:\n%s", want, out)
				}
			}
			if n := strings.Count(out, "https://zuul.example.org/api"); n != 8 {
				t.Errorf("the URL shows %d times without its userinfo, want 8:\n%s", n, out)
			}
		})
	}
}

type valuer struct{ s string }

func (v valuer) LogValue() slog.Value { return slog.StringValue(v.s) }
