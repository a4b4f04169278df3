package testenv

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// ZooKeeperOptions says what kind of ZooKeeper a test wants.
type ZooKeeperOptions struct {
	// TLS makes the server listen only on a TLS port that requires a client certificate
	// signed by the test CA, as nodepool's clusters do.
	TLS bool
	// ServerNamedByCN makes the server's certificate name it as Zuul's zk-ca.sh does:
	// CN=localhost and no subjectAltName at all. Otherwise it names it DNS:localhost
	// alone. Either way it names no address, as a fleet's certificates name servers by
	// host name, so that a client checking the address it dialed fails the tests.
	ServerNamedByCN bool
}

// ZooKeeper is a standalone ZooKeeper 3.8 server on loopback, with its data, config,
// certificates and log in one directory.
type ZooKeeper struct {
	// Addr is host:port of the client port, or of the secure client port under TLS.
	Addr string
	// Port is the port of Addr; it stays the same across Stop and Start.
	Port int
	// Dir holds zoo.cfg, the data directory, the certificates and the log.
	Dir string
	// LogFile is everything the server wrote, across restarts.
	LogFile string
	// TLS tells whether the server listens only on a TLS port.
	TLS bool

	// Under TLS: PEM files of the CA the server trusts and presents a certificate from,
	// and a client certificate and key it accepts.
	CA, ClientCert, ClientKey string
	// Under TLS: an unrelated CA with its own client certificate and key, which the server
	// must refuse and whose CA does not vouch for the server.
	WrongCA, WrongClientCert, WrongClientKey string
	// ServerName is the name the server's certificate gives it: localhost. The
	// certificate names no address, so a client that checks the name must be given
	// this one, not the address of Addr.
	ServerName string
	namedByCN  bool // the certificate names the server in its CN alone

	conf string
	logw io.Writer
	srv  server
}

// zkMain runs a standalone server from one config file; QuorumPeerMain, which Debian's
// service uses, would also start quorum machinery a test does not need.
const zkMain = "org.apache.zookeeper.server.ZooKeeperServerMain"

const (
	// zkReadyTimeout bounds the wait for a started server to answer; a JVM starts it in
	// a second or two, so the bound only keeps a wedged server from hanging the run.
	zkReadyTimeout = 30 * time.Second
)

// zkJars is the server's class path from Debian's packages. zookeeper.jar's manifest
// names most of what it needs (jute, netty's buffer, handler and transport, slf4j-api),
// but not netty-codec and netty-resolver, without which netty's TLS handler fails to load
// (NoClassDefFoundError: io/netty/handler/codec/ByteToMessageDecoder), nor an slf4j
// binding: slf4j-simple sends the server's log to stderr, hence to the log file.
var zkJars = []string{
	"/usr/share/java/zookeeper.jar",
	"/usr/share/java/netty-codec.jar",
	"/usr/share/java/netty-resolver.jar",
	"/usr/share/java/slf4j-simple.jar",
}

// RequireZooKeeper returns the path of java once java and ZooKeeper's jars are installed.
// Otherwise the test is skipped, or fails when CI=true.
func RequireZooKeeper(t testing.TB) string {
	t.Helper()
	java := RequireBinary(t, "java")
	if java == "" {
		return ""
	}
	for _, jar := range zkJars {
		if _, err := os.Stat(jar); err != nil {
			requirePart(t, "ZooKeeper ("+jar+")")
			return ""
		}
	}
	return java
}

// requirePart skips the test, or fails it under CI=true, for a real part that is missing.
func requirePart(t testing.TB, what string) {
	t.Helper()
	Unavailable(t, "%s not installed; run `make deps-test`", what)
}

// NewZooKeeper starts a ZooKeeper for the test and stops it when the test ends. It
// skips (or fails under CI) when java or ZooKeeper is not installed.
func NewZooKeeper(t testing.TB, opts ZooKeeperOptions) *ZooKeeper {
	t.Helper()
	if RequireZooKeeper(t) == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	z, err := StartZooKeeper(ctx, t.TempDir(), opts, nil)
	if err != nil {
		t.Fatal(err) // it says what it was starting and ends with the server's log
	}
	t.Cleanup(func() {
		if err := z.Stop(); err != nil {
			t.Error(err)
		}
	})
	return z
}

