package openstack

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gophercloud/gophercloud/v2"

	"github.com/nodepool-builder/nodepool-builder/uploader"
)

func writeFile(t *testing.T, path, content string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// searchRoot makes a root for the files openstacksdk searches: the working
// directory is <root>/<cwd>, $HOME is <root>/home, and no variable names a
// file or XDG_CONFIG_HOME. It returns the root.
func searchRoot(t *testing.T, cwd string) string {
	t.Helper()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, cwd), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Chdir(filepath.Join(root, cwd))
	t.Setenv("HOME", filepath.Join(root, "home"))
	for _, env := range []string{"XDG_CONFIG_HOME", "OS_CLIENT_CONFIG_FILE", "OS_CLIENT_SECURE_FILE"} {
		t.Setenv(env, "")
	}
	return root
}

func TestFindCloudsFile(t *testing.T) {
	const yml = "clouds: {}\n"
	tests := []struct {
		name     string
		files    []string // relative to the test root: work/ is the working directory, home/ is $HOME
		env      string   // OS_CLIENT_CONFIG_FILE relative to the root, "" for unset
		xdg      bool     // set XDG_CONFIG_HOME to root/xdg
		explicit string   // Options.CloudsFile relative to the root
		want     string   // relative to the root; "" when an error is expected
		wantErr  []string // substrings of the error, relative paths made absolute
	}{
		{
			name:  "environment first",
			files: []string{"env/clouds.yaml", "work/clouds.yaml", "home/.config/openstack/clouds.yaml"},
			env:   "env/clouds.yaml",
			want:  "env/clouds.yaml",
		},
		{
			name:  "environment file missing falls through",
			files: []string{"work/clouds.yaml"},
			env:   "env/clouds.yaml",
			want:  "work/clouds.yaml",
		},
		{
			name:  "working directory before home",
			files: []string{"work/clouds.yaml", "home/.config/openstack/clouds.yaml"},
			want:  "work/clouds.yaml",
		},
		{
			name:  "home",
			files: []string{"home/.config/openstack/clouds.yaml"},
			want:  "home/.config/openstack/clouds.yaml",
		},
		{
			name:  "XDG_CONFIG_HOME before ~/.config",
			files: []string{"xdg/openstack/clouds.yaml", "home/.config/openstack/clouds.yaml"},
			xdg:   true,
			want:  "xdg/openstack/clouds.yaml",
		},
		{
			name:     "explicit file wins",
			files:    []string{"env/clouds.yaml", "elsewhere/mine.yaml"},
			env:      "env/clouds.yaml",
			explicit: "elsewhere/mine.yaml",
			want:     "elsewhere/mine.yaml",
		},
		{
			name:     "explicit file missing is not replaced",
			files:    []string{"work/clouds.yaml"},
			explicit: "elsewhere/mine.yaml",
			wantErr:  []string{"no clouds.yaml found", "elsewhere/mine.yaml"},
		},
		{
			name:    "nothing found names every place searched",
			env:     "env/clouds.yaml",
			wantErr: []string{"env/clouds.yaml", "work/clouds.yaml", "home/.config/openstack/clouds.yaml", "/etc/openstack/clouds.yaml", "OS_CLIENT_CONFIG_FILE"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.want == "" && tt.explicit == "" {
				if _, err := os.Stat("/etc/openstack/clouds.yaml"); err == nil {
					t.Skip("this machine has /etc/openstack/clouds.yaml")
				}
			}
			root := searchRoot(t, "work")
			for _, f := range tt.files {
				writeFile(t, filepath.Join(root, f), yml)
			}
			if tt.xdg {
				t.Setenv("XDG_CONFIG_HOME", filepath.Join(root, "xdg"))
			}
			if tt.env != "" {
				t.Setenv("OS_CLIENT_CONFIG_FILE", filepath.Join(root, tt.env))
			}
			explicit := ""
			if tt.explicit != "" {
				explicit = filepath.Join(root, tt.explicit)
			}

			got, _, err := findCloudsFile(explicit)
			if tt.want != "" {
				if err != nil {
					t.Fatal(err)
				}
				if want := filepath.Join(root, tt.want); got != want {
					t.Errorf("found %s, want %s", got, want)
				}
				return
			}
			if err == nil {
				t.Fatalf("found %s, want an error", got)
			}
			for _, s := range tt.wantErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
			if tt.explicit != "" && strings.Contains(err.Error(), "work/clouds.yaml") {
				t.Errorf("error %q searched beyond the explicit file", err)
			}
		})
	}
}

