package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Glance is a standalone Glance (sqlite database, file store, no Keystone) listening on
// loopback.
type Glance struct {
	// Endpoint is the root URL, e.g. http://127.0.0.1:34567.
	Endpoint string
	// DataDir holds the config, the database, the image files and the log.
	DataDir string
	// CloudsFile is a clouds.yaml with one cloud, named Cloud, that reaches this Glance
	// with auth_type none and image_endpoint_override.
	CloudsFile string
	// Cloud is the name of the only cloud in CloudsFile.
	Cloud string
	// LogFile is everything glance-manage and glance-api wrote.
	LogFile string

	pgid int // process group of glance-api and its worker
}

// cloudName is the clouds.yaml entry written for a Glance.
const cloudName = "testenv"

const (
	// readyTimeout bounds the wait for glance-api to answer; it usually takes ~3 s, but
	// a port taken by someone else makes Glance retry binding for 30 s before it gives up.
	readyTimeout = 60 * time.Second
)

// errPortTaken marks a start that failed because another process bound the port first.
var errPortTaken = errors.New("port already in use")

// StartGlance writes a glance-api config under dir, creates the database and starts
// glance-api in its own process group. Output of Glance goes to dir/glance.log and, when
// logw is not nil, to logw as well. ctx bounds the start only; the returned stop function
// ends every process of this Glance and reports any that would not go away.
func StartGlance(ctx context.Context, dir string, logw io.Writer) (*Glance, func() error, error) {
	return startGlance(ctx, dir, logw, glanceSetup{})
}

// glanceSetup is what a Glance is started with beyond a standalone one.
type glanceSetup struct {
	// auth is a [keystone_authtoken] section, putting Glance behind Keystone;
	// without it Glance takes every request as the admin's.
	auth string
	// imports, when set, is how it takes images by interoperable import;
	// otherwise it offers Glance's default methods, with no plugin.
	imports *GlanceImportOptions
}

// startGlance is StartGlance with the setup.
func startGlance(ctx context.Context, dir string, logw io.Writer, setup glanceSetup) (*Glance, func() error, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("start glance in %s: %w", dir, err)
	}
	for _, sub := range []string{"images", "locks", "staging"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return nil, nil, fmt.Errorf("start glance: %w", err)
		}
	}
	g := &Glance{
		DataDir:    dir,
		CloudsFile: filepath.Join(dir, "clouds.yaml"),
		Cloud:      cloudName,
		LogFile:    filepath.Join(dir, "glance.log"),
	}
	logf, err := os.OpenFile(g.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, fmt.Errorf("start glance: open log: %w", err)
	}
	var out io.Writer = logf
	if logw != nil {
		out = io.MultiWriter(logf, logw)
	}

	conf := filepath.Join(dir, "glance-api.conf")
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			logf.Close()
			return nil, nil, fmt.Errorf("start glance: %w", err)
		}
		if err := os.WriteFile(conf, []byte(apiConfig(dir, port, setup)), 0o644); err != nil {
			logf.Close()
			return nil, nil, fmt.Errorf("start glance: write config: %w", err)
		}
		if attempt == 1 {
			if err := dbSync(ctx, conf, out); err != nil {
				logf.Close()
				return nil, nil, fmt.Errorf("start glance: %w\n%s", err, logTail(g.LogFile))
			}
		}
		g.Endpoint = "http://127.0.0.1:" + strconv.Itoa(port)
		stop, err := g.run(ctx, conf, out)
		if err == nil {
			clouds := fmt.Sprintf("clouds:\n  %s:\n    auth_type: none\n    image_endpoint_override: %s\n", g.Cloud, g.Endpoint)
			if err := os.WriteFile(g.CloudsFile, []byte(clouds), 0o644); err != nil {
				return nil, nil, errors.Join(fmt.Errorf("start glance: write clouds.yaml: %w", err), stop())
			}
			return g, sync.OnceValue(func() error {
				return errors.Join(stop(), logf.Close())
			}), nil
		}
		if attempt == 1 && errors.Is(err, errPortTaken) {
			continue
		}
		logf.Close()
		return nil, nil, fmt.Errorf("start glance on %s: %w\nglance log (%s), last lines:\n%s", g.Endpoint, err, g.LogFile, logTail(g.LogFile))
	}
}

