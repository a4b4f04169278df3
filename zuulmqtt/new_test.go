package zuulmqtt

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
)

func noHint(string) {}

func images() []config.ZuulImage { return nil }

// TestNewChecksFiles: New reads the files the settings name, so that a
// problem shows before the daemon runs, and says which file and what to do.
func TestNewChecksFiles(t *testing.T) {
	m := testenv.NewMosquitto(t, testenv.MosquittoOptions{TLS: true, ClientCert: true})
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := brokerConfig(m)
	tests := []struct {
		name string
		edit func(c *config.ZuulMQTT)
		want string
	}{
		{"no ca-cert file", func(c *config.ZuulMQTT) { c.CACert = filepath.Join(dir, "nope.pem") }, "read ca-cert: open " + dir},
		{"a ca-cert without a certificate", func(c *config.ZuulMQTT) { c.CACert = write("junk.pem", "junk") }, "holds no PEM certificate"},
		{"a client key of another certificate", func(c *config.ZuulMQTT) { c.ClientKey = write("other-key.pem", mustRead(t, m.ClientCert)) }, "load client-cert"},
		{"no password file", func(c *config.ZuulMQTT) { c.PasswordFile = filepath.Join(dir, "nope.pw") }, "read password-file: open " + dir},
		{"an empty password file", func(c *config.ZuulMQTT) { c.PasswordFile = write("empty.pw", "\n") }, "is empty; write the password into it"},
		{"a password file too large", func(c *config.ZuulMQTT) { c.PasswordFile = write("big.pw", strings.Repeat("x", 70<<10)) }, "should hold the password alone"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := good
			tt.edit(&cfg)
			_, err := New(cfg, Options{Images: images, Hint: noHint})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New = %v, want an error containing %q", err, tt.want)
			}
			if err != nil && strings.Contains(err.Error(), m.Password) {
				t.Errorf("the error shows the password: %v", err)
			}
		})
	}
	if _, err := New(good, Options{Images: images, Hint: noHint}); err != nil {
		t.Errorf("New with the broker's files: %v", err)
	}
	if _, err := New(good, Options{Hint: noHint}); err == nil {
		t.Errorf("New without Images succeeded")
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func TestPasswordFileNewline(t *testing.T) {
	dir := t.TempDir()
	for text, want := range map[string]string{"s3cret\n": "s3cret", "s3cret": "s3cret", "s3cret\r\n": "s3cret", "two words \n\n": "two words \n", " s3cret": " s3cret"} {
		p := filepath.Join(dir, "pw")
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		if got, err := readPassword(p); err != nil || got != want {
			t.Errorf("password file %q read as %q, %v; want %q", text, got, err, want)
		}
	}
}

func TestWarnings(t *testing.T) {
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	plain := config.ZuulMQTT{URL: "mqtt://m.example.com:1883", Host: "m.example.com", Port: 1883, Username: "u", PasswordFile: pw}
	l, err := New(plain, Options{Images: images, Hint: noHint})
	if err != nil {
		t.Fatal(err)
	}
	if w := l.Warnings(); len(w) != 1 || !strings.Contains(w[0], "sent over plain mqtt://") || !strings.Contains(w[0], "use an mqtts:// url") {
		t.Errorf("warnings %q, want one about the password over plain mqtt://", w)
	}
	secure := plain
	secure.URL, secure.TLS = "mqtts://m.example.com:8883", true
	if l, err := New(secure, Options{Images: images, Hint: noHint}); err != nil || len(l.Warnings()) != 0 {
		t.Errorf("mqtts:// gives warnings %v, %v; want none", l.Warnings(), err)
	}
}

func TestRunTwice(t *testing.T) {
	l, err := New(config.ZuulMQTT{URL: "mqtt://127.0.0.1:1", Host: "127.0.0.1", Port: 1}, Options{Images: images, Hint: noHint})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	testenv.WaitFor(t, 5*time.Second, "a failed connect", func() bool { return l.State().LastError != "" })
	if err := l.Run(ctx); err == nil || !strings.Contains(err.Error(), "while running") {
		t.Errorf("a second Run = %v, want an error", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}
