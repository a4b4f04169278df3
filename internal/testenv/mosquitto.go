package testenv

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// MosquittoOptions says what kind of MQTT broker a test wants.
type MosquittoOptions struct {
	// TLS makes the broker listen only for TLS, with a server certificate of a
	// test CA, and let in only the user Username with the password in
	// PasswordFile.
	TLS bool
	// ClientCert, under TLS, makes the broker also require a client
	// certificate signed by the test CA.
	ClientCert bool
}

// Mosquitto is an MQTT broker (Debian's mosquitto) on loopback, with its config,
// certificates, password file and log in one directory. Tests publish to it
// with mosquitto_pub, a client nobody here wrote.
type Mosquitto struct {
	// Host and Port are where it listens; Port stays the same across Stop and Start.
	Host string
	Port int
	// Addr is Host:Port, URL is mqtt://Addr, or mqtts://Addr under TLS.
	Addr string
	URL  string
	// Dir holds the config, the certificates, the password file and the log.
	Dir string
	// LogFile is everything the broker wrote, across restarts.
	LogFile string
	TLS     bool

	// Under TLS: the one user the broker lets in, its password, and a file
	// holding the password followed by a newline, as an operator writes one.
	Username, Password, PasswordFile string
	// Under TLS: the PEM file of the CA the server's certificate is from, and
	// with ClientCert a client certificate and key of that CA.
	CA, ClientCert, ClientKey string

	bin  string
	conf string
	logw io.Writer
	srv  server
}

const (
	// mqReadyTimeout bounds the wait for a started broker to listen; it does
	// within milliseconds, so the bound only keeps a wedged one from hanging the run.
	mqReadyTimeout = 30 * time.Second
	// mqPubTimeout bounds one run of mosquitto_pub.
	mqPubTimeout = 30 * time.Second
)

// mosquittoPaths are where Debian's mosquitto package puts the broker when
// PATH lacks the sbin directories, as it may for a non-root user.
var mosquittoPaths = []string{"/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto"}

// RequireMosquitto returns the path of the mosquitto broker once it and
// mosquitto_pub (and, for a password file, mosquitto_passwd) are installed.
// Otherwise the test is skipped, or fails when CI=true.
func RequireMosquitto(t testing.TB) string {
	t.Helper()
	bin := findMosquitto()
	if bin == "" {
		requirePart(t, "mosquitto (the MQTT broker)")
		return ""
	}
	for _, tool := range []string{"mosquitto_pub", "mosquitto_passwd"} {
		if RequireBinary(t, tool) == "" {
			return ""
		}
	}
	return bin
}

func findMosquitto() string { return findProgram("mosquitto", mosquittoPaths) }

// NewMosquitto starts an MQTT broker for the test and stops it when the test
// ends. It skips (or fails under CI) when mosquitto is not installed.
func NewMosquitto(t testing.TB, opts MosquittoOptions) *Mosquitto {
	t.Helper()
	if RequireMosquitto(t) == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, err := StartMosquitto(ctx, t.TempDir(), opts, nil)
	if err != nil {
		t.Fatal(err) // it says what it was starting and ends with the broker's log
	}
	t.Cleanup(func() {
		if err := m.Stop(); err != nil {
			t.Error(err)
		}
	})
	return m
}

