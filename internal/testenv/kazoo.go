package testenv

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// kazooPython is the interpreter that can import Debian's python3-kazoo; a python3 found
// first on PATH (pyenv, a venv) usually cannot.
const kazooPython = "/usr/bin/python3"

// kazooPreamble connects a KazooClient named zk before the test's script runs, from the
// TESTENV_ZK_* variables RunKazoo sets, and closes it when the script ends. kazoo retries
// a failed connection until start times out and only logs why, so its warnings go to
// stderr: that is where a refused certificate shows.
const kazooPreamble = `import atexit, logging, os, sys
from kazoo.client import KazooClient
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
_e = os.environ
_tls = _e.get("TESTENV_ZK_TLS") == "1"
zk = KazooClient(
    hosts=_e["TESTENV_ZK_HOSTS"],
    timeout=float(_e["TESTENV_ZK_TIMEOUT"]),
    use_ssl=_tls,
    verify_certs=True,
    ca=_e.get("TESTENV_ZK_CA") or None,
    certfile=_e.get("TESTENV_ZK_CERT") or None,
    keyfile=_e.get("TESTENV_ZK_KEY") or None,
)
zk.start(timeout=float(_e["TESTENV_ZK_TIMEOUT"]))
atexit.register(lambda: (zk.stop(), zk.close()))
`

// KazooConn says how a kazoo script connects to ZooKeeper.
type KazooConn struct {
	// Hosts is kazoo's host list: "host:port[,host:port...][/chroot]".
	Hosts string
	// TLS connects with TLS, verifying the server against CA and presenting Cert/Key.
	TLS           bool
	CA, Cert, Key string
	// Timeout bounds connecting (kazoo's start) and is the session timeout; 0 means 10 s.
	Timeout time.Duration
}

// KazooConn is how to reach this server as the test client, with the test CA and client
// certificate under TLS.
func (z *ZooKeeper) KazooConn() KazooConn {
	c := KazooConn{Hosts: z.Addr, TLS: z.TLS}
	if z.TLS {
		c.CA, c.Cert, c.Key = z.CA, z.ClientCert, z.ClientKey
	}
	return c
}

// Kazoo runs script with Python's kazoo, an independent ZooKeeper client, connected to
// this server as the variable zk; args are sys.argv[1:]. It returns what the script
// printed, and fails the test, showing stderr, when the script fails.
func (z *ZooKeeper) Kazoo(t testing.TB, script string, args ...string) string {
	t.Helper()
	RequireKazoo(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := RunKazoo(ctx, z.KazooConn(), script, args...)
	if err != nil {
		t.Fatalf("kazoo script against %s: %v", z.Addr, err)
	}
	return out
}

// RunKazoo runs script as Kazoo does, connected as c says, and returns its stdout; the
// error carries stderr. It does not check that kazoo is installed: see RequireKazoo.
func RunKazoo(ctx context.Context, c KazooConn, script string, args ...string) (string, error) {
	cmd := kazooCommand(ctx, c, script, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kazoo script (hosts %s, tls %v): %w\nstderr:\n%s", c.Hosts, c.TLS, err, strings.TrimRight(stderr.String(), "\n"))
	}
	return stdout.String(), nil
}

// kazooCommand is the command that runs script connected as c says, in its
// own process group.
func kazooCommand(ctx context.Context, c KazooConn, script string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, kazooPython, append([]string{"-c", kazooPreamble + script}, args...)...)
	cmd.Env = append(append(os.Environ(), c.env()...),
		// Unbuffered, so what a killed script printed is not lost.
		"PYTHONUNBUFFERED=1",
	)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd
}

// env is how a Python script finds the connection: the TESTENV_ZK_* variables.
func (c KazooConn) env() []string {
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	tlsFlag := "0"
	if c.TLS {
		tlsFlag = "1"
	}
	return []string{
		"TESTENV_ZK_HOSTS=" + c.Hosts,
		"TESTENV_ZK_TIMEOUT=" + strconv.FormatFloat(timeout.Seconds(), 'f', -1, 64),
		"TESTENV_ZK_TLS=" + tlsFlag,
		"TESTENV_ZK_CA=" + c.CA,
		"TESTENV_ZK_CERT=" + c.Cert,
		"TESTENV_ZK_KEY=" + c.Key,
	}
}

// kazooImportable tells, once per test binary, whether kazooPython can import kazoo.
var kazooImportable = sync.OnceValue(func() bool {
	return exec.Command(kazooPython, "-c", "import kazoo.client").Run() == nil
})

