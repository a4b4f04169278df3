package zookeeper

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
)

// certWarning is what the warning of a certificate that does not name its host says.
const certWarning = "does not name the host it is configured as"

// TestTLSChecksAsKazoo: every kind of server certificate is accepted or refused by
// ours as by kazoo, as nodepool configures it, with the same files: the chain is
// verified against the CA file, for a TLS server, and the names are not checked;
// where they do not name the host, ours warns once per host.
func TestTLSChecksAsKazoo(t *testing.T) {
	testenv.RequireKazoo(t)
	dir := t.TempDir()
	root := testenv.NewCA(t, "fleet CA", nil)
	other := testenv.NewCA(t, "another CA", nil)
	intermediate := root.SubCA(t, "fleet intermediate CA", nil)
	noSigning := root.SubCA(t, "", &x509.Certificate{Subject: pkix.Name{CommonName: "CA that may not sign"},
		KeyUsage: x509.KeyUsageCRLSign})
	caFile := write(t, dir, "ca.pem", root.CertPEM())
	clientCert, clientKey := root.Issue(t, testenv.ClientTemplate("client"))
	certFile, keyFile := write(t, dir, "client.pem", clientCert), write(t, dir, "client-key.pem", clientKey)
	client, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(root.CertPEM())

	loopback := net.IPv4(127, 0, 0, 1)
	zkCA := &x509.Certificate{Subject: pkix.Name{CommonName: "localhost"}, BasicConstraintsValid: true} // zk-ca.sh's
	selfSigned := testenv.NewCA(t, "", &x509.Certificate{Subject: pkix.Name{CommonName: "localhost"}, DNSNames: []string{"localhost"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	cases := []struct {
		name   string
		issuer *testenv.CA
		tmpl   *x509.Certificate
		chain  []*testenv.CA // sent after the server's certificate
		caFile string        // "": the fleet's CA
		hosts  map[string]bool
		refuse string // what our error says; "": accepted
	}{
		{name: "DNS name only", issuer: root, tmpl: testenv.ServerTemplate("zk", []string{"localhost"}),
			hosts: map[string]bool{"localhost": false, "127.0.0.1": true, "LOCALHOST.": false}},
		{name: "CN only, as zk-ca.sh makes them", issuer: root, tmpl: zkCA,
			hosts: map[string]bool{"localhost": false, "127.0.0.1": true, "zk01.example.org": true}},
		{name: "wildcard DNS name", issuer: root, tmpl: testenv.ServerTemplate("zk", []string{"*.example.org"}),
			hosts: map[string]bool{"zk01.example.org": false, "localhost": true}},
		{name: "an address", issuer: root, tmpl: testenv.ServerTemplate("zk", nil, loopback),
			hosts: map[string]bool{"127.0.0.1": false, "localhost": true}},
		{name: "through an intermediate CA", issuer: intermediate, chain: []*testenv.CA{intermediate},
			tmpl: testenv.ServerTemplate("zk", []string{"localhost"}), hosts: map[string]bool{"localhost": false}},
		{name: "self-signed, and the CA file", issuer: selfSigned, caFile: write(t, dir, "self.pem", selfSigned.CertPEM()),
			hosts: map[string]bool{"localhost": false}},
		{name: "from another CA", issuer: other, tmpl: testenv.ServerTemplate("zk", []string{"localhost"}),
			hosts: map[string]bool{"localhost": false}, refuse: "is not signed by the CA in " + caFile},
		{name: "intermediate CA not sent", issuer: intermediate, tmpl: testenv.ServerTemplate("zk", []string{"localhost"}),
			hosts: map[string]bool{"localhost": false}, refuse: "is not signed by the CA in " + caFile},
		{name: "expired", issuer: root, tmpl: expired(testenv.ServerTemplate("zk", []string{"localhost"})),
			hosts: map[string]bool{"localhost": false}, refuse: "expired"},
		{name: "for TLS clients only", issuer: root, tmpl: testenv.ClientTemplate("localhost"),
			hosts: map[string]bool{"localhost": false}, refuse: "key usage"},
		{name: "key usage without a TLS key exchange", issuer: root,
			tmpl:  &x509.Certificate{Subject: pkix.Name{CommonName: "localhost"}, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign},
			hosts: map[string]bool{"localhost": false}, refuse: "key usage allows no TLS key exchange"},
		{name: "issued by a CA that may not sign", issuer: noSigning, chain: []*testenv.CA{noSigning},
			tmpl: testenv.ServerTemplate("zk", []string{"localhost"}), hosts: map[string]bool{"localhost": false}, refuse: "cannot sign"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var server tls.Certificate
			if tc.tmpl == nil {
				server = keyPair(t, tc.issuer.CertPEM(), tc.issuer.KeyPEM())
			} else {
				certPEM, keyPEM := tc.issuer.Issue(t, tc.tmpl)
				server = keyPair(t, certPEM, keyPEM)
			}
			for _, ca := range tc.chain {
				server.Certificate = append(server.Certificate, pemDER(t, ca.CertPEM()))
			}
			addr := serveTLS(t, server)
			ca, pool := caFile, roots
			if tc.caFile != "" {
				ca, pool = tc.caFile, x509.NewCertPool()
				pool.AppendCertsFromPEM(tc.issuer.CertPEM())
			}

			// kazoo, with nodepool's arguments and the same files.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			err := testenv.KazooHandshake(ctx, testenv.KazooConn{Hosts: addr, TLS: true, CA: ca, Cert: certFile, Key: keyFile})
			if err != nil && !errors.Is(err, testenv.ErrKazooRefused) {
				t.Fatal(err)
			}
			t.Logf("kazoo: %v", err)
			if kazooAccepts := err == nil; kazooAccepts != (tc.refuse == "") {
				t.Fatalf("kazoo accepts it: %v (%v); the test expects %v", kazooAccepts, err, tc.refuse == "")
			}

			var logs testenv.Buffer
			d := newTLSDialer(&tls.Config{Certificates: []tls.Certificate{client}, RootCAs: pool, MinVersion: tls.VersionTLS12},
				ca, slog.New(slog.NewTextHandler(&logs, nil)))
			warnings := 0
			for host, mismatch := range tc.hosts {
				for range 2 { // a second connection, as a reconnect, warns no more
					conn, err := d.dial(ctx, addr, host)
					if tc.refuse != "" {
						if err == nil {
							conn.Close()
							t.Fatalf("host %s: accepted; kazoo refuses it", host)
						}
						t.Logf("ours: %v", err)
						for _, want := range []string{"ZooKeeper server " + host, tc.refuse} {
							if !strings.Contains(err.Error(), want) {
								t.Errorf("host %s: the refusal does not say %q: %v", host, want, err)
							}
						}
						continue
					}
					if err != nil {
						t.Fatalf("host %s: refused; kazoo accepts it: %v", host, err)
					}
					conn.Close()
				}
				if mismatch {
					warnings++
					if got := warningsFor(logs.String(), host); got != 1 {
						t.Errorf("host %s: %d warnings that the certificate does not name it, want 1:\n%s", host, got, logs.String())
					}
				}
			}
			if got := strings.Count(logs.String(), certWarning); got != warnings {
				t.Errorf("%d warnings, want %d:\n%s", got, warnings, logs.String())
			}
		})
	}
}

// warningsFor counts the warnings about host's certificate.
func warningsFor(logs, host string) int {
	n := 0
	for line := range strings.SplitSeq(logs, "\n") {
		if strings.Contains(line, certWarning) && strings.Contains(line, "host="+host+" ") {
			n++
		}
	}
	return n
}

func expired(c *x509.Certificate) *x509.Certificate {
	c.NotBefore, c.NotAfter = time.Now().Add(-48*time.Hour), time.Now().Add(-24*time.Hour)
	return c
}

func write(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func keyPair(t *testing.T, certPEM, keyPEM []byte) tls.Certificate {
	t.Helper()
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func pemDER(t *testing.T, certPEM []byte) []byte {
	t.Helper()
	b, _ := pem.Decode(certPEM)
	if b == nil {
		t.Fatal("no PEM block")
	}
	return b.Bytes
}

// serveTLS answers TLS handshakes on loopback with cert until the test ends.
func serveTLS(t *testing.T, cert tls.Certificate) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequestClientCert})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.SetDeadline(time.Now().Add(10 * time.Second))
			c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	return ln.Addr().String()
}