// StartMosquitto writes a broker config (and under TLS the certificates and a
// password file) into dir, starts mosquitto on a free loopback port in its own
// process group, and waits until it listens. Its output goes to
// dir/mosquitto.log and, when logw is not nil, to logw too. ctx bounds the
// start only; the caller ends the broker with Stop.
func StartMosquitto(ctx context.Context, dir string, opts MosquittoOptions, logw io.Writer) (*Mosquitto, error) {
	bin := findMosquitto()
	dir, err := serverDir("mosquitto", "mosquitto", bin, dir)
	if err != nil {
		return nil, err
	}
	m := &Mosquitto{
		Host:    "127.0.0.1",
		Dir:     dir,
		LogFile: filepath.Join(dir, "mosquitto.log"),
		TLS:     opts.TLS,
		bin:     bin,
		conf:    filepath.Join(dir, "mosquitto.conf"),
		logw:    logw,
	}
	m.srv = server{name: "mosquitto", addr: func() string { return m.Addr }, logFile: m.LogFile,
		portTaken: "Address already in use", run: m.run, ready: m.waitReady}
	if opts.TLS {
		if err := m.writeSecrets(ctx, opts.ClientCert); err != nil {
			return nil, fmt.Errorf("start mosquitto: %w", err)
		}
	}
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, fmt.Errorf("start mosquitto: %w", err)
		}
		m.Port = port
		m.Addr = net.JoinHostPort(m.Host, strconv.Itoa(port))
		m.URL = "mqtt://" + m.Addr
		if m.TLS {
			m.URL = "mqtts://" + m.Addr
		}
		conf, err := m.config(opts)
		if err != nil {
			return nil, fmt.Errorf("start mosquitto: %w", err)
		}
		if err := os.WriteFile(m.conf, []byte(conf), 0o600); err != nil {
			return nil, fmt.Errorf("start mosquitto: write config: %w", err)
		}
		err = m.Start(ctx)
		if err == nil {
			return m, nil
		}
		// Another process may take the port between freePort and the broker binding it.
		if attempt == 1 && errors.Is(err, errPortTaken) {
			continue
		}
		return nil, err
	}
}

