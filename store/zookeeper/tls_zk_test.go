package zookeeper_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/store/zookeeper"
)

// certWarning is what the warning of a certificate that does not name its host says.
const certWarning = "does not name the host it is configured as"

// openTLS opens a backend on servers with z's client certificate, trusting the CA
// in caFile, registered as name, logging to logs.
func openTLS(t *testing.T, z *testenv.ZooKeeper, servers []string, caFile, name string, logs *testenv.Buffer) (*zookeeper.Backend, error) {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(z.ClientCert, z.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return zookeeper.Open(ctx, zookeeper.Options{Servers: servers, Chroot: chroot(t), Timeout: 4 * time.Second, Hostname: name,
		TLS:       &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS12},
		TLSCAFile: caFile, Logger: slog.New(slog.NewTextHandler(logs, nil))})
}

// registered is what kazoo, connected with hosts and z's files, finds of the
// builders registered under the test's chroot.
func registered(t *testing.T, z *testenv.ZooKeeper, hosts string) string {
	t.Helper()
	c := z.KazooConn()
	c.Hosts = hosts + chroot(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := testenv.RunKazoo(ctx, c, `print(",".join(sorted(c.rstrip("0123456789") for c in zk.get_children("/nodepool/components/builder"))))`)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(out)
}

// TestTLSServerNamedByHostName: a server whose certificate names it by host name
// alone (DNS:localhost, or CN=localhost without subjectAltName as zk-ca.sh makes
// them) is reached under that name without a warning, and under an address (IPv4
// or IPv6) with one warning that names the host and the certificate's names, and
// none more when the connection comes back; kazoo, as nodepool configures it,
// reaches it with the same files and hosts. Several servers, a chroot and a
// server that does not answer work as before.
func TestTLSServerNamedByHostName(t *testing.T) {
	for _, byCN := range []bool{false, true} {
		names := map[bool]string{false: "DNS:localhost", true: "CN=localhost, no subjectAltName"}[byCN]
		t.Run(names, func(t *testing.T) {
			z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{TLS: true, ServerNamedByCN: byCN})
			_, port, _ := net.SplitHostPort(z.Addr)
			v6 := testenv.NewProxyOn(t, "[::1]:0", z.Addr)
			down := net.JoinHostPort("127.0.0.1", strconv.Itoa(testenv.FreePort(t)))
			cases := []struct {
				name    string
				servers []string
				warned  string // the host warned of; "": none
			}{
				{"by its name", []string{"localhost:" + port}, ""},
				{"by its address", []string{z.Addr}, "127.0.0.1"},
				{"by its IPv6 address", []string{v6.Addr}, "::1"},
				{"among several, one down", []string{down, "localhost:" + port}, ""},
			}
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					var logs testenv.Buffer
					b, err := openTLS(t, z, tc.servers, z.CA, "tls-builder", &logs)
					if err != nil {
						t.Fatalf("open %v: %v\n%s", tc.servers, err, logs.String())
					}
					defer b.Close()
					if got := registered(t, z, strings.Join(tc.servers, ",")); got != "tls-builder" {
						t.Errorf("kazoo on %v finds the builders %q, want tls-builder", tc.servers, got)
					}
					warnings := strings.Count(logs.String(), certWarning)
					if tc.warned == "" {
						if warnings != 0 {
							t.Errorf("warned of a certificate that names the host:\n%s", logs.String())
						}
						return
					}
					if warnings != 1 {
						t.Fatalf("%d warnings of the certificate's names, want 1:\n%s", warnings, logs.String())
					}
					for _, want := range []string{"host=" + tc.warned, "certificate_names=" + logValue(names), "ca=" + logValue(z.CA)} {
						if !strings.Contains(logs.String(), want) {
							t.Errorf("the warning does not say %s:\n%s", want, logs.String())
						}
					}
				})
			}

			t.Run("reconnected", func(t *testing.T) {
				p := testenv.NewProxy(t, z.Addr)
				var logs testenv.Buffer
				b, err := openTLS(t, z, []string{p.Addr}, z.CA, "", &logs)
				if err != nil {
					t.Fatalf("open: %v\n%s", err, logs.String())
				}
				defer b.Close()
				p.Down()
				testenv.WaitFor(t, 30*time.Second, "the backend to see the connection lost", func() bool { return !b.Connected() }, logs.String)
				if err := p.Up(); err != nil {
					t.Fatal(err)
				}
				testenv.WaitFor(t, 30*time.Second, "the backend to connect again", b.Connected, logs.String)
				if n := strings.Count(logs.String(), certWarning); n != 1 {
					t.Errorf("%d warnings of the certificate's names over two connections, want 1:\n%s", n, logs.String())
				}
			})
		})
	}
}

// logValue is s as slog's text handler writes it.
func logValue(s string) string {
	if strings.ContainsAny(s, " =\"") {
		return strconv.Quote(s)
	}
	return s
}

// TestTLSRefusesServerOfAnotherCA: a server whose certificate another CA signed,
// and a server ours cannot vouch for because zookeeper-tls names the wrong CA, are
// refused, by kazoo too, with an error that names the CA file and what to change.
func TestTLSRefusesServerOfAnotherCA(t *testing.T) {
	z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{TLS: true})
	impostor := z.Impostor(t)
	for _, tc := range []struct {
		name, server, ca string
	}{
		{"a server certificate of another CA", impostor.Addr, z.CA},
		{"a CA file of another CA", z.Addr, z.WrongCA},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs testenv.Buffer
			b, err := openTLS(t, z, []string{tc.server}, tc.ca, "", &logs)
			if err == nil {
				b.Close()
				t.Fatalf("connected to %s trusting %s", tc.server, tc.ca)
			}
			if !errors.Is(err, zookeeper.ErrUnreachable) {
				t.Errorf("the error does not wrap ErrUnreachable: %v", err)
			}
			for _, want := range []string{tc.server, "is not signed by the CA in " + tc.ca, "set zookeeper-tls ca to the CA that issued"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the error does not say %q: %v", want, err)
				}
			}

			testenv.RequireKazoo(t)
			c := z.KazooConn()
			c.Hosts, c.CA, c.Timeout = tc.server, tc.ca, 3*time.Second
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			out, err := testenv.RunKazoo(ctx, c, `print("connected")`)
			if err == nil || !strings.Contains(err.Error(), "CERTIFICATE_VERIFY_FAILED") {
				t.Errorf("kazoo, trusting %s, was not refused the server at %s: %q, %v", tc.ca, tc.server, out, err)
			}
		})
	}
}

// TestTLSReconnectRefusedSaysWhy: when, after the session, the server presents
// a certificate another CA signed, the reconnects fail quietly inside the
// client; the warning at the session timeout says why.
func TestTLSReconnectRefusedSaysWhy(t *testing.T) {
	z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{TLS: true})
	impostor := z.Impostor(t)
	p := testenv.NewProxy(t, z.Addr)
	var logs testenv.Buffer
	b, err := openTLS(t, z, []string{p.Addr}, z.CA, "", &logs)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	p.SetTarget(impostor.Addr)
	p.Down()
	if err := p.Up(); err != nil {
		t.Fatal(err)
	}
	const adrift = "no ZooKeeper connection for the session timeout"
	testenv.WaitFor(t, time.Minute, "the warning of a session timeout without a connection", func() bool {
		return strings.Contains(logs.String(), adrift)
	}, logs.String)
	for line := range strings.SplitSeq(logs.String(), "\n") {
		if strings.Contains(line, adrift) && !strings.Contains(line, "is not signed by the CA in") {
			t.Errorf("the warning does not say the server's certificate was refused:\n%s", line)
		}
	}
}
