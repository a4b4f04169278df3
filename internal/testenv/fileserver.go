package testenv

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// FileServer serves one content at every path, as a host that is not Zuul's
// would (an object store, a service only this host reaches), and counts the
// requests it gets. It stops when the test ends.
type FileServer struct {
	*httptest.Server
	requests atomic.Int64
}

// NewFileServer starts a FileServer of data on a loopback port.
func NewFileServer(t testing.TB, data []byte) *FileServer {
	s := &FileServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.requests.Add(1)
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(data))
	}))
	t.Cleanup(s.Close)
	return s
}

// Requests is how many requests the server got.
func (s *FileServer) Requests() int64 { return s.requests.Load() }
