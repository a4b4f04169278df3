package testenv

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// Keystone is a stand-in Keystone v3: it answers POST /v3/auth/tokens with a fresh
// token and a catalog whose one image endpoint, in RegionOne, is the URL it was given,
// so password and application-credential clouds reach a standalone Glance.
type Keystone struct {
	// URL is the identity endpoint root (a clouds.yaml auth_url).
	URL string

	mu     sync.Mutex
	n      int
	bodies []string
	tokens []string
}

// NewKeystone starts a stand-in Keystone whose catalog names imageURL, and stops it
// when the test ends.
func NewKeystone(t testing.TB, imageURL string) *Keystone {
	ks := &Keystone{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v3/auth/tokens" {
			http.NotFound(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		var compact bytes.Buffer
		if err := json.Compact(&compact, body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		ks.mu.Lock()
		ks.n++
		token := fmt.Sprintf("token-%d", ks.n)
		ks.bodies = append(ks.bodies, compact.String())
		ks.tokens = append(ks.tokens, token)
		ks.mu.Unlock()
		w.Header().Set("X-Subject-Token", token)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"token": {"expires_at": "2099-01-01T00:00:00.000000Z", "issued_at": "2024-01-01T00:00:00.000000Z",
			"methods": ["password"], "user": {"id": "u1", "name": "nodepool", "domain": {"id": "default", "name": "Default"}},
			"project": {"id": "p1", "name": "ci", "domain": {"id": "default", "name": "Default"}},
			"catalog": [{"type": "image", "name": "glance", "id": "s1", "endpoints": [
				{"id": "e1", "interface": "public", "region": "RegionOne", "region_id": "RegionOne", "url": %q}]}]}}`, imageURL)
	}))
	t.Cleanup(srv.Close)
	ks.URL = srv.URL
	return ks
}

// Reset forgets the logins seen so far.
func (ks *Keystone) Reset() {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	ks.bodies, ks.tokens = nil, nil
}

// Logins counts the tokens issued since the last Reset.
func (ks *Keystone) Logins() int {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	return len(ks.tokens)
}

// LastToken is the token issued last; "" when none was.
func (ks *Keystone) LastToken() string {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	if len(ks.tokens) == 0 {
		return ""
	}
	return ks.tokens[len(ks.tokens)-1]
}

// LastBody is the last login request's body, compacted JSON; "" when none came.
func (ks *Keystone) LastBody() string {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	if len(ks.bodies) == 0 {
		return ""
	}
	return ks.bodies[len(ks.bodies)-1]
}
