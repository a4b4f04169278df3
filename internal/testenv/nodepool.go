package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// nodepoolPython is the interpreter that can import the Debian packages nodepool
// needs; a python3 found first on PATH (pyenv, a venv) usually cannot.
const nodepoolPython = "/usr/bin/python3"

// nodepoolPBRVersion is the version pbr gives the vendored commit, 68 commits after
// the 10.0.0 tag. pbr reads a version from an installed package's metadata or from
// git; the vendored tree has neither, so without PBR_VERSION importing nodepool fails.
const nodepoolPBRVersion = "10.0.1.dev68"

// nodepoolStopGrace is how long nodepool-builder gets to shut down after SIGINT: it
// waits for its build workers, which check for shutdown between builds only.
const nodepoolStopGrace = 15 * time.Second

// nodepoolTree finds third_party/nodepool, the vendored nodepool, from the test's
// working directory (its package directory) by walking up to go.mod.
var nodepoolTree = sync.OnceValues(func() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find the vendored nodepool: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			tree := filepath.Join(dir, "third_party", "nodepool")
			if _, err := os.Stat(filepath.Join(tree, "nodepool", "builder.py")); err != nil {
				return "", fmt.Errorf("find the vendored nodepool: %w", err)
			}
			return tree, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("find the vendored nodepool: no go.mod above the working directory")
		}
		dir = parent
	}
})

// nodepoolEnv is the environment nodepool runs in: the test's, with the vendored tree
// importable, then env, whose entries win.
func nodepoolEnv(tree string, env []string) []string {
	return append(append(os.Environ(),
		"PYTHONPATH="+tree,
		"PBR_VERSION="+nodepoolPBRVersion,
		// Unbuffered, so that a log line is in the output when it is logged and what a
		// killed nodepool wrote is not lost.
		"PYTHONUNBUFFERED=1",
		// No __pycache__ written into the source tree.
		"PYTHONDONTWRITEBYTECODE=1",
	), env...)
}

// nodepoolImportCheck imports what the harness runs and loads every driver, as
// loadConfig does: a driver whose SDK is missing fails the import.
const nodepoolImportCheck = `import nodepool.config, nodepool.cmd.config_validator, nodepool.cmd.builder
from nodepool.driver import Drivers
Drivers.load()
`

// nodepoolImportable tells, once per test binary, why nodepoolPython cannot import the
// vendored nodepool, or nil when it can.
var nodepoolImportable = sync.OnceValue(func() error {
	tree, err := nodepoolTree()
	if err != nil {
		return err
	}
	cmd := exec.Command(nodepoolPython, "-c", nodepoolImportCheck)
	cmd.Env = nodepoolEnv(tree, nil)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %s", err, lastLine(string(out)))
	}
	return nil
})

// RequireNodepool skips the test, or fails it when CI=true, unless /usr/bin/python3
// can import the vendored nodepool's config code, its builder and every driver. A
// vendored tree that cannot be found fails the test: it is part of the repository.
func RequireNodepool(t testing.TB) {
	t.Helper()
	if _, err := nodepoolTree(); err != nil {
		t.Fatal(err)
	}
	if err := nodepoolImportable(); err != nil {
		requirePart(t, "nodepool's Python dependencies for "+nodepoolPython+" ("+err.Error()+")")
	}
}

// NodepoolError is nodepool's Python code failing.
type NodepoolError struct {
	// What is what ran, e.g. "loadConfig(/path/nodepool.yaml)".
	What string
	// Last is the last line it wrote: for an exception, the traceback's last line,
	// e.g. "KeyError: 'debian-bookworm'".
	Last string
	// Output is everything it wrote to stderr (its log).
	Output string
	// Err is how the process ended.
	Err error
}

func (e *NodepoolError) Error() string {
	return fmt.Sprintf("nodepool %s: %s (%v)\n%s", e.What, e.Last, e.Err, strings.TrimRight(e.Output, "\n"))
}

func (e *NodepoolError) Unwrap() error { return e.Err }

// runNodepool runs script with nodepoolPython in the vendored tree's environment plus
// env, args as sys.argv[1:], in its own process group, and returns stdout and stderr.
func runNodepool(ctx context.Context, what, script string, env []string, args ...string) (string, string, error) {
	tree, err := nodepoolTree()
	if err != nil {
		return "", "", err
	}
	cmd := exec.CommandContext(ctx, nodepoolPython, append([]string{"-c", script}, args...)...)
	cmd.Env = nodepoolEnv(tree, env)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return stdout.String(), stderr.String(), &NodepoolError{What: what, Last: lastLine(stderr.String()), Output: stderr.String(), Err: err}
	}
	return stdout.String(), stderr.String(), nil
}

