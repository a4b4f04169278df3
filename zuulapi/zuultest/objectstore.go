package zuultest

import (
	"errors"
	"fmt"
	"net"
	"net/http"
)

// objectStore is the second host of a Server: the Swift endpoint or S3
// bucket host that zuul-jobs' upload-image-swift and upload-image-s3 roles
// put a build's images on, away from both the API and the log server.
type objectStore struct {
	url  string
	srv  *http.Server
	done chan struct{}
}

// defaultObjectStoreAddr is another loopback address than the API's: Linux
// answers on all of 127.0.0.0/8 without setup.
const defaultObjectStoreAddr = "127.0.0.2:0"

// ObjectStoreURL is the root of the server's object store, without a trailing
// slash: http://127.0.0.2:PORT unless ServerOptions.ObjectStoreAddr says
// otherwise. The object store starts when first needed: with
// ServerOptions.ObjectStore, an artifact OnObjectStore, or this call. Like
// NewServer, it panics when it cannot listen.
func (s *Server) ObjectStoreURL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.objectStoreLocked().url
}

// objectStoreLocked returns the object store, started if need be; s.mu is held.
func (s *Server) objectStoreLocked() *objectStore {
	if s.store != nil {
		return s.store
	}
	addr := s.opts.ObjectStoreAddr
	if addr == "" {
		addr = defaultObjectStoreAddr
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		panic(fmt.Sprintf("zuultest: object store: listen on %s: %v (another loopback address than 127.0.0.1 may need setting up on this system; set ObjectStoreAddr)", addr, err))
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /", func(w http.ResponseWriter, r *http.Request) { s.serveFile(w, r, true) })
	st := &objectStore{url: "http://" + ln.Addr().String(), srv: s.httpServer(mux), done: make(chan struct{})}
	go func() {
		defer close(st.done)
		if err := st.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			panic(fmt.Sprintf("zuultest: object store: serve: %v", err))
		}
	}()
	s.store = st
	return st
}

func (st *objectStore) close() {
	_ = st.srv.Close()
	<-st.done
}
