package main

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// TestMain lets a test run this binary's main as a child process, so the daemon
// can be stopped with a real SIGTERM.
func TestMain(m *testing.M) {
	if os.Getenv("NODEPOOL_BUILDER_TEST_MAIN") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// syncBuffer is a bytes.Buffer safe for a child's output and the test's reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitFor polls cond until it holds or the timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool, log func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s\ndaemon log:\n%s", what, log())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestDaemonUploadsAsBuildsArriveAndStopsOnSIGTERM(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	e.writeConfig("    poll-interval: 1\n")
	e.addBuild(e.makeImage(1), zuultest.BuildSpec{})

	cmd := exec.Command(os.Args[0], "-c", e.cfgPath)
	cmd.Env = append(os.Environ(), "NODEPOOL_BUILDER_TEST_MAIN=1")
	var logs syncBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-exited
		}
	})

	ready := func(n int) func() bool {
		return func() bool {
			count := 0
			for _, row := range e.uploadsJSON() {
				if row.State == "ready" {
					count++
				}
			}
			return count == n && len(e.images("cloud-q")) == n/2 && len(e.images("cloud-r")) == n/2
		}
	}
	waitFor(t, 60*time.Second, "the first build's uploads", ready(2), logs.String)

	// A second instance is refused while the daemon runs.
	if r := e.run("--once"); r.code != exitLocked {
		t.Fatalf("second builder exited %d, want %d: %s", r.code, exitLocked, r.stderr)
	}

	// New builds are picked up on the next poll and rotated.
	e.addBuild(e.makeImage(2), zuultest.BuildSpec{})
	waitFor(t, 60*time.Second, "the second build's uploads", ready(4), logs.String)
	e.addBuild(e.makeImage(3), zuultest.BuildSpec{})
	waitFor(t, 60*time.Second, "rotation to the third build", func() bool {
		builds := e.buildsJSON()
		return ready(4)() && len(builds) == 2 && builds[0].State == "ready"
	}, logs.String)

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("daemon exited with %v after SIGTERM\n%s", err, logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("daemon did not stop within 30s of SIGTERM\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "msg=stopped") {
		t.Errorf("daemon did not log a clean stop:\n%s", logs.String())
	}
}