// apiConfig is a glance-api.conf for a Glance that keeps everything under dir, set up
// as setup says.
func apiConfig(dir string, port int, setup glanceSetup) string {
	flavor := ""
	if setup.auth != "" {
		flavor = "keystone"
	}
	var defaults, sections string
	if setup.imports != nil {
		defaults, sections = importConfig(*setup.imports)
	}
	// The paste pipeline without a flavor is Debian's unauthenticated one: every request
	// runs as admin, which is what a test Glance wants. use_stderr with an empty log_file
	// keeps Glance out of the system log directory; the staging store and lock path
	// keep it out of the shared temporary and state directories.
	return fmt.Sprintf(`[DEFAULT]
bind_host = 127.0.0.1
bind_port = %[2]d
workers = 1
debug = false
use_stderr = true
log_file =
node_staging_uri = file://%[1]s/staging
%[5]s
[oslo_concurrency]
lock_path = %[1]s/locks

[paste_deploy]
flavor = %[3]s
config_file = /etc/glance/glance-api-paste.ini

[database]
connection = sqlite:///%[1]s/glance.sqlite

[glance_store]
stores = file
default_store = file
filesystem_store_datadir = %[1]s/images
%[4]s%[6]s`, dir, port, flavor, setup.auth, defaults, sections)
}

// dbSync creates Glance's database schema.
func dbSync(ctx context.Context, conf string, out io.Writer) error {
	cmd := exec.CommandContext(ctx, "glance-manage", "--config-file", conf, "db_sync")
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("glance-manage db_sync: %w", err)
	}
	return nil
}

// run starts glance-api and waits until it answers. On success it returns the function
// that stops it; on failure nothing is left running.
func (g *Glance) run(ctx context.Context, conf string, out io.Writer) (func() error, error) {
	cmd := exec.Command("glance-api", "--config-file", conf)
	cmd.Dir = g.DataDir
	cmd.Stdout, cmd.Stderr = out, out
	// Its own group, so one signal reaches the API process and the worker it forks.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start glance-api: %w", err)
	}
	g.pgid = cmd.Process.Pid
	exited := make(chan struct{})
	go func() {
		// The exit status of a process we stop ourselves says nothing useful.
		_ = cmd.Wait()
		close(exited)
	}()
	stop := sync.OnceValue(func() error { return stopGroup(g.pgid, exited) })

	if err := waitReady(ctx, g.Endpoint, exited); err != nil {
		if stopErr := stop(); stopErr != nil {
			err = errors.Join(err, stopErr)
		}
		if log, rerr := os.ReadFile(g.LogFile); rerr == nil && bindFailed(log) {
			err = fmt.Errorf("%w: %w", errPortTaken, err)
		}
		return nil, err
	}
	return stop, nil
}

// bindFailed tells whether glance-api gave up because its port was taken.
func bindFailed(log []byte) bool {
	return bytes.Contains(log, []byte("Could not bind")) || bytes.Contains(log, []byte("Address already in use"))
}

// waitReady polls the version document until Glance serves it, the process exits, or
// time runs out.
func waitReady(ctx context.Context, endpoint string, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	client := &http.Client{Timeout: 2 * time.Second}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if answersVersions(ctx, client, endpoint) {
			return nil
		}
		select {
		case <-exited:
			return errors.New("glance-api exited before it answered")
		case <-ctx.Done():
			return fmt.Errorf("glance-api did not answer at %s: %w", endpoint, ctx.Err())
		case <-tick.C:
		}
	}
}

// answersVersions tells whether a Glance answers GET /versions at endpoint; another
// program that grabbed the port would not serve that document.
func answersVersions(ctx context.Context, client *http.Client, endpoint string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint+"/versions", nil)
	if err != nil {
		return false
	}
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return err == nil && resp.StatusCode == http.StatusOK && bytes.Contains(body, []byte(`"versions"`))
}

// freePort asks the kernel for a loopback port that is free right now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// logTail returns the last lines of a log for an error message.
func logTail(path string) string {
	const max = 4 << 10
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	if len(data) > max {
		data = data[len(data)-max:]
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			data = data[i+1:]
		}
	}
	return strings.TrimRight(string(data), "\n")
}

// FreePort is a loopback port nothing listens on right now, for a test that
// needs a server that does not answer.
func FreePort(t testing.TB) int {
	t.Helper()
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}
