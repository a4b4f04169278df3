package testenv

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "modernc.org/sqlite" // WAL mode for Keystone's database
)

// Keystone is Debian's Keystone (sqlite database, fernet tokens) served by uwsgi on
// loopback and bootstrapped with keystone-manage: an admin user in the admin
// project, the admin, member and reader roles, its own identity endpoints in
// RegionOne.
type Keystone struct {
	// URL is the identity endpoint root (a clouds.yaml auth_url without /v3).
	URL string
	// DataDir holds the config, the database, the keys and the log.
	DataDir string
	// LogFile is everything keystone-manage and uwsgi wrote.
	LogFile string
	// TokenLifetime is how long the tokens it issues stay valid.
	TokenLifetime time.Duration

	adminPassword string

	mu        sync.Mutex
	seq       int
	glanceSvc *glanceService // the service user Glances validate tokens with
	admTok    Token
}

// glanceService is the Keystone user and project Glance's auth_token uses.
type glanceService struct {
	user, password, project string
}

// KeystoneOptions changes what StartKeystone serves.
type KeystoneOptions struct {
	// TokenLifetime is [token] expiration, whole seconds; 0 is Keystone's default hour.
	TokenLifetime time.Duration
}

// keystoneReadyTimeout bounds the wait for Keystone's first answer: the first
// start compiles and loads a lot of Python, ~20 s on a busy machine.
const keystoneReadyTimeout = 3 * time.Minute

// keystoneBins are the programs StartKeystone runs.
var keystoneBins = []string{"keystone-manage", "uwsgi", "/usr/bin/keystone-wsgi-public"}

// StartKeystone writes a keystone.conf under dir, creates and bootstraps the
// database and its keys, and serves Keystone with uwsgi on a free loopback port
// in its own process group. Output goes to dir/keystone.log and, when logw is not
// nil, to logw as well. ctx bounds the start only; the returned stop function
// ends every process of this Keystone.
func StartKeystone(ctx context.Context, dir string, opts KeystoneOptions, logw io.Writer) (*Keystone, func() error, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("start keystone in %s: %w", dir, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, fmt.Errorf("start keystone: %w", err)
	}
	ks := &Keystone{
		DataDir:       dir,
		LogFile:       filepath.Join(dir, "keystone.log"),
		TokenLifetime: opts.TokenLifetime,
		adminPassword: randomHex(12),
	}
	if ks.TokenLifetime == 0 {
		ks.TokenLifetime = time.Hour
	}
	conf := filepath.Join(dir, "keystone.conf")
	if err := os.WriteFile(conf, []byte(keystoneConfig(dir, int(ks.TokenLifetime/time.Second))), 0o600); err != nil {
		return nil, nil, fmt.Errorf("start keystone: write config: %w", err)
	}
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, nil, fmt.Errorf("start keystone: %w", err)
		}
		// The catalog's identity endpoint is where Glance checks tokens, so the
		// port is chosen before bootstrap writes it; a second bootstrap moves it.
		ks.URL = "http://127.0.0.1:" + strconv.Itoa(port)
		if err := ks.setup(ctx, conf, attempt == 1, logw); err != nil {
			return nil, nil, fmt.Errorf("start keystone: %w\nkeystone log (%s), last lines:\n%s", err, ks.LogFile, logTail(ks.LogFile))
		}
		cmd := exec.Command("uwsgi", "--plugins", "python3", "--http-socket", "127.0.0.1:"+strconv.Itoa(port),
			"--wsgi-file", "/usr/bin/keystone-wsgi-public",
			// One thread per process: keystone's sqlite connections break when threads share them.
			"--master", "--processes", "2", "--threads", "1",
			// SIGTERM ends uwsgi (its default is to reload); a worker that
			// loses its master goes too.
			"--die-on-term", "--need-app", "--no-orphans", "--buffer-size", "65535",
			// A worker serves one connection at a time: a client keeping it open
			// would hold the worker, so every answer ends its connection.
			"--add-header", "Connection: close")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "OS_KEYSTONE_CONFIG_DIR="+dir)
		p, err := startTied(cmd, ks.LogFile, logw)
		if err != nil {
			return nil, nil, fmt.Errorf("start keystone: uwsgi: %w", err)
		}
		stop := sync.OnceValue(p.stop)
		err = ks.waitReady(ctx, p.exited)
		if err == nil {
			return ks, stop, nil
		}
		err = errors.Join(err, stop())
		if log, rerr := os.ReadFile(ks.LogFile); attempt == 1 && rerr == nil && bytes.Contains(log, []byte("Address already in use")) {
			continue
		}
		return nil, nil, fmt.Errorf("start keystone on %s: %w\nkeystone log (%s), last lines:\n%s", ks.URL, err, ks.LogFile, logTail(ks.LogFile))
	}
}

