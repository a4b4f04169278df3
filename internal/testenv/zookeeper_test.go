package testenv

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// createAndRead makes a znode holding its argument and prints what reading it gives.
const createAndRead = `
zk.create(sys.argv[1], sys.argv[2].encode(), makepath=True)
data, stat = zk.get(sys.argv[1])
print(data.decode())
`

func TestZooKeeperPlain(t *testing.T) {
	z := NewZooKeeper(t, ZooKeeperOptions{})
	ctx := context.Background()

	if out, err := z.FourLetterWord(ctx, "ruok"); err != nil || out != "imok" {
		t.Fatalf("ruok = %q, %v; want imok", out, err)
	}
	srvr, err := z.FourLetterWord(ctx, "srvr")
	if err != nil || !strings.Contains(srvr, "Mode: standalone") {
		t.Fatalf("srvr = %q, %v; want a standalone server", srvr, err)
	}
	t.Logf("srvr: %s", strings.SplitN(srvr, "\n", 2)[0])
	if cfg, err := os.ReadFile(filepath.Join(z.Dir, "zoo.cfg")); err != nil || bytes.Contains(cfg, []byte("secureClientPort")) {
		t.Errorf("plain zoo.cfg has a secure port (or is unreadable: %v):\n%s", err, cfg)
	}

	if got := z.Kazoo(t, createAndRead, "/nodepool/images/debian/builds/0001", "hello"); got != "hello\n" {
		t.Errorf("kazoo read back %q, want %q", got, "hello\n")
	}
}