// StartZooKeeper writes a zoo.cfg (and under TLS the certificates) into dir, starts the
// server on a free loopback port in its own process group, and waits until it serves.
// The server's output goes to dir/zookeeper.log and, when logw is not nil, to logw too.
// ctx bounds the start only; the caller ends the server with Stop.
func StartZooKeeper(ctx context.Context, dir string, opts ZooKeeperOptions, logw io.Writer) (*ZooKeeper, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("start zookeeper in %s: %w", dir, err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
		return nil, fmt.Errorf("start zookeeper: %w", err)
	}
	z := &ZooKeeper{
		Dir:     dir,
		LogFile: filepath.Join(dir, "zookeeper.log"),
		TLS:     opts.TLS,
		conf:    filepath.Join(dir, "zoo.cfg"),
		logw:    logw,
	}
	z.srv = server{name: "zookeeper", addr: func() string { return z.Addr }, logFile: z.LogFile,
		portTaken: "Address already in use", run: z.run, ready: z.waitReady}
	if opts.TLS {
		if err := z.writeCerts(opts.ServerNamedByCN); err != nil {
			return nil, fmt.Errorf("start zookeeper: %w", err)
		}
	}
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, fmt.Errorf("start zookeeper: %w", err)
		}
		z.Port = port
		z.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if err := os.WriteFile(z.conf, []byte(z.config()), 0o644); err != nil {
			return nil, fmt.Errorf("start zookeeper: write config: %w", err)
		}
		err = z.Start(ctx)
		if err == nil {
			return z, nil
		}
		// Another process may take the port between freePort and the JVM binding it.
		if attempt == 1 && errors.Is(err, errPortTaken) {
			continue
		}
		return nil, err
	}
}

// config is a zoo.cfg for a standalone server that keeps everything under z.Dir.
func (z *ZooKeeper) config() string {
	// tickTime 1000 allows sessions of 2 to 20 s, short enough for tests of expiry.
	// Keys ZooKeeper does not know as fields (4lw.commands.whitelist, serverCnxnFactory,
	// ssl.*) become zookeeper.* system properties, which is where the server reads them.
	var b strings.Builder
	fmt.Fprintf(&b, `tickTime=1000
dataDir=%s
maxClientCnxns=60
admin.enableServer=false
4lw.commands.whitelist=*
autopurge.purgeInterval=0
`, filepath.Join(z.Dir, "data"))
	if !z.TLS {
		fmt.Fprintf(&b, "clientPortAddress=127.0.0.1\nclientPort=%d\n", z.Port)
		return b.String()
	}
	// No clientPort at all: the only way in is TLS with a certificate from the test CA.
	// The Netty factory is the one that speaks TLS; PEM stores spare a keytool run.
	fmt.Fprintf(&b, `secureClientPortAddress=127.0.0.1
secureClientPort=%d
serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory
ssl.keyStore.location=%s
ssl.keyStore.type=PEM
ssl.trustStore.location=%s
ssl.trustStore.type=PEM
ssl.clientAuth=need
`, z.Port, filepath.Join(z.Dir, "tls", "server.pem"), z.CA)
	return b.String()
}

// Start starts the server (again, after Stop or Kill) on its port and data directory,
// so what it stored survives, and waits until it serves. It fails when it is running.
func (z *ZooKeeper) Start(ctx context.Context) error { return z.srv.start(ctx) }

// run starts the JVM.
func (z *ZooKeeper) run() (*process, error) {
	// A small heap and the client compiler start the JVM fastest; -UsePerfData keeps it
	// out of /tmp/hsperfdata_*.
	cmd := exec.Command("java",
		"-Xms16m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData",
		"-Djava.awt.headless=true",
		"-Dorg.slf4j.simpleLogger.showDateTime=true",
		"-cp", strings.Join(zkJars, ":"),
		zkMain, z.conf)
	cmd.Dir = z.Dir
	p, err := startProcess(cmd, z.LogFile, z.logw)
	if err != nil {
		return nil, fmt.Errorf("run java: %w", err)
	}
	return p, nil
}

