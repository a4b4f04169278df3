package testenv

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if err := StopSharedKeystone(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}

// TestGlanceBehindKeystone: a Glance behind the real Keystone takes a token of
// its users, and refuses no token and a revoked one.
func TestGlanceBehindKeystone(t *testing.T) {
	start := time.Now()
	ks := SharedKeystone(t)
	t.Logf("keystone answered after %s", time.Since(start))
	a := ks.NewAccount(t)
	g := NewGlanceBehind(t, ks)
	tok, err := ks.Login(t.Context(), PasswordAuth(a.User, a.Password, a.Project))
	if err != nil {
		t.Fatal(err)
	}
	if until := time.Until(tok.Expires); until < 50*time.Minute || until > time.Hour {
		t.Errorf("token expires in %s, want about an hour", until)
	}
	create := func(token string) int {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, g.Endpoint+"/v2/images",
			strings.NewReader(`{"name": "x", "disk_format": "raw", "container_format": "bare"}`))
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("X-Auth-Token", token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := create(tok.ID); code != http.StatusCreated {
		t.Errorf("create with a token: HTTP %d, want 201\nglance log:\n%s\nkeystone log:\n%s", code, logTail(g.LogFile), logTail(ks.LogFile))
	}
	if code := create(""); code != http.StatusUnauthorized {
		t.Errorf("create without a token: HTTP %d, want 401", code)
	}
	ks.Revoke(t, tok.ID)
	if code := create(tok.ID); code != http.StatusUnauthorized {
		t.Errorf("create with a revoked token: HTTP %d, want 401", code)
	}
}
