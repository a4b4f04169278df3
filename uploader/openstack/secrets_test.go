package openstack

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// openWith writes a clouds.yaml with one cloud "c" and opens it, logging at
// debug level into logs.
func openWith(t *testing.T, cloud string, logs *bytes.Buffer) *Cloud {
	t.Helper()
	file := filepath.Join(t.TempDir(), "clouds.yaml")
	if err := os.WriteFile(file, []byte("clouds:\n  c:\n"+cloud), 0o600); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	c, err := Open(t.Context(), Options{Cloud: "c", CloudsFile: file, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// withUserinfo puts user:password@ into an http URL.
func withUserinfo(u, user, password string) string {
	return strings.Replace(u, "http://", "http://"+user+":"+password+"@", 1)
}

// TestURLPasswordNeverShown: a password in the userinfo of auth_url or of
// image_endpoint_override is in no error and no log line of the cloud, at
// debug level, whether the login succeeds, is refused or finds no Keystone.
func TestURLPasswordNeverShown(t *testing.T) {
	const (
		secret    = "login-Pa55"
		urlSecret = "url-pw-73c1"
	)
	glance := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"images": []}`)
	}))
	t.Cleanup(glance.Close)
	ks := newIdentity(t, secret, withUserinfo(glance.URL, "g", urlSecret)+"/v2")
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	password := func(authURL, pw string) string {
		return "    auth:\n      auth_url: " + authURL + "\n      username: nodepool\n      password: " + pw +
			"\n      user_domain_name: Default\n      project_name: ci\n      project_domain_name: Default\n"
	}
	tests := []struct {
		name  string
		cloud string
		fails string // what the error says; "": the list succeeds
	}{
		{"login", password(withUserinfo(ks.URL, "ks", urlSecret)+"/v3", secret), ""},
		{"refused", password(withUserinfo(ks.URL, "ks", urlSecret)+"/v3", "wrong"), "Keystone at " + ks.URL + "/v3 (auth_url) refused"},
		{"no Keystone", password(withUserinfo(down.URL, "ks", urlSecret)+"/v3", secret), "reach Keystone at " + down.URL + "/v3"},
		{"no Glance", "    auth_type: none\n    image_endpoint_override: " + withUserinfo(down.URL, "g", urlSecret) + "\n", "connection refused"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs bytes.Buffer
			_, err := openWith(t, tt.cloud, &logs).List(t.Context(), map[string]string{"k": "v"})
			shown := logs.String()
			switch {
			case tt.fails == "" && err != nil:
				t.Fatalf("list: %v", err)
			case tt.fails != "" && (err == nil || !strings.Contains(err.Error(), tt.fails)):
				t.Fatalf("list = %v, want an error that says %q", err, tt.fails)
			case err != nil:
				shown += err.Error()
			}
			if !strings.Contains(shown, "127.0.0.1") {
				t.Fatalf("no URL was shown; the test lost its point:\n%s", shown)
			}
			if strings.Contains(shown, urlSecret) {
				t.Errorf("the URL's password shows:\n%s", shown)
			}
		})
	}
}

// TestPlainHTTPWarnings: a cloud whose login sends a secret to an http://
// auth_url is warned about, in the log and by Warnings, as verify: false is;
// over https, or without a login, nothing is.
func TestPlainHTTPWarnings(t *testing.T) {
	const domains = "      user_domain_name: Default\n      project_name: ci\n      project_domain_name: Default\n"
	tests := []struct {
		name  string
		cloud string
		want  []string
	}{
		{"password over http", "    auth:\n      auth_url: http://keystone.example.org:5000/v3\n      username: u\n      password: pw-1\n" + domains,
			[]string{"sends auth.password over plain http:// to Keystone at http://keystone.example.org:5000/v3"}},
		{"application credential and userinfo over http", "    auth:\n      auth_url: http://u:pw-2@keystone.example.org/v3\n" +
			"      application_credential_id: a\n      application_credential_secret: s\n",
			[]string{"sends auth.application_credential_secret and the user:password@ of auth_url over plain http:// to Keystone at http://keystone.example.org/v3"}},
		{"token over http", "    auth_type: token\n    auth:\n      auth_url: HTTP://keystone.example.org/v3\n      token: t\n",
			[]string{"sends auth.token over plain http://"}},
		{"verify false and https", "    verify: false\n    auth:\n      auth_url: https://keystone.example.org/v3\n      username: u\n      password: pw-1\n" + domains,
			[]string{"verify: false"}},
		{"no login", "    auth_type: none\n    image_endpoint_override: http://127.0.0.1:9292/\n    auth:\n      auth_url: http://keystone.example.org/v3\n", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs bytes.Buffer
			got := openWith(t, tt.cloud, &logs).Warnings()
			if len(got) != len(tt.want) {
				t.Fatalf("Warnings() = %q, want %d", got, len(tt.want))
			}
			for i, w := range tt.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("warning %q does not say %q", got[i], w)
				}
				if !strings.Contains(logs.String(), "level=WARN msg=\""+got[i]) {
					t.Errorf("warning %q not logged:\n%s", got[i], logs.String())
				}
			}
			if strings.Contains(logs.String()+strings.Join(got, ""), "pw-2") {
				t.Errorf("the password shows:\n%s", logs.String())
			}
		})
	}
}

// TestIgnoredKeyWarnings: a cloud that turns on image_api_use_tasks, with
// which openstacksdk uploads through a Glance task, is warned about, in the
// log and by Warnings, since the builder uploads with a PUT whatever it says;
// a cloud that turns it off, or does not set it, is not.
func TestIgnoredKeyWarnings(t *testing.T) {
	const glance = "    auth_type: none\n    image_endpoint_override: http://127.0.0.1:9292/\n"
	tests := []struct {
		value string // "" for no key
		warn  bool
	}{
		{"true", true},
		{"True", true},
		{"yes", true},
		{"'on'", true},
		{"1", true},
		{"false", false},
		{"no", false},
		{"'off'", false},
		{"0", false},
		{"", false},
	}
	for _, tt := range tests {
		t.Run(tt.value, func(t *testing.T) {
			cloud := glance
			if tt.value != "" {
				cloud += "    image-api-use-tasks: " + tt.value + "\n"
			}
			var logs bytes.Buffer
			got := openWith(t, cloud, &logs).Warnings()
			if !tt.warn {
				if len(got) != 0 {
					t.Errorf("Warnings() = %q, want none", got)
				}
				return
			}
			if len(got) != 1 || !strings.Contains(got[0], "image_api_use_tasks, which the builder ignores") {
				t.Fatalf("Warnings() = %q, want one that image_api_use_tasks is ignored", got)
			}
			if !strings.Contains(logs.String(), "level=WARN msg=\""+got[0]) {
				t.Errorf("warning %q not logged:\n%s", got[0], logs.String())
			}
		})
	}
}