func TestOpen(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		secure  string // secure.yaml beside clouds.yaml
		opts    Options
		check   func(t *testing.T, c *Cloud)
		wantErr []string
	}{
		{
			name: "password",
			yaml: `
clouds:
  other: {auth_type: none, image_endpoint_override: http://x}
  mycloud:
    region_name: RegionOne
    image_format: raw
    auth:
      auth_url: https://keystone.example.com:5000/v3
      username: nodepool
      password: s3cret
      project_name: ci
      project_domain_name: CiDomain
      user_domain_name: UserDomain
`,
			opts: Options{Cloud: "mycloud"},
			check: func(t *testing.T, c *Cloud) {
				want := gophercloud.AuthOptions{
					IdentityEndpoint: "https://keystone.example.com:5000/v3",
					Username:         "nodepool",
					Password:         "s3cret",
					DomainName:       "UserDomain",
					AllowReauth:      true,
					Scope:            &gophercloud.AuthScope{ProjectName: "ci", DomainName: "CiDomain"},
				}
				checkAuth(t, c, want)
				if c.endpointOpts.Region != "RegionOne" || c.endpointOpts.Availability != gophercloud.AvailabilityPublic {
					t.Errorf("endpoint options = %+v", c.endpointOpts)
				}
				if c.ImageFormat() != "raw" {
					t.Errorf("image format = %q, want raw", c.ImageFormat())
				}
				if c.override != "" {
					t.Errorf("override = %q, want the catalog", c.override)
				}
			},
		},
		{
			name: "password with domain_name standing in for both domains, region from options",
			yaml: `
clouds:
  mycloud:
    region_name: RegionOne
    interface: internal
    auth:
      auth_url: https://keystone.example.com/v3
      username: nodepool
      password: s3cret
      project_id: 0123abcd
      domain_name: Default
`,
			opts: Options{Cloud: "mycloud", Region: "RegionTwo"},
			check: func(t *testing.T, c *Cloud) {
				checkAuth(t, c, gophercloud.AuthOptions{
					IdentityEndpoint: "https://keystone.example.com/v3",
					Username:         "nodepool",
					Password:         "s3cret",
					DomainName:       "Default",
					AllowReauth:      true,
					Scope:            &gophercloud.AuthScope{ProjectID: "0123abcd"},
				})
				if c.endpointOpts.Region != "RegionTwo" || c.endpointOpts.Availability != gophercloud.AvailabilityInternal {
					t.Errorf("endpoint options = %+v, want RegionTwo internal", c.endpointOpts)
				}
				if c.ImageFormat() != "" {
					t.Errorf("image format = %q, want unset", c.ImageFormat())
				}
			},
		},
		{
			name: "password kept in secure.yaml",
			yaml: `
clouds:
  mycloud:
    auth:
      auth_url: https://keystone.example.com/v3
      username: nodepool
      project_name: ci
      project_domain_id: default
      user_domain_id: default
`,
			secure: `
clouds:
  mycloud:
    auth:
      password: from-secure
`,
			opts: Options{Cloud: "mycloud"},
			check: func(t *testing.T, c *Cloud) {
				checkAuth(t, c, gophercloud.AuthOptions{
					IdentityEndpoint: "https://keystone.example.com/v3",
					Username:         "nodepool",
					Password:         "from-secure",
					DomainID:         "default",
					AllowReauth:      true,
					Scope:            &gophercloud.AuthScope{ProjectName: "ci", DomainID: "default"},
				})
			},
		},
		{
			name: "application credential",
			yaml: `
clouds:
  appcred:
    auth_type: v3applicationcredential
    region_name: RegionOne
    auth:
      auth_url: https://keystone.example.com/v3
      application_credential_id: 21dced0fd20347869b93710d2b98aae0
      application_credential_secret: app-secret
`,
			opts: Options{Cloud: "appcred"},
			check: func(t *testing.T, c *Cloud) {
				checkAuth(t, c, gophercloud.AuthOptions{
					IdentityEndpoint:            "https://keystone.example.com/v3",
					ApplicationCredentialID:     "21dced0fd20347869b93710d2b98aae0",
					ApplicationCredentialSecret: "app-secret",
					AllowReauth:                 true,
				})
			},
		},
		{
			name: "application credential without auth_type, with an override",
			yaml: `
clouds:
  appcred:
    image_endpoint_override: https://glance.example.com:9292/v2/
    auth:
      auth_url: https://keystone.example.com/v3
      application_credential_name: builder
      application_credential_secret: app-secret
      username: nodepool
      user_domain_name: Default
`,
			opts: Options{Cloud: "appcred"},
			check: func(t *testing.T, c *Cloud) {
				checkAuth(t, c, gophercloud.AuthOptions{
					IdentityEndpoint:            "https://keystone.example.com/v3",
					Username:                    "nodepool",
					DomainName:                  "Default",
					ApplicationCredentialName:   "builder",
					ApplicationCredentialSecret: "app-secret",
					AllowReauth:                 true,
				})
				if c.override != "https://glance.example.com:9292/" {
					t.Errorf("override = %q", c.override)
				}
			},
		},
		{
			name: "none with override",
			yaml: `
clouds:
  standalone:
    auth_type: none
    image_endpoint_override: http://127.0.0.1:9292
    image_format: qcow2
`,
			opts: Options{Cloud: "standalone"},
			check: func(t *testing.T, c *Cloud) {
				if c.auth != nil {
					t.Errorf("auth = %+v, want none", c.auth)
				}
				if c.override != "http://127.0.0.1:9292/" {
					t.Errorf("override = %q", c.override)
				}
				if c.ImageFormat() != "qcow2" {
					t.Errorf("image format = %q", c.ImageFormat())
				}
			},
		},
		{
			name: "dashes in keys as openstacksdk allows",
			yaml: `
clouds:
  standalone:
    auth-type: none
    image-endpoint-override: http://glance.internal/image
    image-format: vhd
`,
			opts: Options{Cloud: "standalone"},
			check: func(t *testing.T, c *Cloud) {
				if c.auth != nil || c.override != "http://glance.internal/image/" || c.ImageFormat() != "vhd" {
					t.Errorf("auth %v, override %q, format %q", c.auth, c.override, c.ImageFormat())
				}
			},
		},
		{
			name:    "none without override",
			yaml:    "clouds:\n  standalone:\n    auth_type: none\n",
			opts:    Options{Cloud: "standalone"},
			wantErr: []string{`"standalone"`, "auth_type none needs image_endpoint_override"},
		},
		{
			name:    "override that is not a URL",
			yaml:    "clouds:\n  standalone:\n    auth_type: none\n    image_endpoint_override: glance:9292\n",
			opts:    Options{Cloud: "standalone"},
			wantErr: []string{"not an http(s) URL"},
		},
		{
			name:    "missing cloud",
			yaml:    "clouds:\n  beta: {auth_type: none, image_endpoint_override: http://b}\n  alpha: {auth_type: none, image_endpoint_override: http://a}\n",
			opts:    Options{Cloud: "gamma"},
			wantErr: []string{`cloud "gamma" is not defined in`, "clouds.yaml", "it defines: alpha, beta", "OS_CLIENT_CONFIG_FILE"},
		},
		{
			name:    "no cloud name",
			yaml:    "clouds: {}\n",
			opts:    Options{},
			wantErr: []string{"no cloud name"},
		},
		{
			name:    "unsupported auth type",
			yaml:    "clouds:\n  sso:\n    auth_type: v3oidcpassword\n    auth: {auth_url: https://k/v3}\n",
			opts:    Options{Cloud: "sso"},
			wantErr: []string{`auth_type "v3oidcpassword" is not supported`, "v3applicationcredential"},
		},
		{
			name:    "no auth_url",
			yaml:    "clouds:\n  c:\n    auth: {username: u, password: p}\n",
			opts:    Options{Cloud: "c"},
			wantErr: []string{`open cloud "c"`, "auth_url is not set"},
		},
		{
			name:    "username without a domain",
			yaml:    "clouds:\n  c:\n    auth: {auth_url: https://k/v3, username: u, password: p, project_id: x}\n",
			opts:    Options{Cloud: "c"},
			wantErr: []string{"user_domain_name"},
		},
		{
			name:    "project name without a domain",
			yaml:    "clouds:\n  c:\n    auth: {auth_url: https://k/v3, username: u, password: p, project_name: ci, user_domain_id: default}\n",
			opts:    Options{Cloud: "c"},
			wantErr: []string{"project_domain"},
		},
		{
			name:    "vendor profile",
			yaml:    "clouds:\n  v:\n    profile: vexxhost\n    auth: {auth_url: https://k/v3, username: u, password: p}\n",
			opts:    Options{Cloud: "v"},
			wantErr: []string{`profile "vexxhost" is not supported`},
		},
		{
			name:    "broken yaml",
			yaml:    "clouds: [\n",
			opts:    Options{Cloud: "c"},
			wantErr: []string{"parse ", "clouds.yaml"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			tt.opts.CloudsFile = writeFile(t, filepath.Join(dir, "clouds.yaml"), tt.yaml)
			if tt.secure != "" {
				writeFile(t, filepath.Join(dir, "secure.yaml"), tt.secure)
			}
			c, err := Open(context.Background(), tt.opts)
			if len(tt.wantErr) > 0 {
				if err == nil {
					t.Fatal("Open succeeded, want an error")
				}
				for _, s := range tt.wantErr {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not mention %q", err, s)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, c)
		})
	}
}

func checkAuth(t *testing.T, c *Cloud, want gophercloud.AuthOptions) {
	t.Helper()
	if c.auth == nil {
		t.Fatal("no auth options, want some")
	}
	got := *c.auth
	if (got.Scope == nil) != (want.Scope == nil) || (got.Scope != nil && *got.Scope != *want.Scope) {
		t.Errorf("scope = %+v, want %+v", got.Scope, want.Scope)
	}
	got.Scope, want.Scope = nil, nil
	if got != want {
		t.Errorf("auth options =\n%+v\nwant\n%+v", got, want)
	}
}

// TestOpenIsLazy shows that Open does not log in and that a failed login is tried again
// on the next call instead of being remembered.
func TestOpenIsLazy(t *testing.T) {
	var calls atomic.Int32
	keystone := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		http.Error(w, "keystone is down", http.StatusServiceUnavailable)
	}))
	defer keystone.Close()
	clouds := writeFile(t, filepath.Join(t.TempDir(), "clouds.yaml"), `
clouds:
  down:
    auth:
      auth_url: `+keystone.URL+`/v3
      username: u
      user_domain_id: default
      password: p
      project_id: abc
`)
	c, err := Open(context.Background(), Options{Cloud: "down", CloudsFile: clouds})
	if err != nil {
		t.Fatal(err)
	}
	if n := calls.Load(); n != 0 {
		t.Fatalf("Open made %d requests, want none", n)
	}
	for attempt := 1; attempt <= 2; attempt++ {
		_, err = c.Get(context.Background(), "some-id")
		if err == nil || !strings.Contains(err.Error(), "authenticate to cloud down") {
			t.Fatalf("Get error = %v, want a login failure naming the cloud", err)
		}
		if n := calls.Load(); n < int32(attempt) {
			t.Fatalf("after %d calls keystone saw %d requests; a failed login must be retried (err %v)", attempt, n, err)
		}
	}
}

