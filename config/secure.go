package config

import (
	"maps"
	"slices"

	"gopkg.in/yaml.v3"
)

// secureKeys are the top-level keys nodepool reads from its secure file (-s),
// all of them (nodepool's loadSecureConfig): keys of nodepool.yaml's top
// level.
var secureKeys = []string{keyZooKeeperServers, keyZooKeeperTLS, keyDiskImages}

// secureImage is a diskimages entry of the secure file as read. envOK tells
// that its env-vars are given and right.
type secureImage struct {
	name  string
	env   map[string]string
	envOK bool
}

// secureDiskImageTable is a diskimages entry of the secure file: the keys
// nodepool reads from it.
var secureDiskImageTable = []spec[secureImage]{
	{key: keyName, owner: nodepools, need: "name the diskimage whose env-vars these are",
		read: func(r reader, si *secureImage) { r.str(&si.name) }},
	// nodepool's loader fails on an entry without env-vars (a KeyError).
	{key: keyEnvVars, owner: nodepools, need: "nodepool's loader fails on a diskimage of the secure file without env-vars: add " +
		"them, or remove the entry",
		read: func(r reader, si *secureImage) { si.env, si.envOK = r.m.strMap(r.key, "DIB_PASSWORD: ...") }},
}

// secure lays nodepool's secure file over the config read from nodepool.yaml
// (nodepoolFile), as nodepool's loadSecureConfig does: a non-empty
// zookeeper-servers replaces nodepool.yaml's list, a non-empty zookeeper-tls
// replaces its section, and each diskimages entry's env-vars are merged into
// those of the diskimage it names, its own winning. An entry naming no
// diskimage that is built is an error, as it is to nodepool.
//
// nodepool ignores every other key of the file. Here a key of nodepool.yaml's
// or of a diskimage (a leftover, doing nothing to nodepool either) is a
// warning, and any other key an error: a misspelt zookeeper-servers would
// leave the state in SQLite, where the builder knows none of its uploads.
func (p *parser) secure(root *yaml.Node, cfg *Config, zk *ZooKeeper, names imageNames, nodepoolFile string) {
	m, ok := p.readMapping(root, "", "the secure file", secureKeys, false)
	if !ok {
		return
	}
	p.ignoredKeys(m, "the secure file", secureKeys, slices.Concat(keys(topTable), keys(ownTable)),
		"nodepool reads only zookeeper-servers, zookeeper-tls and the env-vars of diskimages from the secure file, and "+
			"ignores this key there, as the builder does: set it in "+nodepoolFile+" (or "+BuilderFileName+"), or remove it")
	if servers := p.zookeeperServers(m); len(servers) > 0 {
		zk.Servers, zk.ServersFile = servers, p.file
	}
	if n, ok := m.get(keyZooKeeperTLS); ok && (n.Kind != yaml.MappingNode || len(n.Content) > 0) {
		zk.TLS = p.zookeeperTLS(n, m.sub(keyZooKeeperTLS))
	}
	items, _ := m.list(keyDiskImages, keyDiskImages, "[{name: debian, env-vars: {DIB_PASSWORD: ...}}]")
	for i, item := range items {
		p.secureDiskImage(item, indexPath(m.sub(keyDiskImages), i), cfg, names, nodepoolFile)
	}
}

// secureDiskImage merges the env-vars of one diskimages entry of the secure
// file into the diskimage it names.
func (p *parser) secureDiskImage(item *yaml.Node, path string, cfg *Config, names imageNames, nodepoolFile string) {
	read := keys(secureDiskImageTable)
	m, ok := p.readMapping(item, path, "a diskimage of the secure file", read, false)
	if !ok {
		return
	}
	p.ignoredKeys(m, "a diskimage of the secure file", read, keys(diskImageTable),
		"nodepool reads only the name and env-vars of a diskimage from the secure file, and ignores this key there, as "+
			"the builder does: set it in the diskimage's entry in "+nodepoolFile+", or remove it")
	var si secureImage
	readInto(m, secureDiskImageTable, &si)
	name := si.name
	if name == "" {
		return
	}
	n, _ := m.get(keyName)
	at := m.sub(keyName)
	def, known := names[name]
	switch {
	case !known:
		p.errorf(n, at, "%q is not a diskimage of %s, and nodepool's loader refuses a secure file that names one "+
			"(\"unknown diskimage\"): fix the name, or remove the entry", name, nodepoolFile)
		return
	case def.kind == "abstract diskimage":
		p.errorf(n, at, "%q is an abstract diskimage, and nodepool's loader refuses it here (\"unknown diskimage\"): it "+
			"takes the secure env-vars of an image that is built, which its children do not inherit; give them to each "+
			"image that has it as parent", name)
		return
	case def.kind == "zuul-image":
		p.warnf(n, at, "%q is a zuul-image, fetched from Zuul and never built here, so its env-vars are not used: "+
			"remove the entry", name)
		return
	}
	if !si.envOK {
		return
	}
	for i := range cfg.DiskImages {
		d := &cfg.DiskImages[i]
		if d.Name != name {
			continue
		}
		// A new map: the image's may be shared with the images inheriting it.
		merged := maps.Clone(d.EnvVars)
		if merged == nil {
			merged = map[string]string{}
		}
		maps.Copy(merged, si.env)
		d.EnvVars = merged
	}
}

// ignoredKeys reports the keys of m that are not among read: a warning
// (saying why) for a key of others, which nodepool knows elsewhere and ignores
// here, an error naming the key most likely meant for any other.
func (p *parser) ignoredKeys(m *mapping, what string, read, others []string, why string) {
	for i := 0; i+1 < len(m.node.Content); i += 2 {
		k := m.node.Content[i]
		switch {
		case k.ShortTag() == "!!merge" || slices.Contains(read, k.Value):
		case slices.Contains(others, k.Value):
			p.warnf(k, childPath(m.path, k.Value), "%s", why)
		default:
			p.errorf(k, childPath(m.path, k.Value), "%s", unknownKeyMsg(k.Value, what, read))
		}
	}
}