// RequireKazoo skips the test, or fails it when CI=true, unless /usr/bin/python3 can
// import kazoo.
func RequireKazoo(t testing.TB) {
	t.Helper()
	if !kazooImportable() {
		requirePart(t, "python3-kazoo (kazoo for "+kazooPython+")")
	}
}

// KazooScript is a kazoo script that runs alongside the test, such as a Python
// builder holding a lock: it reads lines the test sends and prints lines the
// test waits for.
type KazooScript struct {
	t      testing.TB
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr bytes.Buffer
	exited chan struct{}
	err    error
}

// StartKazoo starts script as Kazoo does, without waiting for it to end. The
// script ends when the test does, if not before.
func StartKazoo(t testing.TB, c KazooConn, script string, args ...string) *KazooScript {
	t.Helper()
	RequireKazoo(t)
	k := &KazooScript{t: t, lines: make(chan string, 100), exited: make(chan struct{})}
	k.cmd = kazooCommand(context.Background(), c, script, args...)
	k.cmd.Stderr = &k.stderr
	var err error
	if k.stdin, err = k.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := k.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := k.cmd.Start(); err != nil {
		t.Fatalf("start kazoo script: %v", err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			k.lines <- sc.Text()
		}
		k.err = k.cmd.Wait()
		close(k.exited)
	}()
	t.Cleanup(func() {
		k.stdin.Close()
		select {
		case <-k.exited:
		case <-time.After(10 * time.Second):
			syscall.Kill(-k.cmd.Process.Pid, syscall.SIGKILL)
			<-k.exited
		}
	})
	return k
}

// Expect waits until the script prints want as a line, and fails the test when
// it prints something else, exits, or takes longer than timeout.
func (k *KazooScript) Expect(want string, timeout time.Duration) {
	k.t.Helper()
	select {
	case line := <-k.lines:
		if line != want {
			k.t.Fatalf("kazoo script printed %q, want %q", line, want)
		}
	case <-k.exited:
		k.t.Fatalf("kazoo script exited (%v) before it printed %q\nstderr:\n%s", k.err, want, k.stderr.String())
	case <-time.After(timeout):
		k.t.Fatalf("kazoo script did not print %q within %s", want, timeout)
	}
}

// Send writes a line to the script's stdin.
func (k *KazooScript) Send(line string) {
	k.t.Helper()
	if _, err := io.WriteString(k.stdin, line+"\n"); err != nil {
		k.t.Fatalf("write to kazoo script: %v", err)
	}
}

// kazooHandshake opens a TLS connection to the first of TESTENV_ZK_HOSTS with kazoo's
// own connection function, as a KazooClient does before it speaks ZooKeeper, and says
// whether the server's certificate passed kazoo's checks. It needs no ZooKeeper behind.
const kazooHandshake = `import os, socket, ssl, sys
from kazoo.handlers.utils import create_tcp_connection
e = os.environ
host, _, port = e["TESTENV_ZK_HOSTS"].split("/")[0].split(",")[0].rpartition(":")
try:
    s = create_tcp_connection(socket, (host.strip("[]"), int(port)), timeout=float(e["TESTENV_ZK_TIMEOUT"]),
        use_ssl=True, verify_certs=True, ca=e["TESTENV_ZK_CA"],
        certfile=e.get("TESTENV_ZK_CERT") or None, keyfile=e.get("TESTENV_ZK_KEY") or None)
except ssl.SSLError as err:
    print(err, file=sys.stderr)
    sys.exit(3)
s.close()
`

// ErrKazooRefused is wrapped by KazooHandshake's error when kazoo refused the server's
// certificate, or the TLS handshake failed for another reason.
var ErrKazooRefused = errors.New("kazoo refused the TLS handshake")

// KazooHandshake makes the TLS handshake kazoo makes, as nodepool configures it
// (use_ssl, verify_certs, ca, certfile, keyfile), with the first server of c.Hosts,
// which need not be ZooKeeper. It returns nil when kazoo accepted the server's
// certificate, an error wrapping ErrKazooRefused, with OpenSSL's reason, when it did
// not, and another error when the script could not run. It does not check that kazoo
// is installed: see RequireKazoo.
func KazooHandshake(ctx context.Context, c KazooConn) error {
	cmd := exec.CommandContext(ctx, kazooPython, "-c", kazooHandshake)
	cmd.Env = append(os.Environ(), c.env()...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == 3 {
		return fmt.Errorf("%w with %s: %s", ErrKazooRefused, c.Hosts, strings.TrimSpace(stderr.String()))
	}
	if err != nil {
		return fmt.Errorf("kazoo's TLS handshake with %s: %w\nstderr:\n%s", c.Hosts, err, strings.TrimRight(stderr.String(), "\n"))
	}
	return nil
}