func TestRefusedNames(t *testing.T) {
	clouds := writeFile(t, filepath.Join(t.TempDir(), "clouds.yaml"),
		"clouds:\n  c: {auth_type: none, image_endpoint_override: http://127.0.0.1:1}\n")
	c, err := Open(context.Background(), Options{Cloud: "c", CloudsFile: clouds})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := c.Create(ctx, uploader.ImageSpec{Name: "x", DiskFormat: "raw", Properties: map[string]string{"visibility": "public"}}); err == nil || !strings.Contains(err.Error(), `"visibility" is a Glance image field`) {
		t.Errorf("Create with a core field as property: err = %v", err)
	}
	for _, key := range []string{"marker", "status"} {
		if _, err := c.List(ctx, map[string]string{key: "x"}); err == nil || !strings.Contains(err.Error(), "not a property") {
			t.Errorf("List filtering on %q: err = %v", key, err)
		}
	}
}

func TestBodyDetail(t *testing.T) {
	tests := []struct {
		name   string
		body   string
		status int
		want   string
	}{
		{
			name:   "glance html page",
			body:   "<html>\n <head>\n  <title>404 Not Found</title>\n </head>\n <body>\n  <h1>404 Not Found</h1>\n  No image found with ID abc<br /><br />\n\n\n\n </body>\n</html>",
			status: 404,
			want:   "No image found with ID abc",
		},
		{
			name:   "glance json",
			body:   `{"message": "No image found with ID abc \n\n\n", "code": "404 Not Found", "title": "Not Found"}`,
			status: 404,
			want:   "No image found with ID abc",
		},
		{
			name:   "nested json message",
			body:   `{"error": {"message": "quota exceeded", "code": 413}}`,
			status: 413,
			want:   "quota exceeded",
		},
		{
			name:   "json without a message stays whole",
			body:   `{"error": {"code": 401, "title": "Unauthorized"}}`,
			status: 401,
			want:   `{"error": {"code": 401, "title": "Unauthorized"}}`,
		},
		{name: "empty", body: "", status: 500, want: ""},
		{
			name:   "long body is cut",
			body:   strings.Repeat("é", 400),
			status: 500,
			want:   strings.Repeat("é", 300) + "...",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := bodyDetail([]byte(tt.body), tt.status); got != tt.want {
				t.Errorf("bodyDetail = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestCloudNamesAreTakenAsWritten: openstacksdk turns "-" into "_" in option
// names only; a cloud's name is looked up exactly as clouds.yaml and
// secure.yaml write it.
func TestCloudNamesAreTakenAsWritten(t *testing.T) {
	tests := []struct {
		name    string
		clouds  []string // names written in clouds.yaml, each a standalone Glance
		secure  bool     // the first cloud's override is in secure.yaml under the same name
		open    string
		want    string // the override the opened cloud got; "" when Open must fail
		wantErr string
	}{
		{name: "dash", clouds: []string{"cloud-a"}, open: "cloud-a", want: "http://cloud-a/"},
		{name: "dash beside underscore", clouds: []string{"cloud-a", "cloud_a"}, open: "cloud-a", want: "http://cloud-a/"},
		{name: "underscore beside dash", clouds: []string{"cloud-a", "cloud_a"}, open: "cloud_a", want: "http://cloud_a/"},
		{name: "dot", clouds: []string{"ovh.gra1"}, open: "ovh.gra1", want: "http://ovh.gra1/"},
		{name: "capitals", clouds: []string{"VexxHost-SJC1"}, open: "VexxHost-SJC1", want: "http://VexxHost-SJC1/"},
		{name: "dash in secure.yaml", clouds: []string{"cloud-a"}, secure: true, open: "cloud-a", want: "http://secret-cloud-a/"},
		{name: "no underscore for a dash", clouds: []string{"cloud_a"}, open: "cloud-a", wantErr: `cloud "cloud-a" is not defined`},
		{name: "no other case", clouds: []string{"Cloud"}, open: "cloud", wantErr: `cloud "cloud" is not defined`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			var b strings.Builder
			b.WriteString("clouds:\n")
			for i, name := range tt.clouds {
				fmt.Fprintf(&b, "  %q:\n    auth-type: none\n", name)
				if i > 0 || !tt.secure {
					fmt.Fprintf(&b, "    image-endpoint-override: http://%s\n", name)
				}
			}
			file := writeFile(t, filepath.Join(dir, "clouds.yaml"), b.String())
			if tt.secure {
				writeFile(t, filepath.Join(dir, "secure.yaml"), fmt.Sprintf(
					"clouds:\n  %q:\n    image-endpoint-override: http://secret-%s\n", tt.clouds[0], tt.clouds[0]))
			}
			c, err := Open(context.Background(), Options{Cloud: tt.open, CloudsFile: file})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Open(%q) = %v, want an error saying %q", tt.open, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Open(%q): %v", tt.open, err)
			}
			if c.override != tt.want || c.Name() != tt.open {
				t.Errorf("Open(%q) got cloud %q at %q, want %q", tt.open, c.Name(), c.override, tt.want)
			}
		})
	}
}

// TestEachPlaceNamedOnce: when OS_CLIENT_CONFIG_FILE names a place the search
// looks anyway (the systemd unit's /etc/openstack/clouds.yaml), or the working
// directory is one of the search directories, an error names each file once;
// and the file in use is not named again among those searched.
func TestEachPlaceNamedOnce(t *testing.T) {
	if _, err := os.Stat("/etc/openstack/clouds.yaml"); err == nil {
		t.Skip("this machine has /etc/openstack/clouds.yaml")
	}
	const other = "clouds:\n  other: {auth_type: none, image_endpoint_override: http://x}\n"
	tests := []struct {
		name    string
		files   []string // relative to the test root; home/ is $HOME
		env     string   // OS_CLIENT_CONFIG_FILE: relative to the root, or absolute
		cwd     string   // relative to the root
		wantErr []string
	}{
		{name: "environment names the system file", env: "/etc/openstack/clouds.yaml", cwd: "work",
			wantErr: []string{"no clouds.yaml found"}},
		{name: "environment names the working directory's file", env: "work/clouds.yaml", cwd: "work",
			wantErr: []string{"no clouds.yaml found"}},
		{name: "working directory is the user's", cwd: "home/.config/openstack",
			wantErr: []string{"no clouds.yaml found"}},
		{name: "cloud missing from the file in use", files: []string{"work/clouds.yaml"}, env: "work/clouds.yaml", cwd: "work",
			wantErr: []string{`cloud "mycloud" is not defined in`, "it defines: other", "the only one read"}},
		{name: "cloud missing, another file not read", files: []string{"work/clouds.yaml", "home/.config/openstack/clouds.yaml"}, cwd: "work",
			wantErr: []string{`cloud "mycloud" is not defined in`, "clouds.yaml is not)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := searchRoot(t, tt.cwd)
			for _, f := range tt.files {
				writeFile(t, filepath.Join(root, f), other)
			}
			if tt.env != "" {
				env := tt.env
				if !filepath.IsAbs(env) {
					env = filepath.Join(root, env)
				}
				t.Setenv("OS_CLIENT_CONFIG_FILE", env)
			}
			_, err := Open(context.Background(), Options{Cloud: "mycloud"})
			if err == nil {
				t.Fatal("Open succeeded, want an error")
			}
			for _, s := range tt.wantErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
			for _, p := range []string{filepath.Join(root, tt.cwd, "clouds.yaml"), filepath.Join(root, "home/.config/openstack/clouds.yaml"),
				"/etc/openstack/clouds.yaml"} {
				// Every place is named when none has a file; else those that matter.
				n := strings.Count(err.Error(), p)
				if n > 1 || (n == 0 && strings.Contains(err.Error(), "no clouds.yaml found")) {
					t.Errorf("error names %s %d times, want once:\n%s", p, n, err)
				}
			}
		})
	}
}

// TestSecureFileFound: the secure.yaml merged over the cloud is
// $OS_CLIENT_SECURE_FILE, else the one beside the clouds.yaml that
// $OS_CLIENT_CONFIG_FILE (or Options.CloudsFile) names when that is the file
// read, else the first in openstacksdk's search directories. Each secure.yaml
// here gives the cloud an endpoint that names it.
func TestSecureFileFound(t *testing.T) {
	if _, err := os.Stat("/etc/openstack/secure.yaml"); err == nil {
		t.Skip("this machine has /etc/openstack/secure.yaml")
	}
	tests := []struct {
		name     string
		clouds   string   // the clouds.yaml, relative to the root
		secure   []string // secure.yaml files, relative to the root
		env      string   // OS_CLIENT_CONFIG_FILE relative to the root, "" for unset
		explicit bool     // Options.CloudsFile names clouds instead
		secEnv   string   // OS_CLIENT_SECURE_FILE relative to the root, "" for unset
		want     string   // the secure.yaml merged; "" for none
	}{
		{name: "beside OS_CLIENT_CONFIG_FILE", clouds: "etc/clouds.yaml", secure: []string{"etc/secure.yaml"},
			env: "etc/clouds.yaml", want: "etc/secure.yaml"},
		{name: "beside it before the search directories", clouds: "etc/clouds.yaml",
			secure: []string{"etc/secure.yaml", "work/secure.yaml", "home/.config/openstack/secure.yaml"},
			env:    "etc/clouds.yaml", want: "etc/secure.yaml"},
		{name: "OS_CLIENT_SECURE_FILE before it", clouds: "etc/clouds.yaml", secure: []string{"etc/secure.yaml", "sec/mine.yaml"},
			env: "etc/clouds.yaml", secEnv: "sec/mine.yaml", want: "sec/mine.yaml"},
		{name: "none beside: the search directories", clouds: "etc/clouds.yaml", secure: []string{"home/.config/openstack/secure.yaml"},
			env: "etc/clouds.yaml", want: "home/.config/openstack/secure.yaml"},
		{name: "not beside a named file that is missing", clouds: "work/clouds.yaml",
			secure: []string{"etc/secure.yaml", "home/.config/openstack/secure.yaml"},
			env:    "etc/clouds.yaml", want: "home/.config/openstack/secure.yaml"},
		{name: "searched clouds.yaml", clouds: "home/.config/openstack/clouds.yaml",
			secure: []string{"work/secure.yaml", "home/.config/openstack/secure.yaml"}, want: "work/secure.yaml"},
		{name: "none", clouds: "etc/clouds.yaml", env: "etc/clouds.yaml"},
		{name: "Options.CloudsFile: beside it", clouds: "etc/clouds.yaml", secure: []string{"etc/secure.yaml", "work/secure.yaml"},
			explicit: true, want: "etc/secure.yaml"},
		{name: "Options.CloudsFile: OS_CLIENT_SECURE_FILE before it", clouds: "etc/clouds.yaml",
			secure: []string{"etc/secure.yaml", "sec/mine.yaml"}, explicit: true, secEnv: "sec/mine.yaml", want: "sec/mine.yaml"},
		{name: "Options.CloudsFile: none beside", clouds: "etc/clouds.yaml", secure: []string{"work/secure.yaml"},
			explicit: true, want: "work/secure.yaml"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := searchRoot(t, "work")
			clouds := writeFile(t, filepath.Join(root, tt.clouds),
				"clouds:\n  c: {auth_type: none, image_endpoint_override: http://clouds.yaml}\n")
			for _, f := range tt.secure {
				writeFile(t, filepath.Join(root, f), fmt.Sprintf("clouds:\n  c: {image_endpoint_override: http://%s}\n", f))
			}
			if tt.env != "" {
				t.Setenv("OS_CLIENT_CONFIG_FILE", filepath.Join(root, tt.env))
			}
			if tt.secEnv != "" {
				t.Setenv("OS_CLIENT_SECURE_FILE", filepath.Join(root, tt.secEnv))
			}
			opts := Options{Cloud: "c"}
			if tt.explicit {
				opts.CloudsFile = clouds
			}
			c, err := Open(context.Background(), opts)
			if err != nil {
				t.Fatal(err)
			}
			want := "http://clouds.yaml/"
			if tt.want != "" {
				want = "http://" + tt.want + "/"
			}
			if c.override != want {
				t.Errorf("the cloud's endpoint is %s, want %s: the wrong secure.yaml was merged", c.override, want)
			}
		})
	}
}
