package zuulapi_test

import (
	"bytes"
	"encoding/base64"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/zuulapi"
)

// seen records the Authorization header of every request a test server got, by path.
type seen struct {
	mu   sync.Mutex
	auth map[string][]string
}

func (s *seen) add(r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.auth == nil {
		s.auth = map[string][]string{}
	}
	s.auth[r.URL.Path] = append(s.auth[r.URL.Path], r.Header.Get("Authorization"))
}

func (s *seen) get(path string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.auth[path]
}

// redirector serves Zuul's builds path as a redirect to where says, and an empty
// page of builds anywhere else, recording what it saw.
func redirector(where func(r *http.Request) string, s *seen) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.add(r)
		if to := where(r); to != "" {
			http.Redirect(w, r, to, http.StatusFound)
			return
		}
		io.WriteString(w, "[]")
	})
}

// TestCredentialsStayWithTheirOrigin: the token, and the password of an
// api-url's userinfo, go to the api-url's scheme, host and port only. A redirect
// to another port of the same host is followed without them (net/http would keep
// them), and so is every hop after one that left, back to the api-url included;
// a redirect within the api-url's origin keeps them.
func TestCredentialsStayWithTheirOrigin(t *testing.T) {
	const token = "tok-6f2a"
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("ci:pw-4e1d"))
	var other seen
	elsewhere := httptest.NewServer(redirector(func(r *http.Request) string {
		if r.URL.Path == "/hop" {
			return r.URL.Query().Get("back")
		}
		return ""
	}, &other))
	defer elsewhere.Close()
	var origin seen
	var originURL string
	home := httptest.NewServer(redirector(func(r *http.Request) string {
		switch r.URL.Path {
		case "/api/tenant/away/builds":
			return elsewhere.URL + "/builds"
		case "/api/tenant/round/builds":
			return elsewhere.URL + "/hop?back=" + originURL + "/final"
		case "/api/tenant/here/builds":
			return "/moved/builds"
		}
		return ""
	}, &origin))
	defer home.Close()
	originURL = home.URL
	if !strings.HasPrefix(home.URL, "http://127.0.0.1:") || !strings.HasPrefix(elsewhere.URL, "http://127.0.0.1:") {
		t.Fatalf("want two ports of 127.0.0.1: %s, %s", home.URL, elsewhere.URL)
	}

	for _, tt := range []struct {
		name, tenant string
		opts         zuulapi.Options
		want         string // the Authorization the origin must see
	}{
		{"token", "", zuulapi.Options{TokenFile: writeToken(t, t.TempDir(), token)}, "Bearer " + token},
		{"api-url userinfo", "", zuulapi.Options{APIURL: strings.Replace(home.URL, "http://", "http://ci:pw-4e1d@", 1)}, basic},
	} {
		t.Run(tt.name, func(t *testing.T) {
			opts := tt.opts
			if opts.APIURL == "" {
				opts.APIURL = home.URL
			}
			for _, tenant := range []string{"away", "round", "here"} {
				opts.Tenant = tenant
				if _, err := newClient(t, opts).Builds(t.Context(), zuulapi.Query{}); err != nil {
					t.Fatalf("tenant %s: %v", tenant, err)
				}
			}
			if got := origin.get("/api/tenant/away/builds"); len(got) == 0 || got[len(got)-1] != tt.want {
				t.Fatalf("the api-url got %q, want %q", got, tt.want)
			}
			for _, path := range []string{"/builds", "/hop"} {
				if got := other.get(path); len(got) == 0 || got[len(got)-1] != "" {
					t.Errorf("another port of the same host got %q at %s; want a request without credentials", got, path)
				}
			}
			if got := origin.get("/final"); len(got) == 0 || got[len(got)-1] != "" {
				t.Errorf("the api-url got %q back from another port; want no credentials after they were dropped", got)
			}
			if got := origin.get("/moved/builds"); len(got) == 0 || got[len(got)-1] != tt.want {
				t.Errorf("a redirect within the api-url's origin got %q, want %q", got, tt.want)
			}
		})
	}
}

// TestRedirectFromHTTPSToHTTPRefused: an https api-url redirected to http is
// not followed, once, without retries, and the error says why; an https
// redirect to another port is followed without the token.
func TestRedirectFromHTTPSToHTTPRefused(t *testing.T) {
	var plain seen
	insecure := httptest.NewServer(redirector(func(*http.Request) string { return "" }, &plain))
	defer insecure.Close()
	var tls2 seen
	secure2 := httptest.NewTLSServer(redirector(func(*http.Request) string { return "" }, &tls2))
	defer secure2.Close()
	var tls1 seen
	secure := httptest.NewTLSServer(redirector(func(r *http.Request) string {
		if r.URL.Path == "/api/tenant/down/builds" {
			return insecure.URL + "/builds"
		}
		return secure2.URL + "/builds"
	}, &tls1))
	defer secure.Close()
	// One client that trusts both test servers' certificate (httptest shares one).
	opts := zuulapi.Options{APIURL: secure.URL, HTTPClient: secure.Client(), TokenFile: writeToken(t, t.TempDir(), "tok"), Tenant: "down"}

	_, err := newClient(t, opts).Builds(t.Context(), zuulapi.Query{})
	if err == nil || !strings.Contains(err.Error(), "from https to http") || !strings.Contains(err.Error(), "(1 attempt)") {
		t.Fatalf("Builds = %v; want a refusal of the redirect to http, not retried", err)
	}
	if got := plain.get("/builds"); len(got) != 0 {
		t.Errorf("the http server was asked %d times", len(got))
	}
	if len(tls1.get("/api/tenant/down/builds")) != 1 {
		t.Errorf("the api-url was asked %d times, want once", len(tls1.get("/api/tenant/down/builds")))
	}

	opts.Tenant = "up"
	if _, err := newClient(t, opts).Builds(t.Context(), zuulapi.Query{}); err != nil {
		t.Fatalf("https to https: %v", err)
	}
	if got := tls2.get("/builds"); len(got) != 1 || got[0] != "" {
		t.Errorf("another https port got %q; want one request without the token", got)
	}
}

