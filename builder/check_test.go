package builder

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// TestCheck: every problem is reported, each wrapped in the error, which is
// config.ErrUnusable; a config the host can run passes; nothing is created.
func TestCheck(t *testing.T) {
	dir := t.TempDir()
	clouds := filepath.Join(dir, "clouds.yaml")
	if err := os.WriteFile(clouds, []byte("clouds:\n  c1: {auth_type: none, image_endpoint_override: 'http://127.0.0.1:9/'}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("OS_CLIENT_CONFIG_FILE", clouds)
	images := filepath.Join(dir, "images")
	good := func() *config.Config {
		return &config.Config{
			Path:        filepath.Join(dir, "nodepool.yaml"),
			ImagesDir:   images,
			BuildLogDir: filepath.Join(dir, "logs"),
			DiskImages:  []config.DiskImage{{Name: "d"}},
			ZuulImages:  []config.ZuulImage{{Name: "z", APIURL: "https://zuul.example.com/"}},
			Providers:   []config.Provider{{Name: "p1", Cloud: "c1"}, {Name: "p2", Cloud: "c1"}},
			Builder:     config.Builder{StateDB: filepath.Join(images, "builder.db")},
		}
	}
	tests := []struct {
		name   string
		change func(c *config.Config)
		want   []string // one per problem; nil: no error
	}{
		{name: "runs here", change: func(*config.Config) {}},
		{name: "no images-dir", change: func(c *config.Config) { c.ImagesDir = "" }, want: []string{"images-dir is not set"}},
		{name: "two clouds missing", change: func(c *config.Config) { c.Providers[0].Cloud, c.Providers[1].Cloud = "x", "y" },
			want: []string{`provider p1: cloud "x"`, `provider p2: cloud "y"`}},
		{name: "ca-cert and zookeeper-tls", change: func(c *config.Config) {
			c.ZuulImages[0].CACert = filepath.Join(dir, "absent-ca.pem")
			c.ZooKeeper = &config.ZooKeeper{TLS: &config.ZooKeeperTLS{Cert: clouds, Key: clouds, CA: clouds}}
		}, want: []string{"zuul-image z: read Zuul ca-cert", "zookeeper-tls: load the client certificate"}},
		{name: "build-log-dir below a file", change: func(c *config.Config) { c.BuildLogDir = filepath.Join(clouds, "logs") },
			want: []string{"build-log-dir " + filepath.Join(clouds, "logs") + " cannot be created"}},
		{name: "build-log-dir unused without diskimages", change: func(c *config.Config) {
			c.BuildLogDir = filepath.Join(clouds, "logs")
			c.DiskImages = nil
		}},
		{name: "zuul-mqtt whose files read", change: func(c *config.Config) {
			c.Builder.ZuulMQTT = &config.ZuulMQTT{URL: "mqtts://mqtt.example.com:8883", Host: "mqtt.example.com", Port: 8883,
				TLS: true, Username: "nodepool", PasswordFile: clouds}
		}},
		{name: "zuul-mqtt ca-cert", change: func(c *config.Config) {
			c.Builder.ZuulMQTT = &config.ZuulMQTT{URL: "mqtts://mqtt.example.com:8883", Host: "mqtt.example.com", Port: 8883,
				TLS: true, CACert: filepath.Join(dir, "absent-mqtt-ca.pem")}
		}, want: []string{"builder.zuul-mqtt: read ca-cert"}},
		{name: "zuul-mqtt password-file", change: func(c *config.Config) {
			c.Builder.ZuulMQTT = &config.ZuulMQTT{URL: "mqtts://mqtt.example.com:8883", Host: "mqtt.example.com", Port: 8883,
				TLS: true, Username: "nodepool", PasswordFile: filepath.Join(dir, "absent-password")}
		}, want: []string{"builder.zuul-mqtt: read password-file"}},
		{name: "zuul-mqtt client certificate", change: func(c *config.Config) {
			c.Builder.ZuulMQTT = &config.ZuulMQTT{URL: "mqtts://mqtt.example.com:8883", Host: "mqtt.example.com", Port: 8883,
				TLS: true, ClientCert: clouds, ClientKey: clouds}
		}, want: []string{"builder.zuul-mqtt: load client-cert"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := good()
			tt.change(cfg)
			_, err := Check(t.Context(), cfg)
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Check: %v", err)
				}
				return
			}
			var ce *CheckError
			if !errors.As(err, &ce) || !errors.Is(err, config.ErrUnusable) || len(ce.Problems) != len(tt.want) {
				t.Fatalf("Check = %v; want a CheckError with %d problems, which is config.ErrUnusable", err, len(tt.want))
			}
			for i, s := range tt.want {
				if !strings.Contains(ce.Problems[i].Error(), s) {
					t.Errorf("problem %d = %v, want it to say %q", i, ce.Problems[i], s)
				}
			}
			if _, err := os.Stat(images); !os.IsNotExist(err) {
				t.Errorf("Check made the images-dir: %v", err)
			}
		})
	}
}