// waitReady polls `srvr` until the server says it serves, the JVM exits, or time runs out.
func (z *ZooKeeper) waitReady(ctx context.Context, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, zkReadyTimeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		// "Zookeeper version:" only comes from a server that serves requests; another
		// program on the port, or a server still loading its data, does not send it.
		out, err := z.FourLetterWord(ctx, "srvr")
		if err == nil && strings.Contains(out, "Zookeeper version:") {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("srvr answered %q", out)
		}
		last = err
		select {
		case <-exited:
			return fmt.Errorf("zookeeper exited before it served (last check: %v)", last)
		case <-ctx.Done():
			return fmt.Errorf("zookeeper did not serve at %s: %w (last check: %v)", z.Addr, ctx.Err(), last)
		case <-tick.C:
		}
	}
}

// FourLetterWord sends one of ZooKeeper's four-letter commands (ruok, srvr, stat, mntr...)
// and returns the answer. Under TLS it connects with the test client certificate.
func (z *ZooKeeper) FourLetterWord(ctx context.Context, word string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var conn net.Conn
	var err error
	if z.TLS {
		var cfg *tls.Config
		if cfg, err = z.ClientTLSConfig(); err != nil {
			return "", fmt.Errorf("%s to %s: %w", word, z.Addr, err)
		}
		d := tls.Dialer{Config: cfg}
		conn, err = d.DialContext(ctx, "tcp", z.Addr)
	} else {
		var d net.Dialer
		conn, err = d.DialContext(ctx, "tcp", z.Addr)
	}
	if err != nil {
		return "", fmt.Errorf("%s to %s: %w", word, z.Addr, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	if _, err := io.WriteString(conn, word); err != nil {
		return "", fmt.Errorf("%s to %s: %w", word, z.Addr, err)
	}
	// The server closes the connection after its answer.
	out, err := io.ReadAll(io.LimitReader(conn, 1<<20))
	if err != nil && len(out) == 0 {
		return "", fmt.Errorf("%s to %s: %w", word, z.Addr, err)
	}
	return string(out), nil
}

// ClientTLSConfig is a TLS config that trusts the test CA and presents the test client
// certificate; it is an error when the server does not use TLS.
func (z *ZooKeeper) ClientTLSConfig() (*tls.Config, error) {
	if !z.TLS {
		return nil, errors.New("zookeeper does not use TLS")
	}
	cert, err := tls.LoadX509KeyPair(z.ClientCert, z.ClientKey)
	if err != nil {
		return nil, fmt.Errorf("load client certificate: %w", err)
	}
	caPEM, err := os.ReadFile(z.CA)
	if err != nil {
		return nil, fmt.Errorf("read CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("no certificate in %s", z.CA)
	}
	cfg := &tls.Config{
		Certificates: []tls.Certificate{cert},
		RootCAs:      pool,
		ServerName:   z.ServerName,
		MinVersion:   tls.VersionTLS12,
	}
	if z.namedByCN {
		// Go reads no CN: the chain and the name are checked here.
		cfg.InsecureSkipVerify = true
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			leaf := cs.PeerCertificates[0]
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool}); err != nil {
				return err
			}
			if leaf.Subject.CommonName != z.ServerName {
				return fmt.Errorf("the server's certificate is CN=%s, not CN=%s", leaf.Subject.CommonName, z.ServerName)
			}
			return nil
		}
	}
	return cfg, nil
}

// Stop ends the server: SIGTERM, then SIGKILL after a grace time. The data stays for
// Start. Stopping a stopped server does nothing.
func (z *ZooKeeper) Stop() error { return z.srv.halt(false) }

// Kill ends the server at once with SIGKILL, as a crash would; Start brings it back.
func (z *ZooKeeper) Kill() error { return z.srv.halt(true) }