// startTied starts cmd as startProcess does, from a thread that lives as long as
// the test process, and has the kernel kill it when that thread ends: a test
// binary that dies without stopping it (a timeout's panic skips TestMain's end)
// takes its Keystone along rather than leaving it serving.
func startTied(cmd *exec.Cmd, logFile string, logw io.Writer) (*process, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	type started struct {
		p   *process
		err error
	}
	ch := make(chan started)
	go func() {
		// Never unlocked: a locked thread ends with its goroutine, and the
		// kernel's parent-death signal follows the thread, not the process.
		runtime.LockOSThread()
		p, err := startProcess(cmd, logFile, logw)
		ch <- started{p, err}
		if err == nil {
			<-p.exited
		}
	}()
	s := <-ch
	return s.p, s.err
}

// keystoneConfig is a keystone.conf that keeps everything under dir.
func keystoneConfig(dir string, lifetime int) string {
	return fmt.Sprintf(`[DEFAULT]
debug = false
use_stderr = true
log_file =
log_dir =

[database]
connection = sqlite:///%[1]s/keystone.sqlite

[token]
provider = fernet
expiration = %[2]d

[fernet_tokens]
key_repository = %[1]s/fernet-keys

[fernet_receipts]
key_repository = %[1]s/fernet-receipts

[credential]
key_repository = %[1]s/credential-keys

[identity]
# The fewest bcrypt rounds: every login hashes a password.
password_hash_rounds = 4

[oslo_concurrency]
lock_path = %[1]s/locks
`, dir, lifetime)
}

// setup creates the database and the keys, first only, and bootstraps Keystone
// with its identity endpoint at ks.URL.
func (ks *Keystone) setup(ctx context.Context, conf string, first bool, logw io.Writer) error {
	logf, err := os.OpenFile(ks.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open log: %w", err)
	}
	defer logf.Close()
	var out io.Writer = logf
	if logw != nil {
		out = io.MultiWriter(logf, logw)
	}
	u, err := user.Current()
	if err != nil {
		return err
	}
	g, err := user.LookupGroupId(u.Gid)
	if err != nil {
		return err
	}
	owner := []string{"--keystone-user", u.Username, "--keystone-group", g.Name}
	url := ks.URL + "/v3"
	steps := [][]string{
		{"db_sync"},
		append([]string{"fernet_setup"}, owner...),
		append([]string{"credential_setup"}, owner...),
		{"bootstrap", "--bootstrap-password", ks.adminPassword, "--bootstrap-region-id", "RegionOne",
			"--bootstrap-admin-url", url, "--bootstrap-internal-url", url, "--bootstrap-public-url", url},
	}
	if !first {
		steps = steps[len(steps)-1:]
	}
	for _, step := range steps {
		cmd := exec.CommandContext(ctx, "keystone-manage", append([]string{"--config-file", conf}, step...)...)
		cmd.Stdout, cmd.Stderr = out, out
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("keystone-manage %s: %w", step[0], err)
		}
		if step[0] == "db_sync" {
			// A reader left in a transaction would lock writers out of a
			// database in the default rollback-journal mode.
			if err := walMode(filepath.Join(ks.DataDir, "keystone.sqlite")); err != nil {
				return err
			}
		}
	}
	return nil
}

// walMode switches a sqlite database to write-ahead logging, which it keeps.
func walMode(path string) error {
	db, err := sql.Open("sqlite", path)
	if err != nil {
		return err
	}
	defer db.Close()
	var mode string
	if err := db.QueryRow("PRAGMA journal_mode=WAL").Scan(&mode); err != nil || mode != "wal" {
		return fmt.Errorf("set %s to WAL mode: got %q, %v", path, mode, err)
	}
	return nil
}