// lastLine is the last line of out that is not blank.
func lastLine(out string) string {
	lines := strings.Split(strings.TrimRight(out, "\n "), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// nodepoolValidate runs what `nodepool config-validate` runs, logging as that command
// does but to stderr.
const nodepoolValidate = `import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                    format="%(asctime)s %(levelname)s %(name)s: %(message)s")
from nodepool.cmd.config_validator import ConfigValidator
sys.exit(ConfigValidator(sys.argv[1]).validate())
`

// NodepoolConfigValidate checks the nodepool.yaml at path with nodepool's own
// validator, as `nodepool config-validate` does, in the environment plus env (a
// NODEPOOL_* variable is substituted into the file). It returns the validator's log;
// the error, a *NodepoolError, says that the validator refused the file and carries
// the log, which names the problem. It does not check that nodepool can run: see
// RequireNodepool.
func NodepoolConfigValidate(ctx context.Context, path string, env []string) (string, error) {
	_, log, err := runNodepool(ctx, "config-validate "+path, nodepoolValidate, env, path)
	return log, err
}

// NodepoolConfig is what nodepool makes of a nodepool.yaml, and of a secure file laid
// over it, as nodepool-launcher and nodepool-builder load them.
type NodepoolConfig struct {
	// ZooKeeperServers is the cluster as nodepool hands it to its ZooKeeper client,
	// e.g. "zk1:2281/nodepool,zk2:2281/nodepool"; "" when there is none.
	ZooKeeperServers string `json:"zookeeper_servers"`
	// ZooKeeperTLS is the client's TLS files; each "" when not set.
	ZooKeeperTLS NodepoolZooKeeperTLS `json:"zookeeper_tls"`
	// Diskimages are the top-level diskimages that are not abstract, parents merged.
	Diskimages map[string]NodepoolDiskimage `json:"diskimages"`
	Labels     map[string]NodepoolLabel     `json:"labels"`
	Providers  map[string]NodepoolProvider  `json:"providers"`
}

// NodepoolZooKeeperTLS is the zookeeper-tls section as nodepool took it.
type NodepoolZooKeeperTLS struct {
	Cert string `json:"cert"`
	Key  string `json:"key"`
	CA   string `json:"ca"`
}

// NodepoolDiskimage is a top-level diskimage as nodepool loaded it.
type NodepoolDiskimage struct {
	Pause bool `json:"pause"`
	// ImageTypes are the formats it is built in, sorted: its formats, plus the image
	// format of every openstack provider that lists it.
	ImageTypes []string `json:"image_types"`
	// Elements are space-separated, as nodepool keeps them and hands them to DIB.
	Elements     string            `json:"elements"`
	Release      string            `json:"release"`
	EnvVars      map[string]string `json:"env_vars"`
	Username     string            `json:"username"`
	PythonPath   string            `json:"python_path"`
	ShellType    string            `json:"shell_type"` // "" when not set
	DibCmd       string            `json:"dib_cmd"`
	RebuildAge   int               `json:"rebuild_age"`   // seconds
	BuildTimeout int               `json:"build_timeout"` // seconds
}

// NodepoolLabel is a top-level label.
type NodepoolLabel struct {
	MinReady int `json:"min_ready"`
}

// NodepoolProvider is a provider as its driver loaded it.
type NodepoolProvider struct {
	Driver string `json:"driver"`
	// ImageType is the format the provider takes images in ("" for a driver without
	// one); for openstack, the cloud's image_format.
	ImageType  string                               `json:"image_type"`
	Diskimages map[string]NodepoolProviderDiskimage `json:"diskimages"`
	Pools      map[string]NodepoolPool              `json:"pools"`
}

// NodepoolProviderDiskimage is a diskimage a provider lists.
type NodepoolProviderDiskimage struct {
	Pause bool           `json:"pause"`
	Meta  map[string]any `json:"meta"`
}

// NodepoolPool is a pool of a provider.
type NodepoolPool struct {
	// Labels maps each label of the pool to the image it boots: the name of its
	// diskimage when it has one, else the name of its cloud image, else "".
	Labels map[string]string `json:"labels"`
}

// nodepoolLoad runs nodepool's loadConfig on argv[1], then, when argv[2] names a
// secure file, loadSecureConfig on it, as nodepool-builder and nodepool-launcher do,
// and prints what it made of them as JSON.
const nodepoolLoad = `import json, logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
from nodepool import config as nodepool_config

def name_of(x):
    return x if x is None or isinstance(x, str) else getattr(x, "name", None)

c = nodepool_config.loadConfig(sys.argv[1])
if len(sys.argv) > 2:
    nodepool_config.loadSecureConfig(c, sys.argv[2])
out = {"zookeeper_servers": c.zookeeper_servers or "",
       "zookeeper_tls": {"cert": c.zookeeper_tls_cert or "", "key": c.zookeeper_tls_key or "",
                         "ca": c.zookeeper_tls_ca or ""},
       "diskimages": {}, "labels": {}, "providers": {}}
for name, d in c.diskimages.items():
    out["diskimages"][name] = {
        "pause": bool(d.pause), "image_types": sorted(d.image_types),
        "elements": d.elements, "release": d.release, "env_vars": d.env_vars,
        "username": d.username, "python_path": d.python_path,
        "shell_type": d.shell_type, "dib_cmd": d.dib_cmd,
        "rebuild_age": d.rebuild_age, "build_timeout": d.build_timeout}
for name, l in c.labels.items():
    out["labels"][name] = {"min_ready": l.min_ready}
for name, p in c.providers.items():
    pools = {}
    for pname, pool in p.pools.items():
        labels = {}
        for lname, l in pool.labels.items():
            image = name_of(getattr(l, "diskimage", None))
            if image is None:
                image = name_of(getattr(l, "cloud_image", None))
            labels[lname] = image or ""
        pools[pname] = {"labels": labels}
    out["providers"][name] = {
        "driver": p.driver.name,
        "image_type": getattr(p, "image_type", None) or "",
        "diskimages": {n: {"pause": bool(getattr(i, "pause", False)),
                           "meta": getattr(i, "meta", None) or {}}
                       for n, i in (getattr(p, "diskimages", None) or {}).items()},
        "pools": pools}
json.dump(out, sys.stdout)
`

// NodepoolLoadConfig loads the nodepool.yaml at path with nodepool's loadConfig, what
// nodepool-launcher and nodepool-builder run at start and on every reload, in the
// environment plus env (OS_CLIENT_CONFIG_FILE naming the clouds.yaml an openstack
// provider's cloud is in). A file nodepool cannot load is a *NodepoolError whose Last
// is the exception, e.g. "KeyError: 'debian-bookworm'". It does not check that
// nodepool can run: see RequireNodepool.
func NodepoolLoadConfig(ctx context.Context, path string, env []string) (NodepoolConfig, error) {
	return nodepoolLoadConfig(ctx, "loadConfig("+path+")", env, path)
}

// NodepoolLoadSecureConfig loads the nodepool.yaml at path and lays the secure file
// at secure over it, with nodepool's loadConfig and then its loadSecureConfig, as
// nodepool-builder -s and nodepool-launcher -s load them at start and on every
// reload; otherwise as NodepoolLoadConfig. A secure file nodepool cannot take is a
// *NodepoolError whose Last is the exception, e.g. "Exception: secure.conf: unknown
// diskimage fedora".
func NodepoolLoadSecureConfig(ctx context.Context, path, secure string, env []string) (NodepoolConfig, error) {
	return nodepoolLoadConfig(ctx, "loadSecureConfig("+path+", "+secure+")", env, path, secure)
}

func nodepoolLoadConfig(ctx context.Context, what string, env []string, args ...string) (NodepoolConfig, error) {
	var c NodepoolConfig
	out, _, err := runNodepool(ctx, what, nodepoolLoad, env, args...)
	if err != nil {
		return c, err
	}
	if err := json.Unmarshal([]byte(out), &c); err != nil {
		return c, fmt.Errorf("nodepool %s: decode what it printed: %w\n%s", what, err, out)
	}
	return c, nil
}

// NodepoolBuilderOptions says how to run nodepool-builder.
type NodepoolBuilderOptions struct {
	// Config is the nodepool.yaml (-c). It must set images-dir and build-log-dir to
	// directories of the test: nodepool's default build log directory is in /var/log.
	Config string
	// Secure is the secure.conf (-s), if any.
	Secure string
	// Env is added to the test's environment, its entries winning: for example
	// OS_CLIENT_CONFIG_FILE naming the clouds.yaml.
	Env []string
	// BuildWorkers and UploadWorkers are its worker threads; 0 means 1.
	BuildWorkers, UploadWorkers int
}

// NodepoolBuilder is nodepool's own nodepool-builder daemon, run from the vendored
// tree in the foreground with debug logging.
type NodepoolBuilder struct {
	// LogFile is everything it wrote, stdout and stderr.
	LogFile string

	out  *nodepoolOutput
	proc *process
	stop func() error
}

// StartNodepoolBuilder starts nodepool-builder for the test, in its own process
// group, and stops it when the test ends. It skips (or fails under CI) unless
// nodepool can run.
func StartNodepoolBuilder(t testing.TB, opts NodepoolBuilderOptions) *NodepoolBuilder {
	t.Helper()
	RequireNodepool(t)
	tree, _ := nodepoolTree()
	builds, uploads := max(opts.BuildWorkers, 1), max(opts.UploadWorkers, 1)
	// -d is the foreground with debug logging to stdout; no -p, which only the
	// daemonizing mode uses.
	args := []string{"-c", "import sys\nfrom nodepool.cmd.builder import main\nsys.exit(main())",
		"-d", "-c", opts.Config,
		"--build-workers", strconv.Itoa(builds), "--upload-workers", strconv.Itoa(uploads)}
	if opts.Secure != "" {
		args = append(args, "-s", opts.Secure)
	}
	cmd := exec.Command(nodepoolPython, args...)
	cmd.Env = nodepoolEnv(tree, opts.Env)
	cmd.Dir = t.TempDir()
	b := &NodepoolBuilder{LogFile: filepath.Join(cmd.Dir, "nodepool-builder.log"), out: newNodepoolOutput()}
	p, err := startProcess(cmd, b.LogFile, b.out)
	if err != nil {
		t.Fatalf("start nodepool-builder: %v", err)
	}
	b.proc = p
	b.stop = sync.OnceValue(func() error {
		// SIGINT is nodepool-builder's own way to stop: it stops its workers and
		// closes its ZooKeeper session, so that its locks and its registration go at
		// once rather than when the session expires. SIGTERM would end it on the spot.
		_ = syscall.Kill(-p.pgid, syscall.SIGINT)
		select {
		case <-p.exited:
		case <-time.After(nodepoolStopGrace):
		}
		return p.stop()
	})
	t.Cleanup(func() {
		if err := b.stop(); err != nil {
			t.Errorf("stop nodepool-builder: %v", err)
		}
	})
	return b
}

// Stop stops nodepool-builder: SIGINT, then SIGTERM and SIGKILL when it does not
// exit in time. Stopping it again does nothing.
func (b *NodepoolBuilder) Stop(t testing.TB) {
	t.Helper()
	if err := b.stop(); err != nil {
		t.Errorf("stop nodepool-builder: %v", err)
	}
}

// Log is everything nodepool-builder wrote so far.
func (b *NodepoolBuilder) Log() string { return b.out.String() }

// WaitLog waits until nodepool-builder writes a line that re matches and returns
// that line. The test fails, showing the end of the log, when it exits or timeout
// passes first.
func (b *NodepoolBuilder) WaitLog(t testing.TB, re *regexp.Regexp, timeout time.Duration) string {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		changed := b.out.changed()
		if line, ok := matchLine(b.out.String(), re); ok {
			return line
		}
		select {
		case <-changed:
		case <-b.proc.exited:
			if line, ok := matchLine(b.out.String(), re); ok {
				return line
			}
			t.Fatalf("nodepool-builder exited before it logged a line matching %q\nlog (%s), last lines:\n%s", re, b.LogFile, logTail(b.LogFile))
		case <-deadline.C:
			t.Fatalf("nodepool-builder logged no line matching %q within %s\nlog (%s), last lines:\n%s", re, timeout, b.LogFile, logTail(b.LogFile))
		}
	}
}

// matchLine finds the first whole line of log that re matches.
func matchLine(log string, re *regexp.Regexp) (string, bool) {
	for line := range strings.Lines(log) {
		if !strings.HasSuffix(line, "\n") {
			break // still being written
		}
		if line = strings.TrimSuffix(line, "\n"); re.MatchString(line) {
			return line, true
		}
	}
	return "", false
}

// Tracebacks is each Python traceback nodepool-builder wrote, as one string of its
// lines: what nodepool logs with log.exception and what Python prints of an
// exception nothing caught.
func (b *NodepoolBuilder) Tracebacks() []string { return tracebacks(b.out.String()) }

// tracebacks finds the tracebacks in a log. nodepool's log formatter repeats a
// record's prefix (time, level, logger) on each line of a multi-line message,
// indented by two spaces, so a logged traceback is the lines that start as its
// "Traceback" line does; an unlogged one is the indented lines after it and the
// exception line that ends it.
func tracebacks(log string) []string {
	const start = "Traceback (most recent call last):"
	lines := strings.Split(log, "\n")
	var found []string
	for i := 0; i < len(lines); i++ {
		at := strings.Index(lines[i], start)
		if at < 0 {
			continue
		}
		prefix := lines[i][:at]
		block := []string{lines[i]}
		for i+1 < len(lines) && strings.HasPrefix(lines[i+1], prefix) {
			rest := lines[i+1][len(prefix):]
			if strings.Contains(rest, start) {
				break // the next one, chained
			}
			i++
			block = append(block, lines[i])
			if prefix == "" && rest != "" && rest[0] != ' ' {
				break // the exception line
			}
		}
		found = append(found, strings.Join(block, "\n"))
	}
	return found
}

// nodepoolOutput keeps what a process writes and tells waiters when more comes.
type nodepoolOutput struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	more chan struct{} // closed on the next write
}

