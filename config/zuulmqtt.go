package config

import (
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/nodepool-builder/nodepool-builder/internal/redact"
	"gopkg.in/yaml.v3"
)

// ZuulMQTT is builder.zuul-mqtt: the MQTT broker Zuul's MQTT reporter
// publishes its reports to. A report is a hint that a zuul-image may have a
// new build, never the build itself.
type ZuulMQTT struct {
	// URL is the broker as mqtt://host:port or mqtts://host:port, with the
	// port filled in; nothing else (no userinfo, path or query).
	URL  string
	Host string
	Port int  // default 1883, or 8883 for mqtts
	TLS  bool // mqtts
	// Topics are the topic filters subscribed to; default DefaultZuulMQTTTopics.
	Topics   []string
	Username string
	// PasswordFile holds the password, read at every connect; a trailing
	// newline is not part of it.
	PasswordFile string
	// CACert is a PEM bundle trusted besides the system roots; ClientCert and
	// ClientKey are a client certificate, both set or neither. mqtts only.
	CACert     string
	ClientCert string
	ClientKey  string
}

// Defaults of builder.zuul-mqtt.
const (
	DefaultMQTTPort  = 1883
	DefaultMQTTSPort = 8883
)

// DefaultZuulMQTTTopics is what builder.zuul-mqtt subscribes to when it lists
// no topics: Zuul's documentation publishes under zuul/.
var DefaultZuulMQTTTopics = []string{"zuul/#"}

// Keys of builder.zuul-mqtt that its checks across keys name, besides
// username and ca-cert.
const (
	keyPasswordFile = "password-file"
	keyClientCert   = "client-cert"
	keyClientKey    = "client-key"
)

// zuulMQTTTable is builder.zuul-mqtt. The section is ours, so unknown keys
// are errors.
var zuulMQTTTable = []spec[ZuulMQTT]{
	{key: "url", need: "set it to Zuul's MQTT broker, e.g. mqtts://mqtt.example.com:8883",
		read: func(r reader, z *ZuulMQTT) { r.m.p.mqttURL(r, z) }},
	{key: "topics",
		init: func(z *ZuulMQTT) { z.Topics = DefaultZuulMQTTTopics },
		read: func(r reader, z *ZuulMQTT) {
			if topics, ok := r.m.p.mqttTopics(r); ok {
				z.Topics = topics
			}
		}},
	{key: keyUsername,
		read: func(r reader, z *ZuulMQTT) { r.str(&z.Username) }},
	{key: keyPasswordFile,
		read: func(r reader, z *ZuulMQTT) { r.str(&z.PasswordFile) }},
	{key: keyCACert,
		read: func(r reader, z *ZuulMQTT) { r.str(&z.CACert) }},
	{key: keyClientCert,
		read: func(r reader, z *ZuulMQTT) { r.str(&z.ClientCert) }},
	{key: keyClientKey,
		read: func(r reader, z *ZuulMQTT) { r.str(&z.ClientKey) }},
}

// zuulMQTT reads builder.zuul-mqtt; nil when it is unusable, with the errors
// reported.
func (p *parser) zuulMQTT(n *yaml.Node, path string) *ZuulMQTT {
	m, ok := p.readMapping(n, path, "the zuul-mqtt section", keys(zuulMQTTTable), true)
	if !ok {
		return nil
	}
	errs := len(p.errs)
	z := defaults(zuulMQTTTable)
	readInto(m, zuulMQTTTable, &z)
	if z.PasswordFile != "" && z.Username == "" {
		n, _ := m.get(keyPasswordFile)
		p.errorf(n, m.sub(keyPasswordFile), "is set without username; set username to the user the broker knows this password by")
	}
	for _, pair := range [][2]string{{keyClientCert, keyClientKey}, {keyClientKey, keyClientCert}} {
		if m.has(pair[0]) && !m.has(pair[1]) {
			n, _ := m.get(pair[0])
			p.errorf(n, m.sub(pair[0]), "is set without %s; give both the client certificate and its key, or neither", pair[1])
		}
	}
	if z.URL != "" && !z.TLS {
		for _, key := range []string{keyCACert, keyClientCert, keyClientKey} {
			if n, ok := m.get(key); ok {
				p.errorf(n, m.sub(key), "is for TLS, which an mqtt:// url does not use; write the url as mqtts://, or remove %s", key)
			}
		}
	}
	if len(p.errs) > errs {
		return nil
	}
	return &z
}