// waitReady waits until the admin can log in, the process exits, or time runs out.
func (ks *Keystone) waitReady(ctx context.Context, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, keystoneReadyTimeout)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := ks.adminToken(ctx); err == nil {
			return nil
		}
		select {
		case <-exited:
			return errors.New("uwsgi exited before Keystone answered")
		case <-ctx.Done():
			return fmt.Errorf("keystone did not answer at %s: %w", ks.URL, ctx.Err())
		case <-tick.C:
		}
	}
}

var shared struct {
	once sync.Once
	ks   *Keystone
	stop func() error
	dir  string
	err  error
}

// SharedKeystone is one Keystone for every test of the package's process, started
// on first use: its first start takes ~20 s. A test package that uses it stops it
// with StopSharedKeystone in its TestMain. It skips (or fails under CI) when
// Keystone is not installed.
func SharedKeystone(t testing.TB) *Keystone {
	t.Helper()
	requireKeystone(t)
	shared.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), keystoneReadyTimeout+time.Minute)
		defer cancel()
		shared.dir, shared.err = os.MkdirTemp("", "keystone-")
		if shared.err == nil {
			shared.ks, shared.stop, shared.err = StartKeystone(ctx, shared.dir, KeystoneOptions{}, nil)
		}
	})
	if shared.err != nil {
		t.Fatalf("start the shared keystone: %v", shared.err)
	}
	return shared.ks
}

// StopSharedKeystone stops the Keystone SharedKeystone started, if it did, and
// removes its files.
func StopSharedKeystone() error {
	if shared.stop == nil {
		return nil
	}
	return errors.Join(shared.stop(), os.RemoveAll(shared.dir))
}

// NewKeystone starts a Keystone of the test's own, for options the shared one
// does not have, and stops it when the test ends.
func NewKeystone(t testing.TB, opts KeystoneOptions) *Keystone {
	t.Helper()
	requireKeystone(t)
	ctx, cancel := context.WithTimeout(t.Context(), keystoneReadyTimeout+time.Minute)
	defer cancel()
	ks, stop, err := StartKeystone(ctx, t.TempDir(), opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("stop keystone: %v", err)
		}
	})
	return ks
}

func requireKeystone(t testing.TB) {
	t.Helper()
	for _, bin := range keystoneBins {
		RequireBinary(t, bin)
	}
	if _, err := os.Stat("/usr/lib/uwsgi/plugins/python3_plugin.so"); err != nil {
		Unavailable(t, "uwsgi's python3 plugin not installed; run `make deps-test`")
	}
}

// randomHex is n random bytes in hex: passwords and names that tests do not share.
func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// Token is a token Keystone issued.
type Token struct {
	ID      string
	Expires time.Time
}

// Login asks for a token with a v3 auth request body ({"auth": ...}).
func (ks *Keystone) Login(ctx context.Context, auth any) (Token, error) {
	var doc struct {
		Token struct {
			ExpiresAt time.Time `json:"expires_at"`
		} `json:"token"`
	}
	hdr, err := ks.call(ctx, "", http.MethodPost, "/v3/auth/tokens", map[string]any{"auth": auth}, &doc)
	if err != nil {
		return Token{}, fmt.Errorf("log in to keystone: %w", err)
	}
	return Token{ID: hdr.Get("X-Subject-Token"), Expires: doc.Token.ExpiresAt}, nil
}

// PasswordAuth is the auth part of a v3 password login of a Default domain user,
// scoped to project when it is not empty.
func PasswordAuth(user, password, project string) map[string]any {
	auth := map[string]any{"identity": map[string]any{"methods": []string{"password"}, "password": map[string]any{
		"user": map[string]any{"name": user, "password": password, "domain": map[string]string{"id": "default"}}}}}
	if project != "" {
		auth["scope"] = map[string]any{"project": map[string]any{"name": project, "domain": map[string]string{"id": "default"}}}
	}
	return auth
}

// adminToken is a token of the admin, the last one while it has a while to live.
func (ks *Keystone) adminToken(ctx context.Context) (string, error) {
	ks.mu.Lock()
	tok := ks.admTok
	ks.mu.Unlock()
	if tok.ID != "" && time.Until(tok.Expires) > 10*time.Second {
		return tok.ID, nil
	}
	tok, err := ks.Login(ctx, PasswordAuth("admin", ks.adminPassword, "admin"))
	if err != nil {
		return "", err
	}
	ks.mu.Lock()
	ks.admTok = tok
	ks.mu.Unlock()
	return tok.ID, nil
}