func newNodepoolOutput() *nodepoolOutput {
	return &nodepoolOutput{more: make(chan struct{})}
}

func (o *nodepoolOutput) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.buf.Write(p)
	close(o.more)
	o.more = make(chan struct{})
	return len(p), nil
}

// changed is closed when something is written after this call.
func (o *nodepoolOutput) changed() <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.more
}

func (o *nodepoolOutput) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// NodepoolUpload is an image upload as nodepool's ZooKeeper class reads it.
type NodepoolUpload struct {
	BuildID    string  `json:"build_id"`
	ID         string  `json:"id"`
	ExternalID string  `json:"external_id"`
	StateTime  float64 `json:"state_time"`
	Username   string  `json:"username"`
	PythonPath string  `json:"python_path"`
	ShellType  string  `json:"shell_type"`
}

// nodepoolLaunchPicks reads, with nodepool's own ZooKeeper class, the upload
// nodepool-launcher boots for each image/provider in argv: the newest READY
// one, read from the znodes and from the image cache the launcher reads it
// from (cached=True), once that cache is ready.
const nodepoolLaunchPicks = `import json, logging, os, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
from nodepool.zk import ZooKeeperClient
from nodepool.zk.zookeeper import ZooKeeper
e = os.environ
client = ZooKeeperClient(e["TESTENV_ZK_HOSTS"], timeout=float(e["TESTENV_ZK_TIMEOUT"]),
                         tls_cert=e["TESTENV_ZK_CERT"], tls_key=e["TESTENV_ZK_KEY"], tls_ca=e["TESTENV_ZK_CA"])
client.connect()
zk = ZooKeeper(client, enable_cache=True)
def pick(u):
    if u is None:
        return None
    return {"build_id": u.build_id, "id": u.id, "external_id": u.external_id or "",
            "state_time": u.state_time, "username": u.username or "",
            "python_path": u.python_path or "", "shell_type": u.shell_type or ""}
out = {"direct": {}, "cached": {}}
for arg in sys.argv[1:]:
    image, provider = arg.split("/")
    out["direct"][arg] = pick(zk.getMostRecentImageUpload(image, provider))
    out["cached"][arg] = pick(zk.getMostRecentImageUpload(image, provider, cached=True))
print(json.dumps(out))
zk.disconnect()
`

