package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// termGrace is how long a server gets to shut down after SIGTERM before SIGKILL.
const termGrace = 5 * time.Second

// process is one run of a server the tests start: in its own process group, so
// that stopping it reaches every process it starts, with its output appended to
// a log file that follows it across restarts.
type process struct {
	pgid   int
	exited chan struct{}
	logf   *os.File
}

// startProcess starts cmd in its own process group, its output appended to
// logFile and copied to logw when logw is not nil. Of cmd.SysProcAttr only
// Pdeathsig is kept.
func startProcess(cmd *exec.Cmd, logFile string, logw io.Writer) (*process, error) {
	logf, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log: %w", err)
	}
	var out io.Writer = logf
	if logw != nil {
		out = io.MultiWriter(logf, logw)
	}
	cmd.Stdout, cmd.Stderr = out, out
	attr := &syscall.SysProcAttr{Setpgid: true}
	if cmd.SysProcAttr != nil {
		attr.Pdeathsig = cmd.SysProcAttr.Pdeathsig
	}
	cmd.SysProcAttr = attr
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	p := &process{pgid: cmd.Process.Pid, exited: make(chan struct{}), logf: logf}
	go func() {
		// The exit status of a server we stop ourselves says nothing useful.
		_ = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// stop ends every process of the group, SIGTERM first, and closes the log.
func (p *process) stop() error {
	return errors.Join(stopGroup(p.pgid, p.exited), p.logf.Close())
}

// stopGroup ends every process in the group: SIGTERM first so that a server can stop its children,
// SIGKILL for whatever is left after the grace time.
func stopGroup(pgid int, exited <-chan struct{}) error {
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(termGrace):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-exited
	}
	// The leader is reaped; a worker it did not wait for may still be in the group.
	deadline := time.Now().Add(termGrace)
	for groupAlive(pgid) {
		if time.Now().After(deadline) {
			return fmt.Errorf("processes of group %d survive SIGKILL", pgid)
		}
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// groupAlive tells whether any process of the group still exists.
func groupAlive(pgid int) bool {
	return syscall.Kill(-pgid, 0) == nil
}

// server is a server the tests stop, kill and start again on the same port.
type server struct {
	name    string        // for messages: "zookeeper", "gearmand"
	addr    func() string // where it listens
	logFile string
	// portTaken is what the server logs when another process holds its port.
	portTaken string
	// run starts one run of it; ready waits until that run serves, or exits.
	run   func() (*process, error)
	ready func(ctx context.Context, exited <-chan struct{}) error

	mu   sync.Mutex
	proc *process // nil while stopped
}

// start starts the server and waits until it serves. It fails, wrapping
// errPortTaken when the port was taken, when it is running or does not serve.
func (s *server) start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		return fmt.Errorf("start %s on %s: already running", s.name, s.addr())
	}
	p, err := s.run()
	if err != nil {
		return fmt.Errorf("start %s: %w", s.name, err)
	}
	if err := s.ready(ctx, p.exited); err != nil {
		if stopErr := p.stop(); stopErr != nil {
			err = errors.Join(err, stopErr)
		}
		if log, rerr := os.ReadFile(s.logFile); rerr == nil && bytes.Contains(log, []byte(s.portTaken)) {
			err = fmt.Errorf("%w: %w", errPortTaken, err)
		}
		return fmt.Errorf("start %s on %s: %w\n%s log (%s), last lines:\n%s", s.name, s.addr(), err, s.name, s.logFile, logTail(s.logFile))
	}
	s.proc = p
	return nil
}

// halt ends the server: SIGTERM then SIGKILL after a grace time, or with kill
// SIGKILL at once, as a crash would. Halting a stopped server does nothing.
func (s *server) halt(kill bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return nil
	}
	what := "stop"
	if kill {
		what = "kill"
		_ = syscall.Kill(-s.proc.pgid, syscall.SIGKILL)
	}
	err := s.proc.stop()
	s.proc = nil
	if err != nil {
		return fmt.Errorf("%s %s on %s: %w", what, s.name, s.addr(), err)
	}
	return nil
}

// waitServing asks probe every tick until it succeeds, the server's process
// exits, or timeout passes; the error names the server and its last answer.
func waitServing(ctx context.Context, name, addr string, timeout, every time.Duration, exited <-chan struct{},
	probe func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(every)
	defer tick.Stop()
	var last error
	for {
		if last = probe(ctx); last == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("%s exited before it served (last check: %v)", name, last)
		case <-ctx.Done():
			return fmt.Errorf("%s did not serve at %s: %w (last check: %v)", name, addr, ctx.Err(), last)
		case <-tick.C:
		}
	}
}

// serverDir checks that a server's program was found (bin is not empty; pkg is
// the Debian package that has it) and makes dir, its directory, absolute and
// present.
func serverDir(name, pkg, bin, dir string) (string, error) {
	if bin == "" {
		return "", fmt.Errorf("start %s: not installed (Debian package %s)", name, pkg)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("start %s in %s: %w", name, dir, err)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return "", fmt.Errorf("start %s: %w", name, err)
	}
	return abs, nil
}

// findProgram finds a program on PATH, or else at one of paths (a server's
// sbin, which a user's PATH may lack); "" when it is nowhere.
func findProgram(name string, paths []string) string {
	if path, err := exec.LookPath(name); err == nil {
		return path
	}
	for _, path := range paths {
		if fi, err := os.Stat(path); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return path
		}
	}
	return ""
}