// TestCheckAnotherBuildersImagesDir: an images-dir that a Python
// nodepool-builder used is a problem config-validate reports, as the builder
// would refuse it at start; nothing is written to it.
func TestCheckAnotherBuildersImagesDir(t *testing.T) {
	dir := t.TempDir()
	images := filepath.Join(dir, "images")
	os.MkdirAll(images, 0o755)
	build := "centos-0123456789abcdef0123456789abcdef.qcow2"
	for name, data := range map[string]string{"builder_id.txt": "python-builder\n", build: "data"} {
		if err := os.WriteFile(filepath.Join(images, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg := &config.Config{Path: filepath.Join(dir, "nodepool.yaml"), ImagesDir: images,
		Builder: config.Builder{StateDB: filepath.Join(images, "builder.db")}}
	_, err := Check(context.Background(), cfg)
	if !errors.Is(err, store.ErrForeignImagesDir) || !strings.Contains(err.Error(), build) ||
		!strings.Contains(err.Error(), "take-over-images-dir") {
		t.Fatalf("Check = %v; want the images-dir refused as another builder's, naming %s and what to do", err, build)
	}
	if entries, _ := os.ReadDir(images); len(entries) != 2 {
		t.Errorf("Check wrote to the images-dir: %d entries", len(entries))
	}
}

// TestCheckWarnings: what sends a credential over plain http, a Zuul token or
// an api-url's password, or a cloud's login, is a warning, not a problem, and
// names its zuul-image or provider; over https, or on a cloud without a login,
// there is none, and a password never shows in one. A cloud key the builder
// ignores though openstacksdk follows it, image_api_use_tasks, is one too.
func TestCheckWarnings(t *testing.T) {
	dir := t.TempDir()
	clouds := filepath.Join(dir, "clouds.yaml")
	if err := os.WriteFile(clouds, []byte(`clouds:
  glance: {auth_type: none, image_endpoint_override: 'http://127.0.0.1:9/'}
  plain:
    auth: {auth_url: 'http://keystone.example.org/v3', username: u, password: pw-c1, user_domain_name: Default, project_name: ci, project_domain_name: Default}
  tls:
    auth: {auth_url: 'https://keystone.example.org/v3', username: u, password: pw-c1, user_domain_name: Default, project_name: ci, project_domain_name: Default}
  tasks: {auth_type: none, image_endpoint_override: 'http://127.0.0.1:9/', image_api_use_tasks: true}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("OS_CLIENT_CONFIG_FILE", clouds)
	token := filepath.Join(dir, "token")
	os.WriteFile(token, []byte("tok\n"), 0o600)
	images := filepath.Join(dir, "images")
	cfg := &config.Config{
		Path:      filepath.Join(dir, "nodepool.yaml"),
		ImagesDir: images,
		ZuulImages: []config.ZuulImage{
			{Name: "token-http", APIURL: "http://zuul.example.org/", AuthTokenFile: token},
			{Name: "password-http", APIURL: "http://ci:pw-z1@zuul.example.org/"},
			{Name: "https", APIURL: "https://ci:pw-z1@zuul.example.org/", AuthTokenFile: token},
			{Name: "loopback", APIURL: "http://127.0.0.1:9000/"},
		},
		Providers: []config.Provider{{Name: "p-glance", Cloud: "glance"}, {Name: "p-plain", Cloud: "plain"}, {Name: "p-tls", Cloud: "tls"},
			{Name: "p-tasks", Cloud: "tasks"}},
		Builder: config.Builder{StateDB: filepath.Join(images, "builder.db")},
	}
	mqttPassword := filepath.Join(dir, "mqtt-password")
	os.WriteFile(mqttPassword, []byte("pw-m1\n"), 0o600)
	cfg.Builder.ZuulMQTT = &config.ZuulMQTT{URL: "mqtt://mqtt.example.org:1883", Host: "mqtt.example.org", Port: 1883,
		Username: "nodepool", PasswordFile: mqttPassword}
	warnings, err := Check(t.Context(), cfg)
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	want := []string{
		"provider p-plain (cloud plain): a login to this cloud sends auth.password over plain http://",
		"provider p-tasks (cloud tasks): clouds.yaml sets image_api_use_tasks, which the builder ignores",
		"zuul-image token-http: the Zuul token of auth-token-file is sent over plain http://",
		"zuul-image password-http: the credentials in api-url (user:password@) are sent over plain http:// to http://zuul.example.org/",
		"builder.zuul-mqtt: the password of password-file is sent over plain mqtt:// to mqtt://mqtt.example.org:1883",
	}
	if len(warnings) != len(want) {
		t.Fatalf("warnings = %q, want %d", warnings, len(want))
	}
	for i, w := range want {
		if !strings.HasPrefix(warnings[i], w) {
			t.Errorf("warning %d = %q, want it to begin %q", i, warnings[i], w)
		}
		if strings.Contains(warnings[i], "pw-") {
			t.Errorf("warning %d shows a password: %q", i, warnings[i])
		}
	}
}

// writeKeyPair writes a self-signed certificate and its key, the key with
// mode keyMode, and returns their paths.
func writeKeyPair(t *testing.T, dir, name string, keyMode os.FileMode) (cert, key string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, IsCA: true,
		BasicConstraintsValid: true, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	cert, key = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), keyMode); err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// TestCheckSecretFileModes: every file that holds a secret (the MQTT
// password-file and client-key, the zookeeper-tls key, a Zuul token, the
// clouds.yaml) that its group or other users may read is a warning naming
// it and the chmod that fixes it; at 0600 there is none, and a certificate,
// which is no secret, may be read by anyone.
func TestCheckSecretFileModes(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	clouds := write("clouds.yaml", "clouds:\n  c1: {auth_type: none, image_endpoint_override: 'http://127.0.0.1:9/'}\n")
	t.Setenv("OS_CLIENT_CONFIG_FILE", clouds)
	token := write("token", "tok\n")
	password := write("mqtt-password", "pw\n")
	secure := write("secure.conf", "diskimages: []\n")
	cloudsSecure := write("secure.yaml", "clouds:\n  c1: {auth: {password: pw}}\n")
	mqttCert, mqttKey := writeKeyPair(t, dir, "mqtt", 0o644)
	zkCert, zkKey := writeKeyPair(t, dir, "zk", 0o644)
	images := filepath.Join(dir, "images")
	cfg := &config.Config{
		Path:       filepath.Join(dir, "nodepool.yaml"),
		SecurePath: secure,
		ImagesDir:  images,
		ZuulImages: []config.ZuulImage{{Name: "z1", APIURL: "https://zuul.example.com/", AuthTokenFile: token}, {Name: "z2", APIURL: "https://zuul.example.com/", AuthTokenFile: token}},
		Providers:  []config.Provider{{Name: "p1", Cloud: "c1"}},
		ZooKeeper:  &config.ZooKeeper{TLS: &config.ZooKeeperTLS{Cert: zkCert, Key: zkKey, CA: zkCert}},
		Builder: config.Builder{StateDB: filepath.Join(images, "builder.db"), ZuulMQTT: &config.ZuulMQTT{
			URL: "mqtts://mqtt.example.com:8883", Host: "mqtt.example.com", Port: 8883, TLS: true,
			Username: "nodepool", PasswordFile: password, ClientCert: mqttCert, ClientKey: mqttKey}},
	}
	secrets := map[string]string{
		clouds: "clouds.yaml", token: "auth-token-file", password: "builder.zuul-mqtt password-file",
		mqttKey: "builder.zuul-mqtt client-key", zkKey: "zookeeper-tls key", secure: "the secure file",
		cloudsSecure: "clouds.yaml's secure.yaml",
	}
	warned := func() map[string]string {
		t.Helper()
		warnings, err := Check(t.Context(), cfg)
		if err != nil {
			t.Fatalf("Check: %v", err)
		}
		got := map[string]string{}
		for _, w := range warnings {
			for path := range secrets {
				if strings.Contains(w, path+" ") {
					if _, twice := got[path]; twice {
						t.Errorf("%s is warned of twice", path)
					}
					got[path] = w
				}
			}
			if strings.Contains(w, mqttCert) || strings.Contains(w, zkCert) {
				t.Errorf("a certificate readable by all is warned of: %q", w)
			}
		}
		return got
	}

	got := warned()
	for path, what := range secrets {
		w := got[path]
		if !strings.HasPrefix(w, what) || !strings.Contains(w, "can be read by every user of the host (mode 0644)") ||
			!strings.HasSuffix(w, "chmod 600 "+path) {
			t.Errorf("warning of %s (%s) = %q, want it named, its mode and chmod 600", what, path, w)
		}
	}
	for path := range secrets {
		os.Chmod(path, 0o640)
	}
	got = warned()
	for path := range secrets {
		if w := got[path]; !strings.Contains(w, "can be read by its group (mode 0640)") || !strings.HasSuffix(w, "chmod 600 "+path) {
			t.Errorf("warning of %s at 0640 = %q", path, w)
		}
	}
	for path := range secrets {
		os.Chmod(path, 0o600)
	}
	if got := warned(); len(got) != 0 {
		t.Errorf("warnings of files at 0600: %q", got)
	}
}

// TestSecretFileModesLogged: the daemon warns of a secret file others may read
// at start and when a reload (the Reload signal: auth-token-file is a setting
// of the builder's own) brings one in.
func TestSecretFileModesLogged(t *testing.T) {
	zuul := zuultest.NewServer(zuultest.ServerOptions{})
	t.Cleanup(zuul.Close)
	dir := t.TempDir()
	private, open := filepath.Join(dir, "private-token"), filepath.Join(dir, "open-token")
	os.WriteFile(private, []byte("tok\n"), 0o600)
	os.WriteFile(open, []byte("tok\n"), 0o644)
	text := func(token, every string) string {
		return strings.NewReplacer("{{ZUUL}}", zuul.URL(), "{{EVERY}}", every).Replace(zuulImage) + "    auth-token-file: " + token + "\n"
	}
	logs := &logBuffer{}
	r := newRig(t, text(open, "3600"), func(o *Options) { o.Logger = slog.New(slog.NewTextHandler(logs, nil)) })
	if logs.count("chmod 600 "+open) != 1 {
		t.Fatalf("the start does not warn of %s:\n%s", open, logs.b.String())
	}
	r.run()
	r.confirm(strings.Replace(text(private, "3600"), "%s", r.st.Dir(), 1))
	testenv.WaitFor(t, 10*time.Second, "the reload", func() bool { return r.b.Config().ZuulImage("zimg").AuthTokenFile == private })
	os.Chmod(private, 0o644)
	r.confirm(strings.Replace(text(private, "3599"), "%s", r.st.Dir(), 1))
	testenv.WaitFor(t, 10*time.Second, "the reload to warn of "+private, func() bool { return logs.count("chmod 600 "+private) == 1 })
}
