package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"

	"github.com/z-division/go-zookeeper/zk"
)

// servers is the client's host provider: every address of every configured
// server, in the rotation of go-zookeeper's own DNSHostProvider, which it
// wraps, plus the host each address came from. The client dials addresses,
// and the TLS check needs the host name the operator configured.
type servers struct {
	*zk.DNSHostProvider
	addrs []string
	hosts map[string]string // address (host:port) -> the host configured; not changed once made
}

// lookupHost is how resolveServers finds a host's addresses.
type lookupHost func(ctx context.Context, host string) ([]string, error)

// resolveServers looks up the addresses of every server (host:port), as the
// client's own provider would, but within ctx. A host that does not resolve
// is left out, as the client leaves it, with a warning; when none resolves,
// it is an error.
func resolveServers(ctx context.Context, list []string, lookup lookupHost, log *slog.Logger) (*servers, error) {
	s := &servers{DNSHostProvider: &zk.DNSHostProvider{}, hosts: map[string]string{}}
	var addrs []string
	var failed []error
	for _, server := range list {
		host, port, err := net.SplitHostPort(server)
		if err != nil {
			return nil, fmt.Errorf("ZooKeeper server %q: %w", server, err)
		}
		ips, err := lookup(ctx, host)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			failed = append(failed, err)
			continue
		}
		for _, ip := range ips {
			addr := net.JoinHostPort(ip, port)
			if _, ok := s.hosts[addr]; ok {
				continue // two hosts of one address: the first names it
			}
			s.hosts[addr] = host
			addrs = append(addrs, addr)
		}
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("resolve the ZooKeeper servers %s: %w; check their host names in zookeeper-servers and this host's DNS",
			strings.Join(list, ", "), errors.Join(failed...))
	}
	for _, err := range failed {
		log.Warn("a ZooKeeper server's host name does not resolve; using the other servers", "error", err)
	}
	s.addrs = addrs
	return s, nil
}

// Init is called by the client with the configured servers: it takes their
// addresses, resolved already. An address resolves to itself, so the wrapped
// provider looks nothing up.
func (s *servers) Init([]string) error { return s.DNSHostProvider.Init(s.addrs) }

// host is the configured host of an address the client dials.
func (s *servers) host(addr string) string {
	if h, ok := s.hosts[addr]; ok {
		return h
	}
	h, _, _ := net.SplitHostPort(addr)
	return h
}
