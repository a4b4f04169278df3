package dib

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// outcome is how a build process ended.
type outcome struct {
	ExitCode  int  // the process's exit code; minus the signal number when a signal ended it, as Python reports it
	TimedOut  bool // build-timeout passed and the process group was killed
	Cancelled bool // ctx ended and the process group was killed
}

// process is a started build process, the leader of its own process group.
type process struct {
	cmd    *exec.Cmd
	exited chan struct{}
	err    error // from Wait, valid once exited is closed
}

// start runs inv with its output going to out. The process leads a new process
// group so that a timeout can end DIB and everything it started (chroots,
// qemu-img, ...) with one signal. out should be an *os.File: the child then
// writes to it directly, so nothing is buffered here whatever DIB prints.
func start(inv invocation, out io.Writer) (*process, error) {
	cmd := exec.Command(inv.Args[0], inv.Args[1:]...)
	cmd.Env = inv.Env
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", inv.Args[0], err)
	}
	p := &process{cmd: cmd, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// pid is the process's pid, which is also its process group id.
func (p *process) pid() int { return p.cmd.Process.Pid }

// wait waits until the process exits, timeout passes (0: no timeout) or ctx ends.
// In the last two cases the whole process group gets SIGTERM, then SIGKILL after
// grace, and no process of the group is left when wait returns; one that
// survives SIGKILL is reported as an error.
func (p *process) wait(ctx context.Context, timeout, grace time.Duration) (outcome, error) {
	var timer <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		timer = t.C
	}
	var o outcome
	select {
	case <-p.exited:
	case <-timer:
		o.TimedOut = true
	case <-ctx.Done():
		o.Cancelled = true
	}
	var stopErr error
	if o.TimedOut || o.Cancelled {
		stopErr = stopGroup(p.pid(), grace)
	}
	<-p.exited
	o.ExitCode = exitCode(p.cmd.ProcessState)
	if p.err != nil && p.cmd.ProcessState == nil {
		return o, errors.Join(fmt.Errorf("wait for %s: %w", p.cmd.Path, p.err), stopErr)
	}
	return o, stopErr
}

// stopGroup ends every process in the group: SIGTERM first so that DIB can unmount
// what it mounted, SIGKILL for whatever is left after grace. The leader may be
// gone while children it started still run in its group, so it waits for the
// group, not the leader.
func stopGroup(pgid int, grace time.Duration) error {
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	for groupAlive(pgid) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	deadline = time.Now().Add(killWait)
	for groupAlive(pgid) {
		if time.Now().After(deadline) {
			return fmt.Errorf("stop process group %d: processes survive SIGKILL", pgid)
		}
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// killWait bounds the wait for processes to die after SIGKILL; only a process
// stuck in the kernel (e.g. on a hung mount) outlives it.
const killWait = 10 * time.Second

// groupAlive tells whether a process of the group is still running. Zombies do
// not count: an orphan's zombie lingers until init reaps it, and it runs nothing.
func groupAlive(pgid int) bool {
	if syscall.Kill(-pgid, 0) != nil {
		return false
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return true // no /proc: trust kill(2)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(data, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(data[i+1:]))
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		if pg, err := strconv.Atoi(f[2]); err == nil && pg == pgid && pid > 0 {
			return true
		}
	}
	return false
}

// exitCode reports a finished process's exit status as nodepool's log shows it:
// the exit code, or minus the signal number when a signal ended the process.
func exitCode(ps *os.ProcessState) int {
	if ps == nil {
		return -1
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return -int(ws.Signal())
	}
	return ps.ExitCode()
}
