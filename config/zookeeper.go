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

var (
	zkServerKeys = []string{"host", "port", "chroot"}
	zkTLSKeys    = []string{"cert", "key", "ca"}
)

// zookeeper reads the three top-level ZooKeeper keys of nodepool.yaml. The
// result has no servers when the file names none: the secure file may add
// them (secure), and the config's ZooKeeper is nil without any.
func (p *parser) zookeeper(m *mapping) *ZooKeeper {
	zk := &ZooKeeper{Timeout: DefaultZooKeeperTimeout, Servers: p.zookeeperServers(m)}
	if len(zk.Servers) > 0 {
		zk.ServersFile = p.file
	}
	if n, ok := m.get("zookeeper-tls"); ok {
		zk.TLS = p.zookeeperTLS(n, m.sub("zookeeper-tls"))
	}
	if v, ok := m.seconds("zookeeper-timeout", false); ok {
		zk.Timeout = v
		if n, _ := m.get("zookeeper-timeout"); n.ShortTag() == "!!int" {
			p.warnf(n, m.sub("zookeeper-timeout"), "nodepool's config-validate refuses a whole number here (its schema "+
				"takes a float): write %s.0", n.Value)
		}
	}
	return zk
}

// zookeeperServers reads a mapping's zookeeper-servers list.
func (p *parser) zookeeperServers(m *mapping) []ZooKeeperServer {
	var servers []ZooKeeperServer
	chroot := ""
	for sm := range m.mappings("zookeeper-servers", "ZooKeeper servers", "[{host: zk.example.com, port: 2281}]", "a ZooKeeper server", zkServerKeys) {
		var s ZooKeeperServer
		s.Host, s.Port = sm.hostPort(DefaultZooKeeperPort, "name the ZooKeeper server, e.g. host: zk.example.com")
		if c, ok := sm.str("chroot"); ok {
			n, _ := sm.get("chroot")
			switch {
			case c == "" || c[0] != '/' || (len(c) > 1 && c[len(c)-1] == '/'):
				p.errorf(n, sm.sub("chroot"), "%s is not a ZooKeeper path: write it like /nodepool", p.quote(c))
			case chroot != "" && c != chroot && p.hideValues:
				p.errorf(n, sm.sub("chroot"), "differs from the chroot of another server; one cluster has one chroot")
			case chroot != "" && c != chroot:
				p.errorf(n, sm.sub("chroot"), "%q differs from the chroot of another server (%s); one cluster has one chroot", c, chroot)
			default:
				s.Chroot, chroot = c, c
			}
		}
		if s.Host != "" {
			servers = append(servers, s)
		}
	}
	return servers
}

func (p *parser) zookeeperTLS(n *yaml.Node, path string) *ZooKeeperTLS {
	m, ok := p.readMapping(n, path, "the zookeeper-tls section", zkTLSKeys, true)
	if !ok {
		return nil
	}
	t := &ZooKeeperTLS{}
	for key, dst := range map[string]*string{"cert": &t.Cert, "key": &t.Key, "ca": &t.CA} {
		if m.require(key, "name the PEM file, as nodepool's zookeeper-tls takes it") {
			*dst, _ = m.str(key)
		}
	}
	return t
}
