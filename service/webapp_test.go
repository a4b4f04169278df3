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
// config that cannot be used on this host, saying what to do in the file
// that holds builder.webapp: nodepool-builder.yaml, or nodepool.yaml when the
// config is one file.
func TestWebappPortTaken(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	for _, tt := range []struct {
		name, builderPath, want string
	}{
		{"two files", "/etc/nodepool/nodepool-builder.yaml", "/etc/nodepool/nodepool-builder.yaml"},
		{"one file", "", "/etc/nodepool/nodepool.yaml"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := &config.Config{Path: "/etc/nodepool/nodepool.yaml", BuilderPath: tt.builderPath,
				Builder: config.Builder{Webapp: &config.Webapp{ListenAddress: "127.0.0.1", Port: port}}}
			stop, err := serveWebapp(context.Background(), slog.New(slog.DiscardHandler), cfg, webapp.Options{})
			if err == nil {
				stop()
				t.Fatal("the status pages were served on a taken port")
			}
			if !errors.Is(err, config.ErrUnusable) || !strings.Contains(err.Error(), "set builder.webapp.port") ||
				!strings.Contains(err.Error(), "127.0.0.1:"+strconv.Itoa(port)) || strings.Contains(err.Error(), config.ErrUnusable.Error()) {
				t.Errorf("error %q; want config.ErrUnusable, unsaid, naming the address and builder.webapp.port", err)
			}
			if !strings.Contains(err.Error(), " in "+tt.want+" ") {
				t.Errorf("error %q; want it to name %s, which holds builder.webapp", err, tt.want)
			}
		})
	}
}
