package builder

import (
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDownloadClientTrustsCACert(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("image")) }))
	defer srv.Close()
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644)

	plain, err := downloadClient("")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Get(srv.URL); err == nil {
		t.Fatal("a client without the ca-cert trusted the test server")
	}
	trusting, err := downloadClient(ca)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := trusting.Get(srv.URL)
	if err != nil {
		t.Fatalf("a client with the ca-cert: %v", err)
	}
	resp.Body.Close()

	bad := filepath.Join(dir, "bad.pem")
	os.WriteFile(bad, []byte("not a certificate"), 0o644)
	if _, err := downloadClient(bad); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Fatalf("bad ca-cert: %v", err)
	}
	if _, err := downloadClient(filepath.Join(dir, "missing.pem")); err == nil {
		t.Fatal("missing ca-cert accepted")
	}
}