// TestPlainHTTPWarnings: a token or an api-url password that would go over
// plain http is warned about, in the log and by Warnings; over https, or with
// no credentials, nothing is.
func TestPlainHTTPWarnings(t *testing.T) {
	tokenFile := writeToken(t, t.TempDir(), "tok")
	for _, tt := range []struct {
		name string
		opts zuulapi.Options
		want []string
	}{
		{"token over http", zuulapi.Options{APIURL: "http://zuul.example.org/", TokenFile: tokenFile}, []string{"Zuul token of auth-token-file"}},
		{"password over http", zuulapi.Options{APIURL: "http://ci:pw-8c@zuul.example.org/"}, []string{"credentials in api-url"}},
		{"both", zuulapi.Options{APIURL: "HTTP://ci:pw-8c@zuul.example.org/", TokenFile: tokenFile}, []string{"Zuul token", "credentials in api-url"}},
		{"https", zuulapi.Options{APIURL: "https://ci:pw-8c@zuul.example.org/", TokenFile: tokenFile}, nil},
		{"http without credentials", zuulapi.Options{APIURL: "http://127.0.0.1:9000/"}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var logs bytes.Buffer
			tt.opts.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			c := newClient(t, tt.opts)
			got := c.Warnings()
			if len(got) != len(tt.want) {
				t.Fatalf("Warnings() = %q, want %d", got, len(tt.want))
			}
			for i, w := range tt.want {
				if !strings.Contains(got[i], w) || !strings.Contains(got[i], "https://") {
					t.Errorf("warning %q does not say %q and what to use", got[i], w)
				}
				if !strings.Contains(logs.String(), "level=WARN msg=\""+got[i]) {
					t.Errorf("warning %q not logged:\n%s", got[i], logs.String())
				}
			}
			if strings.Contains(logs.String()+strings.Join(got, ""), "pw-8c") {
				t.Errorf("the password shows:\n%s%q", logs.String(), got)
			}
		})
	}
}

// TestAPIURLPasswordNeverShown: the password of an api-url's userinfo is in no
// error and no log line, at debug level, whatever fails.
func TestAPIURLPasswordNeverShown(t *testing.T) {
	const password = "pw-91b7"
	down := httptest.NewServer(http.NotFoundHandler())
	downURL := down.URL
	down.Close()
	zuul := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/api/info":
			io.WriteString(w, `{"info": {}}`)
		case "/api/tenant/t/builds":
			http.Error(w, "boom", http.StatusInternalServerError)
		default:
			http.NotFound(w, r)
		}
	}))
	defer zuul.Close()
	withPassword := func(u string) string { return strings.Replace(u, "http://", "http://ci:"+password+"@", 1) }
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var errs []error
	for _, opts := range []zuulapi.Options{
		{APIURL: withPassword(zuul.URL), Tenant: "nope"},                       // 404
		{APIURL: withPassword(zuul.URL), Tenant: "t"},                          // 500, retried
		{APIURL: withPassword(zuul.URL)},                                       // not white-labelled
		{APIURL: withPassword(downURL), Tenant: "t"},                           // connection refused
		{APIURL: withPassword(zuul.URL) + "%zz", Tenant: "t"},                  // no URL
		{APIURL: strings.Replace(withPassword(zuul.URL), "http", "gopher", 1)}, // not http
	} {
		opts.Logger = log
		opts.RetryMax = 1
		c, err := zuulapi.New(fast(opts))
		if err == nil {
			_, err = c.Builds(t.Context(), zuulapi.Query{JobName: "j"})
		}
		if err == nil {
			t.Fatalf("%s: no error", opts.APIURL)
		}
		errs = append(errs, err)
	}
	all := logs.String() + errors.Join(errs...).Error()
	if strings.Contains(all, password) {
		t.Errorf("the password shows:\n%s", all)
	}
	for _, want := range []string{"has no tenant", "500", "set tenant", "connection refused", "api-url", "want an http://"} {
		if !strings.Contains(all, want) {
			t.Errorf("the errors do not say %q; the test lost its point:\n%s", want, all)
		}
	}
}
