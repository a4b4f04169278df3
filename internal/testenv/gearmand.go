package testenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Gearmand is a gearman job server (Debian's gearmand) on loopback, with its log and pid
// file in one directory. Tests talk to it with their own worker and with the `gearman`
// and `gearadmin` commands, clients nobody here wrote.
type Gearmand struct {
	// Host and Port are where it listens; Port stays the same across Stop or Kill and Start.
	Host string
	Port int
	// Addr is Host:Port.
	Addr string
	// Dir holds the log and the pid file.
	Dir string
	// LogFile is everything the server wrote, across restarts.
	LogFile string

	bin  string
	logw io.Writer
	srv  server
}

const (
	// gmReadyTimeout bounds the wait for a started gearmand to answer; it listens within
	// milliseconds, but after a kill it may retry binding its port for a few seconds.
	gmReadyTimeout = 30 * time.Second
)

// gearmandPaths are where Debian's gearman-job-server puts gearmand when PATH lacks the
// sbin directories, as it may for a non-root user.
var gearmandPaths = []string{"/usr/sbin/gearmand", "/usr/local/sbin/gearmand"}

// RequireGearmand returns the path of gearmand, found on PATH or in sbin. When it is not
// installed the test is skipped, or fails when CI=true.
func RequireGearmand(t testing.TB) string {
	t.Helper()
	if path := findGearmand(); path != "" {
		return path
	}
	requirePart(t, "gearmand (gearman-job-server)")
	return ""
}

func findGearmand() string { return findProgram("gearmand", gearmandPaths) }

// NewGearmand starts a gearmand for the test and stops it when the test ends. It skips
// (or fails under CI) when gearmand is not installed.
func NewGearmand(t testing.TB) *Gearmand {
	t.Helper()
	if RequireGearmand(t) == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g, err := StartGearmand(ctx, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err) // it says what it was starting and ends with the server's log
	}
	t.Cleanup(func() {
		if err := g.Stop(); err != nil {
			t.Error(err)
		}
	})
	return g
}

// StartGearmand starts gearmand on a free loopback port in its own process group, with
// its log and pid file in dir, and waits until it answers. Its output also goes to logw
// when logw is not nil. ctx bounds the start only; the caller ends the server with Stop.
func StartGearmand(ctx context.Context, dir string, logw io.Writer) (*Gearmand, error) {
	bin := findGearmand()
	dir, err := serverDir("gearmand", "gearman-job-server", bin, dir)
	if err != nil {
		return nil, err
	}
	g := &Gearmand{
		Host:    "127.0.0.1",
		Dir:     dir,
		LogFile: filepath.Join(dir, "gearmand.log"),
		bin:     bin,
		logw:    logw,
	}
	// gearmand retries a taken port and logs "Timeout occurred when calling bind()".
	g.srv = server{name: "gearmand", addr: func() string { return g.Addr }, logFile: g.LogFile,
		portTaken: "calling bind()", run: g.run, ready: g.waitReady}
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, fmt.Errorf("start gearmand: %w", err)
		}
		g.Port = port
		g.Addr = net.JoinHostPort(g.Host, strconv.Itoa(port))
		err = g.Start(ctx)
		if err == nil {
			return g, nil
		}
		// Another process may take the port between freePort and gearmand binding it.
		if attempt == 1 && errors.Is(err, errPortTaken) {
			continue
		}
		return nil, err
	}
}

// Start starts gearmand (again, after Stop or Kill) on its port and waits until it
// answers. A restarted gearmand knows no jobs and no workers: its queue is in memory.
// It fails when the server is running.
func (g *Gearmand) Start(ctx context.Context) error { return g.srv.start(ctx) }

// run starts gearmand in the foreground.
func (g *Gearmand) run() (*process, error) {
	// Without --daemon it stays in the foreground, so we can wait for it and kill it.
	// --log-file=stderr puts its log in our file; the pid file is a throwaway one, not
	// /var/gearmand.pid; an empty config file keeps a host's /etc/gearmand.conf out.
	cmd := exec.Command(g.bin,
		"--listen="+g.Host,
		"--port="+strconv.Itoa(g.Port),
		"--config-file=/dev/null",
		"--log-file=stderr",
		"--verbose=INFO",
		"--pid-file="+filepath.Join(g.Dir, "gearmand.pid"))
	cmd.Dir = g.Dir
	return startProcess(cmd, g.LogFile, g.logw)
}

// waitReady polls the admin `status` command until it answers, gearmand exits, or time
// runs out.
func (g *Gearmand) waitReady(ctx context.Context, exited <-chan struct{}) error {
	// Only a gearman server ends the status answer with a "." line.
	return waitServing(ctx, "gearmand", g.Addr, gmReadyTimeout, 50*time.Millisecond, exited, func(ctx context.Context) error {
		_, err := g.Status(ctx)
		return err
	})
}

// FunctionStatus is one line of the admin `status` answer.
type FunctionStatus struct {
	Function string
	// Total is the jobs queued or running, Running those assigned to a worker, Workers
	// the connected workers that registered the function.
	Total, Running, Workers int
}

// Status sends the text admin command `status` and returns its lines, keyed by function.
// gearmand keeps listing a function that nobody serves any more, with 0 workers.
func (g *Gearmand) Status(ctx context.Context) (map[string]FunctionStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", g.Addr)
	if err != nil {
		return nil, fmt.Errorf("gearmand status at %s: %w", g.Addr, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	if _, err := io.WriteString(conn, "status\n"); err != nil {
		return nil, fmt.Errorf("gearmand status at %s: %w", g.Addr, err)
	}
	out := map[string]FunctionStatus{}
	sc := bufio.NewScanner(conn)
	for sc.Scan() {
		line := sc.Text()
		if line == "." {
			return out, nil
		}
		f := strings.Split(line, "\t")
		if len(f) != 4 {
			return nil, fmt.Errorf("gearmand status at %s: bad line %q", g.Addr, line)
		}
		var s FunctionStatus
		s.Function = f[0]
		for i, p := range []*int{&s.Total, &s.Running, &s.Workers} {
			if *p, err = strconv.Atoi(f[i+1]); err != nil {
				return nil, fmt.Errorf("gearmand status at %s: bad line %q", g.Addr, line)
			}
		}
		out[s.Function] = s
	}
	err = sc.Err()
	if err == nil {
		err = io.ErrUnexpectedEOF
	}
	return nil, fmt.Errorf("gearmand status at %s: %w", g.Addr, err)
}

// Command is the gearman command-line tool name ("gearman" or "gearadmin") aimed at
// this server: `name -h HOST -p PORT args...`, run directly, without a shell.
func (g *Gearmand) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, name, append([]string{"-h", g.Host, "-p", strconv.Itoa(g.Port)}, args...)...)
}

// Stop ends the server: SIGTERM, then SIGKILL after a grace time. Its jobs are lost.
// Stopping a stopped server does nothing.
func (g *Gearmand) Stop() error { return g.srv.halt(false) }

// Kill ends the server at once with SIGKILL, as a crash would; Start brings it back on
// the same port.
func (g *Gearmand) Kill() error { return g.srv.halt(true) }

// Restart stops the server and starts it again on the same port.
func (g *Gearmand) Restart(ctx context.Context) error {
	if err := g.Stop(); err != nil {
		return err
	}
	return g.Start(ctx)
}