// Revoke makes a token invalid at once, as its expiry would.
func (ks *Keystone) Revoke(t testing.TB, token string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodDelete, ks.URL+"/v3/auth/tokens", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Auth-Token", token)
	req.Header.Set("X-Subject-Token", token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("revoke token: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("revoke token: keystone answered %s", resp.Status)
	}
}

// call sends one identity API request with token (none when empty) and decodes
// the JSON answer into out when out is not nil.
func (ks *Keystone) call(ctx context.Context, token, method, path string, in, out any) (http.Header, error) {
	var body io.Reader
	if in != nil {
		data, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, ks.URL+path, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("X-Auth-Token", token)
	}
	client := http.Client{Timeout: time.Minute}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		return nil, fmt.Errorf("%s %s: keystone answered %s: %s", method, path, resp.Status, bytes.TrimSpace(data))
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return nil, fmt.Errorf("%s %s: %w", method, path, err)
		}
	}
	return resp.Header, nil
}

// admin runs one identity API call as the admin and returns the "id" of the
// object the answer holds under key, if key is not empty.
func (ks *Keystone) admin(t testing.TB, method, path string, in any, key string) string {
	t.Helper()
	tok, err := ks.adminToken(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]json.RawMessage
	var out any
	if key != "" {
		out = &doc
	}
	if _, err := ks.call(t.Context(), tok, method, path, in, out); err != nil {
		t.Fatalf("%v\nkeystone log (%s), last lines:\n%s", err, ks.LogFile, logTail(ks.LogFile))
	}
	if key == "" {
		return ""
	}
	var obj struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(doc[key], &obj); err != nil || obj.ID == "" {
		t.Fatalf("%s %s: no %s id in the answer: %v", method, path, key, err)
	}
	return obj.ID
}

// Unique is a name no other call on this Keystone returned: tests sharing one
// Keystone keep their projects, users and regions apart by it.
func (ks *Keystone) Unique(prefix string) string {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	ks.seq++
	return fmt.Sprintf("%s-%d-%s", prefix, ks.seq, randomHex(3))
}

// Account is a user with a role in a project of its own, in the Default domain.
type Account struct {
	User, UserID, Password string
	Project, ProjectID     string
}

// NewAccount creates a project and a user with the member role in it.
func (ks *Keystone) NewAccount(t testing.TB) Account {
	t.Helper()
	a := Account{Project: ks.Unique("project"), User: ks.Unique("user"), Password: randomHex(12)}
	a.ProjectID = ks.admin(t, http.MethodPost, "/v3/projects", map[string]any{"project": map[string]any{
		"name": a.Project, "domain_id": "default"}}, "project")
	a.UserID = ks.admin(t, http.MethodPost, "/v3/users", map[string]any{"user": map[string]any{
		"name": a.User, "password": a.Password, "domain_id": "default", "default_project_id": a.ProjectID}}, "user")
	ks.grant(t, a.ProjectID, a.UserID, "member")
	return a
}

// Grant gives the account's user a role in its project as well: "admin" makes
// it an admin of the whole cloud, as Glance's default policy takes it.
func (ks *Keystone) Grant(t testing.TB, a Account, role string) {
	t.Helper()
	ks.grant(t, a.ProjectID, a.UserID, role)
}

// grant gives the user the named role in the project.
func (ks *Keystone) grant(t testing.TB, projectID, userID, role string) {
	t.Helper()
	tok, err := ks.adminToken(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var roles struct {
		Roles []struct{ ID string } `json:"roles"`
	}
	if _, err := ks.call(t.Context(), tok, http.MethodGet, "/v3/roles?name="+role, nil, &roles); err != nil || len(roles.Roles) != 1 {
		t.Fatalf("find role %s: %v (%d found)", role, err, len(roles.Roles))
	}
	ks.admin(t, http.MethodPut, "/v3/projects/"+projectID+"/users/"+userID+"/roles/"+roles.Roles[0].ID, nil, "")
}

// AppCredential is an application credential of an Account.
type AppCredential struct {
	ID, Name, Secret string
}

// NewAppCredential creates an application credential for the account's user,
// with its roles in its project.
func (ks *Keystone) NewAppCredential(t testing.TB, a Account) AppCredential {
	t.Helper()
	tok, err := ks.Login(t.Context(), PasswordAuth(a.User, a.Password, a.Project))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Cred struct {
			ID, Name, Secret string
		} `json:"application_credential"`
	}
	name := ks.Unique("appcred")
	if _, err := ks.call(t.Context(), tok.ID, http.MethodPost, "/v3/users/"+a.UserID+"/application_credentials",
		map[string]any{"application_credential": map[string]any{"name": name}}, &doc); err != nil {
		t.Fatal(err)
	}
	return AppCredential{ID: doc.Cred.ID, Name: doc.Cred.Name, Secret: doc.Cred.Secret}
}