// NodepoolLaunchPicks reads, with nodepool 10's own ZooKeeper class connected
// as c says (it takes TLS only), the upload nodepool-launcher boots for each
// "image/provider" key: the newest READY upload there, as its
// getMostRecentImageUpload finds it reading the znodes (direct) and its image
// cache (cached, what the launcher calls). A key with none is absent. It does
// not check that nodepool can run: see RequireNodepool.
func NodepoolLaunchPicks(ctx context.Context, c KazooConn, keys ...string) (direct, cached map[string]NodepoolUpload, err error) {
	out, _, err := runNodepool(ctx, "getMostRecentImageUpload", nodepoolLaunchPicks, c.env(), keys...)
	if err != nil {
		return nil, nil, err
	}
	var picks struct {
		Direct map[string]*NodepoolUpload `json:"direct"`
		Cached map[string]*NodepoolUpload `json:"cached"`
	}
	if err := json.Unmarshal([]byte(out), &picks); err != nil {
		return nil, nil, fmt.Errorf("nodepool getMostRecentImageUpload: decode what it printed: %w\n%s", err, out)
	}
	direct, cached = map[string]NodepoolUpload{}, map[string]NodepoolUpload{}
	for k, u := range picks.Direct {
		if u != nil {
			direct[k] = *u
		}
	}
	for k, u := range picks.Cached {
		if u != nil {
			cached[k] = *u
		}
	}
	return direct, cached, nil
}

