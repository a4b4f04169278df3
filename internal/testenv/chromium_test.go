package testenv

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
)

func TestBrowserRendersAPage(t *testing.T) {
	b := NewBrowser(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, `<!doctype html><title>t</title><body style="background:#fff">`+
			`<script>document.body.insertAdjacentHTML("beforeend", "<p id=js>ran</p>")</script>`+
			`<table><tr><th>Image</th></tr><tr><td>debian-bookworm</td></tr></table>`)
	}))
	defer srv.Close()
	dom := b.DOM(t, srv.URL)
	for _, want := range []string{"<td>debian-bookworm</td>", `<p id="js">ran</p>`} {
		if !strings.Contains(dom, want) {
			t.Errorf("DOM lacks %s:\n%s", want, dom)
		}
	}
	img := b.Screenshot(t, srv.URL, filepath.Join(t.TempDir(), "page.png"), 400, 300)
	if r := img.Bounds(); r.Dx() != 400 || r.Dy() != 300 {
		t.Errorf("screenshot is %v, want 400x300", r)
	}
	if n := DarkPixels(img); n < 50 {
		t.Errorf("screenshot has %d dark pixels: the text was not drawn", n)
	}
}