// mqttURL reads and checks the url of zuul-mqtt into z. A URL with userinfo is
// never quoted back: it may hold the password.
func (p *parser) mqttURL(r reader, z *ZuulMQTT) {
	s, ok := r.m.str(r.key)
	if !ok {
		return
	}
	n, _ := r.node()
	path := r.path()
	const example = "write it like mqtts://mqtt.example.com:8883 or mqtt://mqtt.example.com"
	u, err := url.Parse(s)
	if err != nil || u.Opaque != "" || (u.Scheme != "mqtt" && u.Scheme != "mqtts") {
		p.errorf(n, path, "%q is not an mqtt:// or mqtts:// URL; %s", redact.URL(s), example)
		return
	}
	if u.User != nil {
		p.errorf(n, path, "holds a user name or password; put the user name in username and the password in a file named by password-file, and leave them out of the url")
		return
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.ForceQuery {
		p.errorf(n, path, "%q has a path, query or fragment, which an MQTT broker address has not; %s, and list what to subscribe to in topics", s, example)
		return
	}
	host := u.Hostname()
	if host == "" {
		p.errorf(n, path, "%q names no host; %s", s, example)
		return
	}
	tls := u.Scheme == "mqtts"
	port := DefaultMQTTPort
	if tls {
		port = DefaultMQTTSPort
	}
	if ps := u.Port(); ps != "" {
		v, err := strconv.Atoi(ps)
		if err != nil || v < 1 || v > 65535 {
			p.errorf(n, path, "%q: the port must be a TCP port number from 1 to 65535", s)
			return
		}
		port = v
	} else if strings.HasSuffix(u.Host, ":") {
		p.errorf(n, path, "%q has an empty port; write the port number after the colon, or leave both out for %d", s, port)
		return
	}
	z.TLS, z.Port, z.Host = tls, port, host
	z.URL = u.Scheme + "://" + net.JoinHostPort(host, strconv.Itoa(port))
}

// mqttTopics reads zuul-mqtt.topics, without repeats; ok is false when the key
// is absent or wrong.
func (p *parser) mqttTopics(r reader) ([]string, bool) {
	const example = "['zuul/#']"
	items, ok := r.m.list(r.key, "MQTT topic filters", example)
	if !ok {
		return nil, false
	}
	if len(items) == 0 {
		r.errorf("lists no topic, so no report would arrive; list the topic filters Zuul's reporters publish to, or remove the key for %s", example)
		return nil, false
	}
	var out []string
	good := true
	for i, item := range items {
		item = resolve(item)
		path := indexPath(r.path(), i)
		if isNull(item) || item.Kind != yaml.ScalarNode || item.ShortTag() != "!!str" {
			p.errorf(item, path, "expected a topic filter like 'zuul/#' (quote a lone '#': YAML takes it for a comment), not %s", p.describe(item))
			good = false
			continue
		}
		if err := checkTopicFilter(item.Value); err != nil {
			p.errorf(item, path, "%s", err)
			good = false
			continue
		}
		if !slices.Contains(out, item.Value) {
			out = append(out, item.Value)
		}
	}
	return out, good
}

// maxTopicLen is the longest topic MQTT can carry: its length is two bytes.
const maxTopicLen = 65535

// checkTopicFilter checks an MQTT topic filter as a broker would: "#" only as
// the whole last level, "+" only as a whole level.
func checkTopicFilter(f string) error {
	switch {
	case f == "":
		return fmt.Errorf("is empty; write a topic filter like 'zuul/#'")
	case len(f) > maxTopicLen:
		return fmt.Errorf("is %d bytes long; MQTT takes topic filters of at most %d", len(f), maxTopicLen)
	case !utf8.ValidString(f):
		return fmt.Errorf("is not valid UTF-8, which MQTT requires of a topic filter")
	case strings.ContainsFunc(f, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return fmt.Errorf("%q holds a control character; remove it", f)
	}
	levels := strings.Split(f, "/")
	for i, l := range levels {
		if strings.Contains(l, "#") && (l != "#" || i != len(levels)-1) {
			return fmt.Errorf("%q: # stands only for a whole last level and what lies below it, as in 'zuul/#'", f)
		}
		if strings.Contains(l, "+") && l != "+" {
			return fmt.Errorf("%q: + stands only for one whole level, as in 'zuul/+/post/#'", f)
		}
	}
	return nil
}