// writeCerts makes a throwaway CA with a server certificate that names localhost and no
// address (in the CN alone when byCN, else as DNS:localhost) and a client certificate,
// plus an unrelated CA with a client certificate and a server certificate of its own,
// and writes them as PEM under z.Dir/tls.
func (z *ZooKeeper) writeCerts(byCN bool) error {
	dir := filepath.Join(z.Dir, "tls")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("write certificates: %w", err)
	}
	z.ServerName, z.namedByCN = "localhost", byCN
	serverTmpl := func() *x509.Certificate {
		if byCN {
			return ServerTemplate(z.ServerName, nil)
		}
		return ServerTemplate("testenv zookeeper server", []string{z.ServerName})
	}
	ca, err := newCA("testenv zookeeper CA")
	if err != nil {
		return err
	}
	server, err := ca.issue(serverTmpl())
	if err != nil {
		return err
	}
	client, err := ca.issue(ClientTemplate("testenv zookeeper client"))
	if err != nil {
		return err
	}
	wrong, err := newCA("testenv unrelated CA")
	if err != nil {
		return err
	}
	wrongClient, err := wrong.issue(ClientTemplate("testenv zookeeper client"))
	if err != nil {
		return err
	}
	wrongServer, err := wrong.issue(serverTmpl())
	if err != nil {
		return err
	}
	z.CA = filepath.Join(dir, "ca.pem")
	z.ClientCert = filepath.Join(dir, "client.pem")
	z.ClientKey = filepath.Join(dir, "client-key.pem")
	z.WrongCA = filepath.Join(dir, "wrong-ca.pem")
	z.WrongClientCert = filepath.Join(dir, "wrong-client.pem")
	z.WrongClientKey = filepath.Join(dir, "wrong-client-key.pem")
	files := []struct {
		path string
		data []byte
	}{
		{z.CA, ca.certPEM},
		// ZooKeeper's PEM key store wants the key and the certificate in one file.
		{filepath.Join(dir, "server.pem"), append(append([]byte{}, server.keyPEM...), server.certPEM...)},
		{filepath.Join(dir, "wrong-server.pem"), append(append([]byte{}, wrongServer.keyPEM...), wrongServer.certPEM...)},
		{z.ClientCert, client.certPEM},
		{z.ClientKey, client.keyPEM},
		{z.WrongCA, wrong.certPEM},
		{z.WrongClientCert, wrongClient.certPEM},
		{z.WrongClientKey, wrongClient.keyPEM},
	}
	for _, f := range files {
		if err := os.WriteFile(f.path, f.data, 0o600); err != nil {
			return fmt.Errorf("write certificates: %w", err)
		}
	}
	return nil
}

// serverKeyPair is the key and certificate the server presents, as ZooKeeper reads them.
func (z *ZooKeeper) serverKeyPair() (tls.Certificate, error) {
	server := filepath.Join(z.Dir, "tls", "server.pem")
	return tls.LoadX509KeyPair(server, server)
}

// Impostor starts a proxy to z that presents, in place of the server's certificate,
// one with the same names from the unrelated CA (WrongCA), as a server given a
// certificate of another CA, or a machine in the middle, would. Behind it, it reaches z
// as the test client. It stops when the test ends.
func (z *ZooKeeper) Impostor(t testing.TB) *Proxy {
	t.Helper()
	if !z.TLS {
		t.Fatal("an impostor of a ZooKeeper without TLS")
	}
	wrong := filepath.Join(z.Dir, "tls", "wrong-server.pem")
	cert, err := tls.LoadX509KeyPair(wrong, wrong)
	if err != nil {
		t.Fatalf("impostor of ZooKeeper: %v", err)
	}
	dialTLS, err := z.ClientTLSConfig()
	if err != nil {
		t.Fatalf("impostor of ZooKeeper: %v", err)
	}
	return newProxy(t, z.Addr, func(p *Proxy) {
		p.acceptTLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		p.dialTLS = dialTLS
	})
}

// keyPair is a certificate and its private key, both PEM.
type keyPair struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte
	keyPEM  []byte
}

// newCA makes a self-signed CA valid for a day, which outlives any test run.
func newCA(name string) (*keyPair, error) { return newKeyPair(caTemplate(name, nil), nil) }

