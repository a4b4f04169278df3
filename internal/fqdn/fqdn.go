// Package fqdn finds the host's fully qualified name the way Python's
// socket.getfqdn does, which is the name nodepool's builder gives its host.
package fqdn

import (
	"context"
	"net"
	"os"
	"strings"
)

// Resolver looks names and addresses up; net.DefaultResolver is one.
type Resolver interface {
	LookupHost(ctx context.Context, host string) ([]string, error)
	LookupAddr(ctx context.Context, addr string) ([]string, error)
}

// Name is the fully qualified name of this host: Of its hostname, through the
// system's resolver.
func Name(ctx context.Context) string {
	host, err := os.Hostname()
	if err != nil {
		return ""
	}
	return Of(ctx, net.DefaultResolver, host)
}

// Of finds host's fully qualified name as socket.getfqdn(host) does: host's
// address is looked up, then the names of that address; the first of them
// with a dot is the answer, else the first of them. When a lookup fails or
// finds nothing, host itself is the answer.
func Of(ctx context.Context, r Resolver, host string) string {
	addrs, err := r.LookupHost(ctx, host)
	if err != nil || len(addrs) == 0 {
		return host
	}
	names, err := r.LookupAddr(ctx, addrs[0])
	if err != nil || len(names) == 0 {
		return host
	}
	for i, n := range names {
		names[i] = strings.TrimSuffix(n, ".") // DNS answers are absolute
	}
	for _, n := range names {
		if strings.Contains(n, ".") {
			return n
		}
	}
	return names[0]
}
