package zookeeper

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"net"
	"strings"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
)

// TestResolveServers: every address of every server is dialed, each known by
// the host it was configured as, so that a host of several addresses, an
// address literal (IPv6 too) and a host that does not resolve beside others
// work; with no host resolving, the error names them.
func TestResolveServers(t *testing.T) {
	dns := map[string][]string{
		"zk.example.org":   {"192.0.2.1", "2001:db8::1"},
		"zk01.example.org": {"192.0.2.1"}, // the same address as zk.example.org's first
		"zk02.example.org": {"192.0.2.2"},
	}
	lookup := func(_ context.Context, host string) ([]string, error) {
		if a, ok := dns[host]; ok {
			return a, nil
		}
		if net.ParseIP(host) != nil {
			return []string{host}, nil // an address resolves to itself
		}
		return nil, errors.New("lookup " + host + ": no such host")
	}
	var logs testenv.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	s, err := resolveServers(t.Context(), []string{"zk.example.org:2281", "zk01.example.org:2281", "gone.example.org:2281",
		"[::1]:2281", "10.0.0.7:2181", "zk02.example.org:2281"}, lookup, log)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Init([]string{"what the client passes is resolved already"}); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"192.0.2.1:2281":     "zk.example.org",
		"[2001:db8::1]:2281": "zk.example.org",
		"[::1]:2281":         "::1",
		"10.0.0.7:2181":      "10.0.0.7",
		"192.0.2.2:2281":     "zk02.example.org",
	}
	dialed := map[string]string{}
	for range s.Len() {
		addr, _ := s.Next()
		dialed[addr] = s.host(addr)
	}
	if !maps.Equal(dialed, want) {
		t.Errorf("the client dials (address: host) %v, want %v", dialed, want)
	}
	if !strings.Contains(logs.String(), "gone.example.org") || strings.Count(logs.String(), "level=WARN") != 1 {
		t.Errorf("want one warning of the host that does not resolve:\n%s", logs.String())
	}

	_, err = resolveServers(t.Context(), []string{"gone.example.org:2281", "lost.example.org:2281"}, lookup, log)
	for _, want := range []string{"gone.example.org:2281, lost.example.org:2281", "no such host", "zookeeper-servers"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("with no host resolving, the error does not say %q: %v", want, err)
		}
	}
}
