package config

import (
	"time"

	"gopkg.in/yaml.v3"
)

// ZooKeeper is nodepool's zookeeper-servers, zookeeper-tls and zookeeper-timeout:
// when servers are given, the builder keeps its state in ZooKeeper.
type ZooKeeper struct {
	Servers []ZooKeeperServer
	TLS     *ZooKeeperTLS // nil: a plain connection
	Timeout time.Duration // session timeout; default 10s, as nodepool's
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

// zookeeper reads the three top-level ZooKeeper keys; nil without servers.
func (p *parser) zookeeper(m *mapping) *ZooKeeper {
	items, _ := m.list("zookeeper-servers", "ZooKeeper servers", "[{host: zk.example.com, port: 2281}]")
	zk := &ZooKeeper{Timeout: DefaultZooKeeperTimeout}
	chroot := ""
	for i, item := range items {
		path := indexPath(m.sub("zookeeper-servers"), i)
		sm, ok := p.readMapping(item, path, "a ZooKeeper server", zkServerKeys, true)
		if !ok {
			continue
		}
		var s ZooKeeperServer
		s.Host, s.Port = sm.hostPort(DefaultZooKeeperPort, "name the ZooKeeper server, e.g. host: zk.example.com")
		if c, ok := sm.str("chroot"); ok {
			n, _ := sm.get("chroot")
			switch {
			case c == "" || c[0] != '/' || (len(c) > 1 && c[len(c)-1] == '/'):
				p.errorf(n, sm.sub("chroot"), "%q is not a ZooKeeper path: write it like /nodepool", c)
			case chroot != "" && c != chroot:
				p.errorf(n, sm.sub("chroot"), "%q differs from the chroot of another server (%s); one cluster has one chroot", c, chroot)
			default:
				s.Chroot, chroot = c, c
			}
		}
		if s.Host != "" {
			zk.Servers = append(zk.Servers, s)
		}
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
	if len(zk.Servers) == 0 {
		return nil
	}
	return zk
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