// AddRegion creates a region with a name of its own and returns it.
func (ks *Keystone) AddRegion(t testing.TB) string {
	t.Helper()
	return ks.admin(t, http.MethodPost, "/v3/regions", map[string]any{"region": map[string]any{"id": ks.Unique("region")}}, "region")
}

// AddService creates a catalog service of the type and returns its id.
func (ks *Keystone) AddService(t testing.TB, typ string) string {
	t.Helper()
	return ks.admin(t, http.MethodPost, "/v3/services", map[string]any{"service": map[string]any{
		"type": typ, "name": ks.Unique(typ)}}, "service")
}

// AddEndpoint puts url in the catalog for the service in the region, at the
// interface (public, internal or admin).
func (ks *Keystone) AddEndpoint(t testing.TB, serviceID, region, iface, url string) {
	t.Helper()
	ks.admin(t, http.MethodPost, "/v3/endpoints", map[string]any{"endpoint": map[string]any{
		"service_id": serviceID, "region_id": region, "interface": iface, "url": url}}, "endpoint")
}

// service returns the user Glance's auth_token checks tokens with, creating it
// (an admin of a project named like it) on first use.
func (ks *Keystone) service(t testing.TB) glanceService {
	t.Helper()
	ks.mu.Lock()
	svc := ks.glanceSvc
	ks.mu.Unlock()
	if svc != nil {
		return *svc
	}
	a := ks.NewAccount(t)
	ks.grant(t, a.ProjectID, a.UserID, "admin")
	s := glanceService{user: a.User, password: a.Password, project: a.Project}
	ks.mu.Lock()
	defer ks.mu.Unlock()
	if ks.glanceSvc == nil {
		ks.glanceSvc = &s
	}
	return *ks.glanceSvc
}

// authConfig is the part of a glance-api.conf that puts Glance behind this Keystone.
func (ks *Keystone) authConfig(svc glanceService) string {
	// No token cache: every request is checked with Keystone, so an expired or
	// revoked token is refused at once, as a busy Glance's cache would after a while.
	return fmt.Sprintf(`
[keystone_authtoken]
www_authenticate_uri = %[1]s
auth_url = %[1]s
auth_type = password
username = %[2]s
password = %[3]s
project_name = %[4]s
user_domain_id = default
project_domain_id = default
token_cache_time = -1
`, ks.URL, svc.user, svc.password, svc.project)
}

// NewGlanceBehind starts a Glance for the test that accepts only tokens of ks,
// and stops it when the test ends. Its CloudsFile is of no use: reach it through
// the catalog (AddService, AddEndpoint) or image_endpoint_override.
func NewGlanceBehind(t testing.TB, ks *Keystone) *Glance {
	t.Helper()
	return ks.newGlance(t, nil)
}

// newGlance starts a Glance behind ks for the test, taking images by import
// as imports says when it is not nil, and stops it when the test ends.
func (ks *Keystone) newGlance(t testing.TB, imports *GlanceImportOptions) *Glance {
	t.Helper()
	RequireBinary(t, "glance-api")
	RequireBinary(t, "glance-manage")
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	g, stop, err := startGlance(ctx, t.TempDir(), nil, glanceSetup{auth: ks.authConfig(ks.service(t)), imports: imports})
	if err != nil {
		t.Fatalf("start glance behind keystone: %v", err)
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("stop glance: %v", err)
		}
	})
	return g
}

// CloudEntry is the clouds.yaml entry of a cloud name whose images are at
// endpoint (image_endpoint_override) and whose login is account a of ks,
// indented to go under "clouds:".
func (ks *Keystone) CloudEntry(name, endpoint string, a Account) string {
	return fmt.Sprintf(`  %s:
    image_endpoint_override: %s
    auth:
      auth_url: %s/v3
      username: %s
      password: %s
      project_name: %s
      user_domain_name: Default
      project_domain_name: Default
`, name, endpoint, ks.URL, a.User, a.Password, a.Project)
}