func TestZooKeeperTLS(t *testing.T) {
	z := NewZooKeeper(t, ZooKeeperOptions{TLS: true})
	ctx := context.Background()

	// The answer to srvr over TLS is also what showed the server ready.
	if out, err := z.FourLetterWord(ctx, "ruok"); err != nil || out != "imok" {
		t.Fatalf("ruok over TLS = %q, %v; want imok", out, err)
	}
	if got := z.Kazoo(t, createAndRead, "/nodepool/images/debian/builds/0001", "over tls"); got != "over tls\n" {
		t.Errorf("kazoo over TLS read back %q, want %q", got, "over tls\n")
	}

	// The server's certificate names it as fleets' certificates do: by host name, not
	// by address, so that a client that checks the address it dialed fails.
	t.Run("certificate names no address", func(t *testing.T) {
		cfg, err := z.ClientTLSConfig()
		if err != nil {
			t.Fatal(err)
		}
		conn, err := (&tls.Dialer{Config: cfg}).DialContext(ctx, "tcp", z.Addr)
		if err != nil {
			t.Fatalf("dial %s as %s: %v", z.Addr, cfg.ServerName, err)
		}
		defer conn.Close()
		leaf := conn.(*tls.Conn).ConnectionState().PeerCertificates[0]
		if len(leaf.IPAddresses) > 0 || !slices.Equal(leaf.DNSNames, []string{"localhost"}) || z.ServerName != "localhost" {
			t.Errorf("the server's certificate names DNS %v, IP %v (ServerName %q); want DNS:localhost alone", leaf.DNSNames, leaf.IPAddresses, z.ServerName)
		}
		cfg.ServerName = "127.0.0.1"
		if conn, err := (&tls.Dialer{Config: cfg}).DialContext(ctx, "tcp", z.Addr); err == nil {
			conn.Close()
			t.Errorf("Go's check of the address 127.0.0.1 passed")
		}
	})

	t.Run("no plain connections", func(t *testing.T) {
		conn, err := net.DialTimeout("tcp", z.Addr, 2*time.Second)
		if err != nil {
			t.Fatalf("dial %s: %v", z.Addr, err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		conn.Write([]byte("ruok"))
		// Half-close: a server that waits for the rest of a TLS record gives up at once.
		conn.(*net.TCPConn).CloseWrite()
		answer, _ := io.ReadAll(conn)
		if bytes.Contains(answer, []byte("imok")) {
			t.Errorf("secure port answered a plain ruok with %q", answer)
		}
	})

	t.Run("Go client with a certificate from another CA", func(t *testing.T) {
		cfg, err := z.ClientTLSConfig()
		if err != nil {
			t.Fatal(err)
		}
		wrong, err := tls.LoadX509KeyPair(z.WrongClientCert, z.WrongClientKey)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{wrong}
		d := tls.Dialer{Config: cfg, NetDialer: &net.Dialer{Timeout: 2 * time.Second}}
		conn, err := d.DialContext(ctx, "tcp", z.Addr)
		if err != nil {
			// Refused in the handshake (TLS 1.2, ZooKeeper 3.8's default).
			if !strings.Contains(err.Error(), "certificate") {
				t.Errorf("handshake failed, but not over the certificate: %v", err)
			}
			return
		}
		defer conn.Close()
		// Under TLS 1.3 the server judges the client's certificate after the client
		// thinks the handshake is done; the refusal shows on the first read.
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		conn.Write([]byte("ruok"))
		buf := make([]byte, 16)
		n, err := conn.Read(buf)
		if err == nil || bytes.Contains(buf[:n], []byte("imok")) {
			t.Errorf("server accepted a client certificate from another CA: read %q, %v", buf[:n], err)
		}
	})

	// kazoo retries a refused connection until its start times out; each refusal must
	// come within that bound, for the reason the case is about, and write nothing.
	refusals := []struct {
		name string
		conn func(c *KazooConn)
		// why is what kazoo logs for the refusal: the client rejecting the server's
		// certificate, or the server's TLS alert about the client's.
		why string
	}{
		{"wrong CA and client certificate", func(c *KazooConn) { c.CA, c.Cert, c.Key = z.WrongCA, z.WrongClientCert, z.WrongClientKey }, "CERTIFICATE_VERIFY_FAILED"},
		{"server's CA, client certificate from another CA", func(c *KazooConn) { c.Cert, c.Key = z.WrongClientCert, z.WrongClientKey }, "alert"},
		{"no client certificate", func(c *KazooConn) { c.Cert, c.Key = "", "" }, "alert"},
		{"no TLS", func(c *KazooConn) { c.TLS, c.CA, c.Cert, c.Key = false, "", "", "" }, "Connection time-out"},
	}
	for _, tt := range refusals {
		t.Run("kazoo "+tt.name, func(t *testing.T) {
			RequireKazoo(t)
			c := z.KazooConn()
			c.Timeout = 3 * time.Second
			tt.conn(&c)
			ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			start := time.Now()
			out, err := RunKazoo(ctx, c, `zk.create("/refused", b"x"); print("connected")`)
			took := time.Since(start)
			if err == nil || strings.Contains(out, "connected") {
				t.Fatalf("kazoo connected (%s): stdout %q, err %v", tt.name, out, err)
			}
			if ctx.Err() != nil {
				t.Fatalf("kazoo hung instead of failing after %v: %v", took, err)
			}
			if !strings.Contains(err.Error(), tt.why) {
				t.Fatalf("kazoo failed, but not with %q:\n%v", tt.why, err)
			}
			t.Logf("refused after %v: %s", took.Round(100*time.Millisecond), firstWarning(err.Error()))
		})
	}
	if got := z.Kazoo(t, `print(zk.exists("/refused") is None)`); got != "True\n" {
		t.Errorf("a refused client wrote /refused: exists is None = %q", got)
	}
}

func TestZooKeeperRestartKeepsData(t *testing.T) {
	for _, opts := range []ZooKeeperOptions{{}, {TLS: true}} {
		t.Run(map[bool]string{false: "plain", true: "tls"}[opts.TLS], func(t *testing.T) {
			z := NewZooKeeper(t, opts)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			addr := z.Addr
			z.Kazoo(t, createAndRead, "/kept", "before restart")

			if err := z.Stop(); err != nil {
				t.Fatalf("stop: %v", err)
			}
			if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
				conn.Close()
				t.Fatalf("%s still accepts connections after Stop", addr)
			}
			if err := z.Start(ctx); err != nil {
				t.Fatalf("start again: %v", err)
			}
			if z.Addr != addr {
				t.Fatalf("restarted on %s, want %s", z.Addr, addr)
			}
			if got := z.Kazoo(t, `print(zk.get("/kept")[0].decode())`); got != "before restart\n" {
				t.Errorf("after Stop+Start /kept = %q, want %q", got, "before restart\n")
			}

			// A crash loses nothing acknowledged either: ZooKeeper syncs its log first.
			z.Kazoo(t, `zk.set("/kept", b"before kill")`)
			if err := z.Kill(); err != nil {
				t.Fatalf("kill: %v", err)
			}
			if err := z.Start(ctx); err != nil {
				t.Fatalf("start after kill: %v", err)
			}
			if got := z.Kazoo(t, `print(zk.get("/kept")[0].decode())`); got != "before kill\n" {
				t.Errorf("after Kill+Start /kept = %q, want %q", got, "before kill\n")
			}
			if err := z.Start(ctx); err == nil {
				t.Errorf("Start of a running server succeeded")
			}
		})
	}
}

func TestZooKeeperLeavesNothingRunning(t *testing.T) {
	var dir string
	t.Run("server", func(t *testing.T) {
		z := NewZooKeeper(t, ZooKeeperOptions{TLS: true})
		dir = z.Dir
		if pids := processesMentioning(t, dir); len(pids) == 0 {
			t.Errorf("no process mentions %s while the server runs", dir)
		}
	})
	if dir == "" {
		t.Skip("no server was started")
	}
	if pids := processesMentioning(t, dir); len(pids) > 0 {
		t.Errorf("processes %v of %s still run after the test ended", pids, dir)
	}
}

func TestRequireZooKeeperMissing(t *testing.T) {
	saved := zkJars
	t.Cleanup(func() { zkJars = saved })
	zkJars = []string{"/nonexistent/zookeeper.jar"}
	for _, ci := range []string{"true", ""} {
		t.Run("CI="+ci, func(t *testing.T) {
			t.Setenv("CI", ci)
			rec := &recordingTB{TB: t}
			if z := NewZooKeeper(rec, ZooKeeperOptions{}); z != nil {
				t.Fatalf("NewZooKeeper without jars returned a server")
			}
			got, other := rec.skip, rec.fatal
			if ci == "true" {
				got, other = rec.fatal, rec.skip
			}
			if !strings.Contains(got, "ZooKeeper") || !strings.Contains(got, "make deps-test") || other != "" {
				t.Errorf("fatal %q, skip %q: want one message naming ZooKeeper and make deps-test", rec.fatal, rec.skip)
			}
		})
	}
}

// firstWarning is the first line kazoo logged, which says why it could not connect.
func firstWarning(stderr string) string {
	for line := range strings.SplitSeq(stderr, "\n") {
		if strings.HasPrefix(line, "WARNING:") {
			return line
		}
	}
	return "(no warning)"
}

// TestZooKeeperTLSNamedByCN: with ServerNamedByCN the server's certificate names it as
// Zuul's zk-ca.sh does, CN=localhost and no subjectAltName, and the test's own client
// and kazoo still reach it.
func TestZooKeeperTLSNamedByCN(t *testing.T) {
	z := NewZooKeeper(t, ZooKeeperOptions{TLS: true, ServerNamedByCN: true})
	cfg, err := z.ClientTLSConfig()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := (&tls.Dialer{Config: cfg}).DialContext(context.Background(), "tcp", z.Addr)
	if err != nil {
		t.Fatalf("dial %s: %v", z.Addr, err)
	}
	leaf := conn.(*tls.Conn).ConnectionState().PeerCertificates[0]
	conn.Close()
	if leaf.Subject.CommonName != "localhost" || len(leaf.DNSNames)+len(leaf.IPAddresses) > 0 {
		t.Errorf("the server's certificate is CN=%s, DNS %v, IP %v; want CN=localhost alone", leaf.Subject.CommonName, leaf.DNSNames, leaf.IPAddresses)
	}
	if got := z.Kazoo(t, createAndRead, "/named-by-cn", "read"); got != "read\n" {
		t.Errorf("kazoo read back %q", got)
	}
}
