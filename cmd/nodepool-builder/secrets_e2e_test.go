package main

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// TestURLPasswordsShownNowhere: passwords in the userinfo of a zuul-image's
// api-url and of a cloud's auth_url show nowhere: not in a --once run at debug
// level, in text or JSON, whose upload to that cloud fails and whose poll of a
// tenant Zuul lacks fails; not in the listings, the state, config-validate, nor
// the daemon's log and status pages. The failures are reported, with the URLs
// shown without their userinfo; the credentials sent over plain http are warned
// about.
func TestURLPasswordsShownNowhere(t *testing.T) {
	const (
		zuulPassword     = "zuul-url-pw-4c1e"
		keystonePassword = "keystone-url-pw-8b2d"
		loginPassword    = "login-pw-61fa"
	)
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	// No Keystone answers there: the upload to the cloud that logs in fails.
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	keystone := "http://" + closed.Addr().String() + "/v3"
	closed.Close()
	clouds := filepath.Join(e.dir, "clouds.yaml")
	os.WriteFile(clouds, []byte(fmt.Sprintf(`clouds:
  glance:
    auth_type: none
    image_endpoint_override: %s
  locked:
    image_endpoint_override: %s
    auth:
      auth_url: %s
      username: nodepool
      password: %s
      user_domain_name: Default
      project_name: ci
      project_domain_name: Default
`, e.glance.Endpoint, e.glance.Endpoint, strings.Replace(keystone, "http://", "http://keystone:"+keystonePassword+"@", 1), loginPassword)), 0o600)
	t.Setenv("OS_CLIENT_CONFIG_FILE", clouds)
	webapp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := webapp.Addr().(*net.TCPAddr).Port
	webapp.Close()
	zuul := strings.Replace(e.zuul.URL(), "http://", "http://ci:"+zuulPassword+"@", 1)
	e.writeYAML(`images-dir: {{IMAGES}}
zuul-images:
  - name: debian
    api-url: ` + zuul + `
    tenant: example
    project: org/images
    job: build-debian
  - name: lost
    api-url: ` + zuul + `
    tenant: nowhere
    project: org/images
    job: build-debian
providers:
  - name: cloud-ok
    cloud: glance
    image-format: qcow2
    diskimages:
      - name: debian
      - name: lost
  - name: cloud-locked
    cloud: locked
    image-format: qcow2
    diskimages:
      - name: debian
builder:
  webapp:
    listen-address: 127.0.0.1
    port: ` + fmt.Sprint(port) + `
`)
	e.addBuild(e.makeImage(1), zuultest.BuildSpec{})

	var all bytes.Buffer
	text := e.run("--once", "--debug")
	all.WriteString(text.stdout + text.stderr)
	if text.code != exitFailed {
		t.Fatalf("--once exited %d, want %d (the locked cloud and the lost tenant fail):\n%s", text.code, exitFailed, text.stderr)
	}
	zuulRoot := e.zuul.URL()
	for _, want := range []string{
		"level=DEBUG",
		"reach Keystone at " + keystone, // the failed upload, in the log and the summary
		"Zuul at " + strings.TrimSuffix(zuulRoot, "/") + "/ has no tenant \"nowhere\"",
		"sends auth.password and the user:password@ of auth_url over plain http:// to Keystone at " + keystone,
		"the credentials in api-url (user:password@) are sent over plain http:// to " + strings.TrimSuffix(zuulRoot, "/") + "/",
	} {
		if !strings.Contains(text.stderr, want) {
			t.Errorf("--once does not say %q:\n%s", want, text.stderr)
		}
	}
	if imgs := e.images("cloud-ok"); len(imgs) != 1 {
		t.Errorf("cloud-ok holds %d images, want the debian upload", len(imgs))
	}
	js := e.run("--once", "--debug", "--log-format", "json")
	all.WriteString(js.stdout + js.stderr)
	if js.code != exitFailed || !strings.Contains(js.stderr, `"exit_code":1`) || !strings.Contains(js.stderr, `has no tenant`) {
		t.Errorf("--once --log-format json exited %d, want %d and the failure reported:\n%s", js.code, exitFailed, js.stderr)
	}
	var failed bool
	for _, u := range e.uploadsJSON() {
		if u.Provider == "cloud-locked" && u.State == "failed" && strings.Contains(u.Reason, "reach Keystone at "+keystone) {
			failed = true
		}
	}
	if !failed {
		t.Errorf("no failed upload to cloud-locked says why: %+v", e.uploadsJSON())
	}
	for _, args := range [][]string{{"image-list", "--json"}, {"image-list"}, {"dib-image-list", "--json"}, {"image-status", "--json"},
		{"image-status"}, {"config-validate"}} {
		r := e.run(args...)
		all.WriteString(r.stdout + r.stderr)
	}

	d := startDaemon(t, e.cfgPath, "--debug")
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	d.waitLog(t, 30*time.Second, "url="+base+"/")
	d.waitLog(t, 30*time.Second, `has no tenant \"nowhere\"`)
	var page string
	for _, path := range []string{"/image-list.json", "/dib-image-list.json", "/image-status.json", "/image-list", "/image-status", "/"} {
		code, body := httpGet(t, base+path)
		if code != 200 {
			t.Fatalf("%s: %d\n%s", path, code, body)
		}
		page += body
	}
	if !strings.Contains(page, "reach Keystone at "+keystone) {
		t.Errorf("the status pages do not show why the upload failed:\n%s", page)
	}
	all.WriteString(page)
	d.stop(t, 30*time.Second)
	all.WriteString(d.logs.String())
	entries, _ := os.ReadDir(e.imagesDir())
	for _, f := range entries {
		if name := f.Name(); strings.HasPrefix(name, "builder.db") || strings.HasSuffix(name, ".json") {
			data, _ := os.ReadFile(filepath.Join(e.imagesDir(), name))
			all.Write(data)
		}
	}
	for _, secret := range []string{zuulPassword, keystonePassword, loginPassword} {
		if i := strings.Index(all.String(), secret); i >= 0 {
			t.Errorf("%q shows: ...%s...", secret, all.String()[max(0, i-200):min(all.Len(), i+50)])
		}
	}
}