// config is a mosquitto.conf with one listener on loopback and nothing kept on disk.
func (m *Mosquitto) config(opts MosquittoOptions) (string, error) {
	// Started as root, mosquitto switches to the user "mosquitto", who cannot
	// read the test's files; naming the user it runs as keeps it as it is.
	u, err := user.Current()
	if err != nil {
		return "", fmt.Errorf("config: %w", err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "listener %d %s\n", m.Port, m.Host)
	fmt.Fprintf(&b, "user %s\n", u.Username)
	b.WriteString("persistence false\nlog_dest stderr\nlog_type error\nlog_type warning\nlog_type notice\nlog_type information\nconnection_messages true\n")
	if !m.TLS {
		b.WriteString("allow_anonymous true\n")
		return b.String(), nil
	}
	tls := filepath.Join(m.Dir, "tls")
	fmt.Fprintf(&b, "allow_anonymous false\npassword_file %s\n", filepath.Join(m.Dir, "passwd"))
	fmt.Fprintf(&b, "cafile %s\ncertfile %s\nkeyfile %s\n", m.CA, filepath.Join(tls, "server.pem"), filepath.Join(tls, "server-key.pem"))
	fmt.Fprintf(&b, "require_certificate %t\n", opts.ClientCert)
	return b.String(), nil
}

// writeSecrets makes a throwaway CA with a server certificate (for 127.0.0.1
// and localhost), with clientCert a client certificate too, and a password
// file with one user and a random password.
func (m *Mosquitto) writeSecrets(ctx context.Context, clientCert bool) error {
	dir := filepath.Join(m.Dir, "tls")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("write certificates: %w", err)
	}
	ca, err := newCA("testenv mosquitto CA")
	if err != nil {
		return err
	}
	srv, err := ca.issue(ServerTemplate("127.0.0.1", []string{"localhost"}, net.IPv4(127, 0, 0, 1), net.IPv6loopback))
	if err != nil {
		return err
	}
	m.CA = filepath.Join(dir, "ca.pem")
	type file struct {
		path string
		data []byte
	}
	files := []file{
		{m.CA, ca.certPEM},
		{filepath.Join(dir, "server.pem"), srv.certPEM},
		{filepath.Join(dir, "server-key.pem"), srv.keyPEM},
	}
	if clientCert {
		client, err := ca.issue(ClientTemplate("testenv mosquitto client"))
		if err != nil {
			return err
		}
		m.ClientCert = filepath.Join(dir, "client.pem")
		m.ClientKey = filepath.Join(dir, "client-key.pem")
		files = append(files, file{m.ClientCert, client.certPEM}, file{m.ClientKey, client.keyPEM})
	}
	for _, f := range files {
		if err := os.WriteFile(f.path, f.data, 0o600); err != nil {
			return fmt.Errorf("write certificates: %w", err)
		}
	}

	secret := make([]byte, 12)
	if _, err := rand.Read(secret); err != nil {
		return fmt.Errorf("password: %w", err)
	}
	m.Username, m.Password = "nodepool", hex.EncodeToString(secret)
	m.PasswordFile = filepath.Join(m.Dir, "client-password")
	if err := os.WriteFile(m.PasswordFile, []byte(m.Password+"\n"), 0o600); err != nil {
		return fmt.Errorf("write password file: %w", err)
	}
	// mosquitto keeps only hashes; its own tool writes them.
	passwd := filepath.Join(m.Dir, "passwd")
	cmd := exec.CommandContext(ctx, "mosquitto_passwd", "-c", "-b", passwd, m.Username, m.Password)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("mosquitto_passwd: %w: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

// Start starts the broker (again, after Stop or Kill) on its port and waits until
// it listens. A restarted broker knows no clients and no subscriptions. It fails
// when the broker is running.
func (m *Mosquitto) Start(ctx context.Context) error { return m.srv.start(ctx) }

// Stop ends the broker: SIGTERM, then SIGKILL after a grace time; its clients see
// their connection close. Stopping a stopped broker does nothing.
func (m *Mosquitto) Stop() error { return m.srv.halt(false) }

// Kill ends the broker at once with SIGKILL, as a crash would.
func (m *Mosquitto) Kill() error { return m.srv.halt(true) }

func (m *Mosquitto) run() (*process, error) {
	// Without -d it stays in the foreground, so that we can wait for it and stop it.
	return startProcess(exec.Command(m.bin, "-c", m.conf), m.LogFile, m.logw)
}

// waitReady waits until the broker accepts connections, it exits, or time runs
// out. It logs "running" once its listener is open.
func (m *Mosquitto) waitReady(ctx context.Context, exited <-chan struct{}) error {
	return waitServing(ctx, "mosquitto", m.Addr, mqReadyTimeout, 20*time.Millisecond, exited, func(ctx context.Context) error {
		log, err := os.ReadFile(m.LogFile)
		if err != nil || !bytes.Contains(log[currentRun(log):], []byte(" running")) {
			return errors.New("its log does not say it runs")
		}
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", m.Addr)
		if err == nil {
			conn.Close()
		}
		return err
	})
}

// currentRun is where the current run's output starts in the broker's log:
// at its last "starting" line, so that a restart does not take the previous
// run's "running" for its own; the end of the log before that line is written.
// It looks at the very bytes it is given, never at the file again, which may
// have changed since.
func currentRun(log []byte) int {
	if i := bytes.LastIndex(log, []byte(" starting")); i >= 0 {
		return i
	}
	return len(log)
}

// Publish sends payload as one message to topic with mosquitto_pub, as
// whoever may publish to the broker would: under TLS with the test user and
// password (and client certificate). It fails the test when mosquitto_pub does.
func (m *Mosquitto) Publish(t testing.TB, topic string, payload []byte) {
	t.Helper()
	m.publish(t, topic, payload, "-s")
}

// PublishLines sends every line as a message of its own to topic, in order,
// from one mosquitto_pub.
func (m *Mosquitto) PublishLines(t testing.TB, topic string, lines []string) {
	t.Helper()
	for _, l := range lines {
		if strings.ContainsAny(l, "\r\n") {
			t.Fatalf("PublishLines: a message holds a line break: %q", l)
		}
	}
	m.publish(t, topic, []byte(strings.Join(lines, "\n")+"\n"), "-l")
}

func (m *Mosquitto) publish(t testing.TB, topic string, stdin []byte, mode string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), mqPubTimeout)
	defer cancel()
	cmd := m.PubCommand(ctx, "-t", topic, "-q", "1", mode)
	cmd.Stdin = bytes.NewReader(stdin)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mosquitto_pub -t %s: %v: %s\nbroker log, last lines:\n%s", topic, err, bytes.TrimSpace(out), logTail(m.LogFile))
	}
}

// PubCommand is mosquitto_pub aimed at this broker, logged in as the test user
// under TLS, with args added; it runs directly, without a shell.
func (m *Mosquitto) PubCommand(ctx context.Context, args ...string) *exec.Cmd {
	base := []string{"-h", m.Host, "-p", strconv.Itoa(m.Port)}
	if m.TLS {
		base = append(base, "--cafile", m.CA, "-u", m.Username, "-P", m.Password)
		if m.ClientCert != "" {
			base = append(base, "--cert", m.ClientCert, "--key", m.ClientKey)
		}
	}
	return exec.CommandContext(ctx, "mosquitto_pub", append(base, args...)...)
}
