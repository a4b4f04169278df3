package zookeeper

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
)

// tlsDialer connects to the servers over TLS and checks each server's
// certificate as nodepool's client does, so that the certificates a nodepool
// fleet already uses work here too.
//
// nodepool 10 connects with kazoo (Debian's python3-kazoo 2.8): an
// ssl.SSLContext(PROTOCOL_SSLv23) with verify_mode CERT_REQUIRED (it always
// gives a client certificate), check_hostname off, and wrap_socket without a
// server_hostname. So OpenSSL verifies the chain for a TLS server (an extended
// key usage, when the certificate lists any, must allow serverAuth; a key
// usage, when listed, must allow a TLS key exchange; the CAs on the way must
// be CAs allowed to sign), and nothing compares the certificate's names with
// the host. Fleets' certificates often name a server only in the subject's CN
// (Zuul's zk-ca.sh makes them so), or by a name other than the configured one,
// and never by the address go-zookeeper dials, which is what Go's own check
// would compare. So the chain is checked here as OpenSSL checks it, against
// the CA of zookeeper-tls alone (kazoo also trusts the system's CAs, which
// would let any public CA vouch for a server), and a certificate that does not
// name the configured host is accepted with one warning per host.
// TestTLSChecksAsKazoo holds each of these checks against kazoo's.
type tlsDialer struct {
	config *tls.Config // the client certificate; RootCAs: the CA of zookeeper-tls
	caFile string      // where RootCAs came from, named in refusals
	log    *slog.Logger

	mu     sync.Mutex
	warned map[string]bool // hosts whose certificate's names were warned of
}

func newTLSDialer(config *tls.Config, caFile string, log *slog.Logger) *tlsDialer {
	return &tlsDialer{config: config, caFile: caFile, log: log, warned: map[string]bool{}}
}

// dial connects to address, an address of the server configured as host,
// and checks its certificate.
func (d *tlsDialer) dial(ctx context.Context, address, host string) (net.Conn, error) {
	cfg := d.config.Clone()
	// The host goes out as SNI (none for an address), as a proxy in front of
	// the cluster may need it. Go's check, which would refuse a certificate
	// that does not name it, gives way to verify, which runs on every
	// handshake.
	cfg.ServerName = host
	cfg.InsecureSkipVerify = true
	cfg.VerifyConnection = func(cs tls.ConnectionState) error { return d.verify(host, cs.PeerCertificates) }
	td := tls.Dialer{Config: cfg}
	return td.DialContext(ctx, "tcp", address)
}

// tlsKeyUsages are the key usages of a TLS server: a certificate that lists
// key usages must list one of them.
const tlsKeyUsages = x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment | x509.KeyUsageKeyAgreement

// verify checks the chain a server configured as host presented, and warns
// once when its certificate does not name host.
func (d *tlsDialer) verify(host string, certs []*x509.Certificate) error {
	if len(certs) == 0 {
		return fmt.Errorf("ZooKeeper server %s presented no certificate", host)
	}
	leaf := certs[0]
	intermediates := x509.NewCertPool()
	for _, c := range certs[1:] {
		intermediates.AddCert(c)
	}
	_, err := leaf.Verify(x509.VerifyOptions{
		Roots:         d.config.RootCAs,
		Intermediates: intermediates,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err == nil && leaf.KeyUsage != 0 && leaf.KeyUsage&tlsKeyUsages == 0 {
		// OpenSSL refuses it ("unsuitable certificate purpose"); Go's check
		// does not look at the key usage.
		err = errors.New("its key usage allows no TLS key exchange: it needs digitalSignature, keyEncipherment or keyAgreement")
	}
	if err != nil {
		return d.refusal(host, leaf, err)
	}
	if !namesHost(leaf, host) {
		d.warnOnce(host, leaf)
	}
	return nil
}

// refusal is the error of a certificate refused: what it is, why, and what
// to change.
func (d *tlsDialer) refusal(host string, leaf *x509.Certificate, err error) error {
	var unknown x509.UnknownAuthorityError
	if errors.As(err, &unknown) {
		return fmt.Errorf("the certificate of ZooKeeper server %s (%s; issuer %s) is not signed by the CA in %s: %w; "+
			"set zookeeper-tls ca to the CA that issued the servers' certificates",
			host, certNames(leaf), leaf.Issuer, d.caFile, err)
	}
	return fmt.Errorf("the certificate of ZooKeeper server %s (%s) is refused: %w; "+
		"the server needs a valid TLS server certificate from the CA in %s (zookeeper-tls ca)",
		host, certNames(leaf), err, d.caFile)
}

// warnOnce says, once per host, that the server's certificate does not name
// the host it is configured as.
func (d *tlsDialer) warnOnce(host string, leaf *x509.Certificate) {
	d.mu.Lock()
	seen := d.warned[host]
	d.warned[host] = true
	d.mu.Unlock()
	if seen {
		return
	}
	d.log.Warn("the certificate of a ZooKeeper server does not name the host it is configured as; it is accepted, as "+
		"nodepool accepts it, since the CA of zookeeper-tls signed it. To be rid of this warning, set the host in "+
		"zookeeper-servers to a name the certificate holds, or give the server a certificate that names the host",
		"host", host, "certificate_names", certNames(leaf), "ca", d.caFile)
}

// namesHost tells whether a certificate names host: in its subjectAltName,
// or, when it has none, in its subject's CN, where zk-ca.sh puts the name and
// where RFC 6125 (6.4.4) and OpenSSL still look; Go no longer does.
func namesHost(c *x509.Certificate, host string) bool {
	if i := strings.LastIndexByte(host, '%'); i > 0 && net.ParseIP(host[:i]) != nil {
		host = host[:i] // an address's zone is no part of a certificate
	}
	if c.VerifyHostname(host) == nil {
		return true
	}
	if hasAltNames(c) || c.Subject.CommonName == "" {
		return false
	}
	byCN := *c
	byCN.DNSNames = []string{c.Subject.CommonName}
	return byCN.VerifyHostname(host) == nil
}

func hasAltNames(c *x509.Certificate) bool {
	return len(c.DNSNames)+len(c.IPAddresses)+len(c.EmailAddresses)+len(c.URIs) > 0
}

// certNames is how a certificate names its subject, for messages: its DNS
// names and addresses, or its CN when it has no subjectAltName.
func certNames(c *x509.Certificate) string {
	var names []string
	for _, n := range c.DNSNames {
		names = append(names, "DNS:"+n)
	}
	for _, ip := range c.IPAddresses {
		names = append(names, "IP:"+ip.String())
	}
	switch {
	case len(names) > 0:
		return strings.Join(names, ", ")
	case hasAltNames(c):
		return "no DNS name or address"
	case c.Subject.CommonName != "":
		return "CN=" + c.Subject.CommonName + ", no subjectAltName"
	}
	return "no name"
}
