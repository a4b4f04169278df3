package config

import (
	"slices"
	"time"

	"gopkg.in/yaml.v3"
)

// ZooKeeper is nodepool's zookeeper-servers, zookeeper-tls and zookeeper-timeout:
// when servers are given, the builder keeps its state in ZooKeeper.
type ZooKeeper struct {
	Servers []ZooKeeperServer
	// ServersFile is the file Servers were read from: nodepool.yaml, or the
	// secure file, whose list replaces it.
	ServersFile string
	TLS         *ZooKeeperTLS // nil: a plain connection
	Timeout     time.Duration // session timeout; default 10s, as nodepool's
}

// Equal tells whether two settings reach the same cluster the same way: the
// same servers, TLS files and timeout, whichever file named them.
func (z *ZooKeeper) Equal(o *ZooKeeper) bool {
	if z == nil || o == nil {
		return z == o
	}
	if (z.TLS == nil) != (o.TLS == nil) || z.TLS != nil && *z.TLS != *o.TLS {
		return false
	}
	return slices.Equal(z.Servers, o.Servers) && z.Timeout == o.Timeout
}

// ZooKeeperServer is one zookeeper-servers entry.
type ZooKeeperServer struct {
	Host   string
	Port   int    // default 2281, as nodepool 10 reads the key
	Chroot string // a path every znode lives under, e.g. /nodepool-test
}

// ZooKeeperTLS names the PEM files of a TLS connection with a client certificate.
type ZooKeeperTLS struct {
	Cert string
	Key  string
	CA   string
}

// Defaults of the ZooKeeper keys, as nodepool's. nodepool 10's loadConfig
// takes a server without a port at 2281, ZooKeeper's usual TLS port (its
// connection class says 2181, which loadConfig never uses): the launcher and
// the builder reading one file reach the same server.
const (
	DefaultZooKeeperPort    = 2281
	DefaultZooKeeperTimeout = 10 * time.Second
)

// The top-level ZooKeeper keys of nodepool.yaml, which the secure file may
// hold too.
const (
	keyZooKeeperServers = "zookeeper-servers"
	keyZooKeeperTLS     = "zookeeper-tls"
	keyZooKeeperTimeout = "zookeeper-timeout"
)

// zkServerEntry is a zookeeper-servers entry as read, with where its chroot
// is written, for the check that the servers of a cluster share one.
type zkServerEntry struct {
	ZooKeeperServer
	chrootAt   *yaml.Node
	chrootPath string
}

// zkServerTable is a zookeeper-servers entry: nodepool's schema for it.
var zkServerTable = append(hostPortRows(nodepools, "name the ZooKeeper server, e.g. host: zk.example.com",
	DefaultZooKeeperPort, func(e *zkServerEntry) (*string, *int) { return &e.Host, &e.Port }),
	spec[zkServerEntry]{key: "chroot", owner: nodepools,
		read: func(r reader, e *zkServerEntry) {
			c, ok := r.m.str(r.key)
			if !ok {
				return
			}
			if c == "" || c[0] != '/' || (len(c) > 1 && c[len(c)-1] == '/') {
				r.errorf("%s is not a ZooKeeper path: write it like /nodepool", r.m.p.quote(c))
				return
			}
			e.Chroot = c
			e.chrootAt, _ = r.node()
			e.chrootPath = r.path()
		}})

// zkTLSTable is zookeeper-tls: nodepool's schema for it, every key required.
var zkTLSTable = []spec[ZooKeeperTLS]{
	{key: "cert", owner: nodepools, need: zkTLSNeed,
		read: func(r reader, t *ZooKeeperTLS) { r.str(&t.Cert) }},
	{key: "key", owner: nodepools, need: zkTLSNeed,
		read: func(r reader, t *ZooKeeperTLS) { r.str(&t.Key) }},
	{key: "ca", owner: nodepools, need: zkTLSNeed,
		read: func(r reader, t *ZooKeeperTLS) { r.str(&t.CA) }},
}

const zkTLSNeed = "name the PEM file, as nodepool's zookeeper-tls takes it"

// zookeeper reads the three top-level ZooKeeper keys of nodepool.yaml. The
// result has no servers when the file names none: the secure file may add
// them (secure), and the config's ZooKeeper is nil without any.
func (p *parser) zookeeper(m *mapping) *ZooKeeper {
	zk := &ZooKeeper{Timeout: DefaultZooKeeperTimeout, Servers: p.zookeeperServers(m)}
	if len(zk.Servers) > 0 {
		zk.ServersFile = p.file
	}
	if n, ok := m.get(keyZooKeeperTLS); ok {
		zk.TLS = p.zookeeperTLS(n, m.sub(keyZooKeeperTLS))
	}
	if v, ok := m.seconds(keyZooKeeperTimeout, false); ok {
		zk.Timeout = v
		if n, _ := m.get(keyZooKeeperTimeout); n.ShortTag() == "!!int" {
			p.warnf(n, m.sub(keyZooKeeperTimeout), "nodepool's config-validate refuses a whole number here (its schema "+
				"takes a float): write %s.0", n.Value)
		}
	}
	return zk
}

// zookeeperServers reads a mapping's zookeeper-servers list. One cluster has
// one chroot: the first that a server names.
func (p *parser) zookeeperServers(m *mapping) []ZooKeeperServer {
	var servers []ZooKeeperServer
	chroot := ""
	for sm := range m.mappings(keyZooKeeperServers, "ZooKeeper servers", "[{host: zk.example.com, port: 2281}]", "a ZooKeeper server", keys(zkServerTable)) {
		s := defaults(zkServerTable)
		readInto(sm, zkServerTable, &s)
		switch c := s.Chroot; {
		case c == "" || chroot == "" || c == chroot:
			if c != "" {
				chroot = c
			}
		case p.hideValues:
			s.Chroot = ""
			p.errorf(s.chrootAt, s.chrootPath, "differs from the chroot of another server; one cluster has one chroot")
		default:
			s.Chroot = ""
			p.errorf(s.chrootAt, s.chrootPath, "%q differs from the chroot of another server (%s); one cluster has one chroot", c, chroot)
		}
		if s.Host != "" {
			servers = append(servers, s.ZooKeeperServer)
		}
	}
	return servers
}

func (p *parser) zookeeperTLS(n *yaml.Node, path string) *ZooKeeperTLS {
	m, ok := p.readMapping(n, path, "the zookeeper-tls section", keys(zkTLSTable), true)
	if !ok {
		return nil
	}
	t := defaults(zkTLSTable)
	readInto(m, zkTLSTable, &t)
	return &t
}