// NodepoolBuildRecord is a build to store as nodepool's builder stores one, with
// its uploads.
type NodepoolBuildRecord struct {
	Image string
	// State is nodepool's: building, ready, deleting or failed.
	State     string
	Builder   string // the host name
	BuilderID string
	Formats   []string
	Uploads   []NodepoolUploadRecord
}

// NodepoolUploadRecord is an upload of a NodepoolBuildRecord.
type NodepoolUploadRecord struct {
	Provider string
	// State is nodepool's: uploading, ready, deleting or failed.
	State  string
	Format string
	// ExternalID and ExternalName are the cloud image's; "" stores none.
	ExternalID, ExternalName string
}

// nodepoolStoreBuild stores the build and uploads argv[1] describes (JSON)
// with nodepool's own ZooKeeper class, storeBuild and storeImageUpload, and
// prints the ids they were given.
const nodepoolStoreBuild = `import json, logging, os, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
from nodepool.zk import ZooKeeperClient
from nodepool.zk.zookeeper import ZooKeeper, ImageBuild, ImageUpload
e = os.environ
client = ZooKeeperClient(e["TESTENV_ZK_HOSTS"], timeout=float(e["TESTENV_ZK_TIMEOUT"]),
                         tls_cert=e["TESTENV_ZK_CERT"], tls_key=e["TESTENV_ZK_KEY"], tls_ca=e["TESTENV_ZK_CA"])
client.connect()
zk = ZooKeeper(client, enable_cache=False)
spec = json.loads(sys.argv[1])
b = ImageBuild(spec["image"])
b.builder, b.builder_id, b.formats = spec["builder"], spec["builder_id"], spec["formats"]
b.username, b.python_path = "zuul", "auto"
b.state = spec["state"]
build_id = zk.storeBuild(spec["image"], b)
ids = []
for u in spec["uploads"] or []:
    up = ImageUpload(build_id, u["provider"], spec["image"], username="zuul", python_path="auto")
    up.format = u["format"]
    up.external_id = u["external_id"] or None
    up.external_name = u["external_name"] or None
    up.state = u["state"]
    ids.append(zk.storeImageUpload(spec["image"], build_id, u["provider"], up))
print(json.dumps({"build_id": build_id, "upload_ids": ids}))
zk.disconnect()
`

