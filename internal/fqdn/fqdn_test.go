package fqdn

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
)

// table is a resolver of fixed answers; a name or address it lacks fails.
type table struct {
	hosts map[string][]string
	addrs map[string][]string
}

func (r table) LookupHost(_ context.Context, host string) ([]string, error) {
	if a, ok := r.hosts[host]; ok {
		return a, nil
	}
	return nil, errors.New("no such host")
}

func (r table) LookupAddr(_ context.Context, addr string) ([]string, error) {
	if n, ok := r.addrs[addr]; ok {
		return n, nil
	}
	return nil, errors.New("no such address")
}

func TestOf(t *testing.T) {
	for _, c := range []struct {
		name, host string
		r          table
		want       string
	}{
		{"the address's first name with a dot", "node1",
			table{map[string][]string{"node1": {"192.0.2.7", "192.0.2.8"}}, map[string][]string{"192.0.2.7": {"node1.example.com.", "node1"}}},
			"node1.example.com"},
		{"an alias with a dot wins over a first name without", "node1",
			table{map[string][]string{"node1": {"192.0.2.7"}}, map[string][]string{"192.0.2.7": {"node1", "node1.example.com"}}},
			"node1.example.com"},
		{"no name with a dot: the address's first name", "vm",
			table{map[string][]string{"vm": {"127.0.0.1"}}, map[string][]string{"127.0.0.1": {"localhost", "vm"}}},
			"localhost"},
		{"a host that does not resolve is its own name", "node1", table{}, "node1"},
		{"an address without names: the host's name", "node1",
			table{map[string][]string{"node1": {"192.0.2.7"}}, map[string][]string{"192.0.2.7": {}}},
			"node1"},
	} {
		if got := Of(context.Background(), c.r, c.host); got != c.want {
			t.Errorf("%s: Of(%q) = %q, want %q", c.name, c.host, got, c.want)
		}
	}
}

// TestNameIsPythons: this host's name is the one Python's socket.getfqdn
// gives, which nodepool's builder names the host by.
func TestNameIsPythons(t *testing.T) {
	python := testenv.RequireBinary(t, "python3")
	out, err := exec.Command(python, "-c", "import socket; print(socket.getfqdn())").Output()
	if err != nil {
		t.Fatalf("python3 socket.getfqdn: %v", err)
	}
	if got, want := Name(context.Background()), strings.TrimSpace(string(out)); got != want {
		t.Errorf("Name() = %q, Python's socket.getfqdn() = %q", got, want)
	}
}
