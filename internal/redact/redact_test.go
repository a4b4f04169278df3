package redact

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing"
)

func TestURL(t *testing.T) {
	tests := []struct{ in, want string }{
		{"https://example.com/img.qcow2", "https://example.com/img.qcow2"},
		{"https://example.com/img.qcow2?X-Amz-Signature=abc&X-Amz-Credential=k", "https://example.com/img.qcow2?REDACTED"},
		{"https://user:pass@example.com:8443/a/b?sig=1#frag", "https://example.com:8443/a/b?REDACTED#frag"},
		{"http://token@example.com/a", "http://example.com/a"},
		{"https://example.com/a?", "https://example.com/a?"},
		{"https://example.com/a%20b?x=1", "https://example.com/a%20b?REDACTED"},
		{"/relative/path?temp_url_sig=abc", "/relative/path?REDACTED"},
		{"", ""},
		// Bad escapes do not parse: the query goes anyway, and so does userinfo.
		{"https://example.com/%zz?sig=abc", "https://example.com/%zz?REDACTED"},
		{"https://user:pass@example.com/%zz", "https://example.com/%zz"},
		{"https://u:p@h/%zz?a@b", "https://h/%zz?REDACTED"},
		{"not a url %zz ? secret", "not a url %zz ?REDACTED"},
	}
	for _, tt := range tests {
		if got := URL(tt.in); got != tt.want {
			t.Errorf("URL(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestText(t *testing.T) {
	tests := []struct{ in, want string }{
		{"no url here", "no url here"},
		{`Get "https://h/p?sig=abc": dial tcp 127.0.0.1:1: connect: connection refused`,
			`Get "https://h/p?REDACTED": dial tcp 127.0.0.1:1: connect: connection refused`},
		{"download k from https://h/p?sig=abc: gave up after 3 attempts",
			"download k from https://h/p?REDACTED: gave up after 3 attempts"},
		{"two: http://a/x?s=1 and HTTPS://u:p@b/y?t=2.", "two: http://a/x?REDACTED and https://b/y?REDACTED."},
		{"url=https://h/p?s=1\nnext line", "url=https://h/p?REDACTED\nnext line"},
		{"(see <https://h/p?s=1>)", "(see <https://h/p?REDACTED>)"},
		{"ftp://u:p@h/x?s=1 is not ours", "ftp://h/x?s=1 is not ours"},
		{"ünïcödé before https://h/?s=1 after", "ünïcödé before https://h/?REDACTED after"},
		{"ends with https://", "ends with https://"},
	}
	for _, tt := range tests {
		if got := Text(tt.in); got != tt.want {
			t.Errorf("Text(%q) =\n  %q, want\n  %q", tt.in, got, tt.want)
		}
	}
}

func TestError(t *testing.T) {
	if Error(nil) != nil {
		t.Fatal("Error(nil) is not nil")
	}
	inner := fmt.Errorf(`Get "https://h/p?sig=topsecret": %w`, fs.ErrNotExist)
	err := Error(inner)
	if strings.Contains(err.Error(), "topsecret") {
		t.Errorf("message %q carries the secret", err)
	}
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("errors.Is lost the wrapped error")
	}
	wrapped := fmt.Errorf("outer: %w", err)
	if strings.Contains(wrapped.Error(), "topsecret") || !errors.Is(wrapped, fs.ErrNotExist) {
		t.Errorf("wrapping the redacted error: %q", wrapped)
	}
	if Error(err) != err {
		t.Errorf("redacting twice wraps twice")
	}
}

func TestUserinfo(t *testing.T) {
	tests := []struct{ in, want string }{
		{"no url here", "no url here"},
		{"mail me at someone@example.org", "mail me at someone@example.org"},
		{"Zuul at https://user:s3cret@zuul.example.org/ has no tenant", "Zuul at https://zuul.example.org/ has no tenant"},
		// Queries stay: they say what was asked.
		{`GET "http://u:p@h:9000/api/tenant/t/builds?project=p&job_name=j": EOF`,
			`GET "http://h:9000/api/tenant/t/builds?project=p&job_name=j": EOF`},
		{"Keystone at http://ks:pw@127.0.0.1:5000/v3 (auth_url) refused", "Keystone at http://127.0.0.1:5000/v3 (auth_url) refused"},
		{"HTTPS://A:B@H and ftp://u:p@f/x and redis://:pw@r:6379", "HTTPS://H and ftp://f/x and redis://r:6379"},
		{"user only: https://token@h/x", "user only: https://h/x"},
		// An '@' in the path or query is no userinfo.
		{"https://h/~user@x?a=b@c", "https://h/~user@x?a=b@c"},
		// A password holding an unescaped '@': everything up to the last '@' of the authority goes.
		{"https://u:p@ss@h/x", "https://h/x"},
		{"(https://u:p@h)", "(https://h)"},
		{"ends with https://u:p@", "ends with https://"},
	}
	for _, tt := range tests {
		if got := Userinfo(tt.in); got != tt.want {
			t.Errorf("Userinfo(%q) =\n  %q, want\n  %q", tt.in, got, tt.want)
		}
	}
}

func TestUserinfoError(t *testing.T) {
	if UserinfoError(nil) != nil {
		t.Fatal("UserinfoError(nil) is not nil")
	}
	err := UserinfoError(fmt.Errorf("GET https://u:topsecret@h/p?q=1: %w", fs.ErrNotExist))
	if got := err.Error(); got != "GET https://h/p?q=1: file does not exist" || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("UserinfoError = %q (errors.Is %v)", got, errors.Is(err, fs.ErrNotExist))
	}
	if UserinfoError(err) != err {
		t.Errorf("redacting twice wraps twice")
	}
	// Error removes queries too: it wraps what only lost its userinfo, and is enough as it is.
	all := Error(err)
	if all == err || all.Error() != "GET https://h/p?REDACTED: file does not exist" {
		t.Errorf("Error(UserinfoError) = %q", all)
	}
	if UserinfoError(all) != all {
		t.Errorf("UserinfoError wraps an error Error redacted")
	}
}

func TestSecrets(t *testing.T) {
	tests := []struct{ in, want string }{
		{"nothing secret=", "nothing secret="},
		{"OS_PASSWORD=hunter2", "OS_PASSWORD=REDACTED"},
		{"HOME=/root\nOS_PASSWORD=pass word\nPATH=/bin", "HOME=/root\nOS_PASSWORD=REDACTED\nPATH=/bin"},
		{"export ZUUL_AUTH_TOKEN='abc def'", "export ZUUL_AUTH_TOKEN=REDACTED"},
		{"  password: hunter2\n  username: ci", "  password: REDACTED\n  username: ci"},
		{`{"application_credential_secret": "x", "id": 1}`, `{"application_credential_secret": REDACTED`},
		{"AWS_SECRET_ACCESS_KEY = abc", "AWS_SECRET_ACCESS_KEY = REDACTED"},
		{"api_key=abc&user=u", "api_key=REDACTED"},
		{"OS_USERNAME=ci\nOS_AUTH_URL=https://ks/v3", "OS_USERNAME=ci\nOS_AUTH_URL=https://ks/v3"},
		// HTTP headers, as curl -v and HTTP libraries' traces show them.
		{"> GET /v2/images HTTP/1.1\n> Authorization: Bearer eyJhbGciOi.x-y_z\n> Accept: */*",
			"> GET /v2/images HTTP/1.1\n> Authorization: REDACTED\n> Accept: */*"},
		{"curl -H 'authorization: Basic dXNlcjpwYXNz' https://glance/v2", "curl -H 'authorization: REDACTED"},
		{`headers={'Authorization': 'Bearer abc', 'Accept': '*/*'}`, `headers={'Authorization': REDACTED`},
		{"sent Bearer abc.def to glance", "sent Bearer REDACTED to glance"},
		{"X-Auth-Token: gAAAAAB", "X-Auth-Token: REDACTED"},
		// openstack's flags that carry secrets, with the value as the next
		// word (a traced command) or after '='.
		{"+ openstack --os-password hunter2 image set x", "+ openstack --os-password REDACTED"},
		{"openstack --os-password=hunter2 image list", "openstack --os-password=REDACTED"},
		{"openstack --os-cloud c1 --os-token 'gAAA B' image list", "openstack --os-cloud c1 --os-token REDACTED"},
		{"--os-application-credential-secret acs", "--os-application-credential-secret REDACTED"},
		{"cmd --os-client-secret cs\nnext line", "cmd --os-client-secret REDACTED\nnext line"},
		{"cmd --os-access-token at", "cmd --os-access-token REDACTED"},
		{"cmd --os-passcode 123456", "cmd --os-passcode REDACTED"},
		{"cmd --os-code abc", "cmd --os-code REDACTED"},
		{"cmd --os-consumer-secret a --os-access-secret b", "cmd --os-consumer-secret REDACTED"},
		{"cmd\t--os-password\thunter2", "cmd\t--os-password\tREDACTED"},
		// Words that name no secret, and a flag without a value, stay.
		{"openstack --os-cloud c1 --os-username ci image show x", "openstack --os-cloud c1 --os-username ci image show x"},
		{"the password was rejected", "the password was rejected"},
		{"usage: hook --os-token\nexit 2", "usage: hook --os-token\nexit 2"},
	}
	for _, tt := range tests {
		if got := Secrets(tt.in); got != tt.want {
			t.Errorf("Secrets(%q) =\n  %q, want\n  %q", tt.in, got, tt.want)
		}
	}
}