// NodepoolStoreBuild stores a build and its uploads with nodepool 10's own
// ZooKeeper class connected as c says (it takes TLS only), as a Python
// nodepool-builder, or anyone running its code, writes them. It returns the
// build's id and its uploads' ids, in order. It does not check that nodepool
// can run: see RequireNodepool.
func NodepoolStoreBuild(ctx context.Context, c KazooConn, b NodepoolBuildRecord) (buildID string, uploadIDs []string, err error) {
	type upload struct {
		Provider     string `json:"provider"`
		State        string `json:"state"`
		Format       string `json:"format"`
		ExternalID   string `json:"external_id"`
		ExternalName string `json:"external_name"`
	}
	spec := struct {
		Image     string   `json:"image"`
		State     string   `json:"state"`
		Builder   string   `json:"builder"`
		BuilderID string   `json:"builder_id"`
		Formats   []string `json:"formats"`
		Uploads   []upload `json:"uploads"`
	}{Image: b.Image, State: b.State, Builder: b.Builder, BuilderID: b.BuilderID, Formats: b.Formats}
	for _, u := range b.Uploads {
		spec.Uploads = append(spec.Uploads, upload(u))
	}
	arg, err := json.Marshal(spec)
	if err != nil {
		return "", nil, err
	}
	out, _, err := runNodepool(ctx, "storeBuild", nodepoolStoreBuild, c.env(), string(arg))
	if err != nil {
		return "", nil, err
	}
	var ids struct {
		BuildID   string   `json:"build_id"`
		UploadIDs []string `json:"upload_ids"`
	}
	if err := json.Unmarshal([]byte(out), &ids); err != nil {
		return "", nil, fmt.Errorf("nodepool storeBuild: decode what it printed: %w\n%s", err, out)
	}
	return ids.BuildID, ids.UploadIDs, nil
}