// issue makes a certificate from tmpl, which says what it is for and whom it names,
// signed by ca with a fresh key.
func (ca *keyPair) issue(tmpl *x509.Certificate) (*keyPair, error) { return newKeyPair(tmpl, ca) }

// ServerTemplate is the template of a TLS server's certificate: subject CN cn, and a
// subjectAltName of the DNS names and addresses given, none when there are none.
func ServerTemplate(cn string, dnsNames []string, ips ...net.IP) *x509.Certificate {
	return &x509.Certificate{
		Subject:     pkix.Name{CommonName: cn},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    dnsNames,
		IPAddresses: ips,
	}
}

// ClientTemplate is the template of a certificate for TLS client authentication.
func ClientTemplate(cn string) *x509.Certificate {
	return &x509.Certificate{
		Subject:     pkix.Name{CommonName: cn},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
}

// newKeyPair signs tmpl with a fresh ECDSA P-256 key, by parent or by itself when parent
// is nil. The key is PKCS#8 ("PRIVATE KEY"), the form ZooKeeper's PEM reader parses.
func newKeyPair(tmpl *x509.Certificate, parent *keyPair) (*keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("certificate %s: generate key: %w", tmpl.Subject.CommonName, err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("certificate %s: serial: %w", tmpl.Subject.CommonName, err)
	}
	tmpl.SerialNumber = serial
	// Unless tmpl says otherwise: valid for a day, back-dated a little, so that a
	// clock slightly off does not reject it.
	if tmpl.NotBefore.IsZero() {
		tmpl.NotBefore = time.Now().Add(-time.Hour)
	}
	if tmpl.NotAfter.IsZero() {
		tmpl.NotAfter = time.Now().Add(24 * time.Hour)
	}
	signer, signerKey := tmpl, key
	if parent != nil {
		signer, signerKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		return nil, fmt.Errorf("certificate %s: sign: %w", tmpl.Subject.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("certificate %s: %w", tmpl.Subject.CommonName, err)
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("certificate %s: marshal key: %w", tmpl.Subject.CommonName, err)
	}
	return &keyPair{
		cert:    cert,
		key:     key,
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8}),
	}, nil
}

// CA is a throwaway certificate authority, for a test that makes certificates of its
// own: a server certificate named or used in some way, a chain through another CA.
type CA struct{ kp *keyPair }

// NewCA makes a CA from tmpl (nil: a plain one named name), self-signed, valid for a day.
func NewCA(t testing.TB, name string, tmpl *x509.Certificate) *CA {
	t.Helper()
	kp, err := newKeyPair(caTemplate(name, tmpl), nil)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{kp}
}

// SubCA makes a CA from tmpl (nil: a plain one named name) signed by ca.
func (ca *CA) SubCA(t testing.TB, name string, tmpl *x509.Certificate) *CA {
	t.Helper()
	kp, err := ca.kp.issue(caTemplate(name, tmpl))
	if err != nil {
		t.Fatal(err)
	}
	return &CA{kp}
}

// caTemplate is tmpl made a CA's, or a plain CA's named name when tmpl is nil.
func caTemplate(name string, tmpl *x509.Certificate) *x509.Certificate {
	if tmpl == nil {
		tmpl = &x509.Certificate{Subject: pkix.Name{CommonName: name}, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign}
	}
	tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
	return tmpl
}

// CertPEM is the CA's certificate, PEM.
func (ca *CA) CertPEM() []byte { return ca.kp.certPEM }

// KeyPEM is the CA's key, PEM: for a self-signed server certificate, made as a CA.
func (ca *CA) KeyPEM() []byte { return ca.kp.keyPEM }

// Issue signs tmpl with a fresh key, valid for a day unless tmpl says otherwise, and
// returns the certificate and its key, PEM. ServerTemplate and ClientTemplate are
// what servers and clients usually get.
func (ca *CA) Issue(t testing.TB, tmpl *x509.Certificate) (certPEM, keyPEM []byte) {
	t.Helper()
	kp, err := ca.kp.issue(tmpl)
	if err != nil {
		t.Fatal(err)
	}
	return kp.certPEM, kp.keyPEM
}
