package store

import (
	"path/filepath"
	"testing"
)

// TestTempPathOfZuulBuild: a Zuul build's temporary files are named after
// its uuid, which the partial sweep knows only when it is hex; any other
// uuid names no file.
func TestTempPathOfZuulBuild(t *testing.T) {
	s := &Store{dir: t.TempDir()}
	b := Build{Image: "debian", ID: "0123456789abcdef0123456789abcdef", Zuul: ZuulRef{UUID: "5f3e9a0c1b2d4e6f8a7b9c0d1e2f3a4b"}}
	p, err := s.tempPath(b, "qcow2")
	if want := filepath.Join(s.partialDir(), "debian-zuul-5f3e9a0c1b2d4e6f8a7b9c0d1e2f3a4b.qcow2"); err != nil || p != want {
		t.Fatalf("tempPath = %q, %v; want %q", p, err, want)
	}
	for _, uuid := range []string{"5f3e.9a0c", "..", "5f3e/9a0c", "zzzz"} {
		b.Zuul.UUID = uuid
		if p, err := s.tempPath(b, "qcow2"); err == nil {
			t.Errorf("uuid %q: tempPath = %q; want an error", uuid, p)
		}
	}
}
