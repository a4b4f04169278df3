package service

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/webapp"
)

// TestWebappPortTaken: a port that is taken fails before any loop runs, as a
// config that cannot be used on this host, saying what to do.
func TestWebappPortTaken(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	cfg := &config.Config{Path: "nodepool.yaml", Builder: config.Builder{Webapp: &config.Webapp{ListenAddress: "127.0.0.1", Port: port}}}
	stop, err := serveWebapp(context.Background(), slog.New(slog.DiscardHandler), cfg, webapp.Options{})
	if err == nil {
		stop()
		t.Fatal("the status pages were served on a taken port")
	}
	if !errors.Is(err, config.ErrUnusable) || !strings.Contains(err.Error(), "set builder.webapp.port") ||
		!strings.Contains(err.Error(), "127.0.0.1:"+strconv.Itoa(port)) || strings.Contains(err.Error(), config.ErrUnusable.Error()) {
		t.Errorf("error %q; want config.ErrUnusable, unsaid, naming the address and builder.webapp.port", err)
	}
}
