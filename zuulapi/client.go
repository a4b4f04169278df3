// Package zuulapi is the client of Zuul's REST builds API: tenant and
// white-label roots, bearer tokens re-read per call, retries and typed errors.
package zuulapi

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/nodepool-builder/nodepool-builder/internal/redact"
)

// Defaults used when the Options leave a field zero.
const (
	DefaultRetryMax     = 4
	DefaultTimeout      = 30 * time.Second
	DefaultRetryWaitMin = time.Second
	DefaultRetryWaitMax = 30 * time.Second
)

// maxBody bounds what is read from one answer; a page of builds is far
// smaller, so more means something other than Zuul is answering.
const maxBody = 32 << 20

// Options configure a Client.
type Options struct {
	// APIURL is the Zuul web root, with or without a trailing slash.
	APIURL string
	// Tenant may be empty when APIURL is white-labelled for one tenant.
	Tenant string
	// TokenFile holds a bearer token. It is read again for every call so
	// that operators can rotate it; empty means no Authorization header.
	TokenFile string
	// CACertFile is a PEM bundle trusted in addition to the system roots.
	CACertFile string
	// HTTPClient is copied, never modified; nil means a fresh client that
	// honours the proxy environment.
	HTTPClient *http.Client
	Logger     *slog.Logger
	// RetryMax is the number of retries after a connection error, timeout
	// or 5xx answer: 0 means DefaultRetryMax, negative means none.
	RetryMax int
	// RetryWaitMin and RetryWaitMax bound the exponential backoff between
	// retries; zero means DefaultRetryWaitMin and DefaultRetryWaitMax.
	RetryWaitMin time.Duration
	RetryWaitMax time.Duration
	// Timeout bounds each attempt, answer body included; 0 means DefaultTimeout.
	Timeout time.Duration
}

// Client talks to one Zuul API root for one tenant. It is safe for
// concurrent use.
type Client struct {
	root string // ends with "/"; without the userinfo, so that messages can show it
	// user is the api-url's userinfo: credentials, sent as HTTP basic auth when
	// there is no token, and never shown.
	user      *url.Userinfo
	tenant    string
	tokenFile string
	warnings  []string
	http      *retryablehttp.Client
	log       *slog.Logger

	mu sync.Mutex
	// whiteLabel is the tenant the root is white-labelled for, once known.
	whiteLabel string
}

// New checks opts and builds a Client. It does no network I/O.
func New(opts Options) (*Client, error) {
	u, err := url.Parse(strings.TrimSpace(opts.APIURL))
	if err != nil {
		return nil, redact.UserinfoError(fmt.Errorf("parse Zuul api-url %q: %w", opts.APIURL, err))
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("zuul api-url %q: want an http:// or https:// URL", redact.Userinfo(opts.APIURL))
	}
	user := u.User
	u.User, u.RawQuery, u.Fragment = nil, "", ""
	if !strings.HasSuffix(u.Path, "/") {
		u.Path += "/"
		if u.RawPath != "" {
			u.RawPath += "/"
		}
	}

	hc := &http.Client{}
	if opts.HTTPClient != nil {
		copied := *opts.HTTPClient
		hc = &copied
	}
	if hc.Transport == nil {
		hc.Transport = http.DefaultTransport.(*http.Transport).Clone()
	}
	if opts.CACertFile != "" {
		if err := TrustCA(hc, opts.CACertFile); err != nil {
			return nil, err
		}
	}
	if opts.Timeout > 0 {
		hc.Timeout = opts.Timeout
	} else if hc.Timeout == 0 {
		hc.Timeout = DefaultTimeout
	}

	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	origin := *u
	hc.CheckRedirect = checkRedirect(&origin, hc.CheckRedirect, logger)
	rc := &retryablehttp.Client{
		HTTPClient:   hc,
		Logger:       retryLogger{logger},
		RetryWaitMin: orDuration(opts.RetryWaitMin, DefaultRetryWaitMin),
		RetryWaitMax: orDuration(opts.RetryWaitMax, DefaultRetryWaitMax),
		RetryMax:     opts.RetryMax,
		CheckRetry:   countingRetryPolicy,
		Backoff:      retryablehttp.DefaultBackoff,
		// Hand back the last answer so that its status and body can be
		// turned into an error that says what went wrong.
		ErrorHandler: retryablehttp.PassthroughErrorHandler,
	}
	switch {
	case opts.RetryMax == 0:
		rc.RetryMax = DefaultRetryMax
	case opts.RetryMax < 0:
		rc.RetryMax = 0
	}
	c := &Client{
		root:      u.String(),
		user:      user,
		tenant:    opts.Tenant,
		tokenFile: opts.TokenFile,
		http:      rc,
		log:       logger,
	}
	c.warnings = plainHTTPWarnings(u, user, opts.TokenFile)
	for _, w := range c.warnings {
		logger.Warn(w, "api_url", c.root)
	}
	return c, nil
}

// plainHTTPWarnings says what credentials an http:// api-url sends in clear.
// A warning, not an error: a Zuul on loopback, as in tests, is fine over http.
func plainHTTPWarnings(u *url.URL, user *url.Userinfo, tokenFile string) []string {
	if u.Scheme != "http" {
		return nil
	}
	var out []string
	if tokenFile != "" {
		out = append(out, "the Zuul token of auth-token-file is sent over plain http:// to "+u.String()+
			", where anyone on the way can read it: use an https:// api-url")
	}
	if user != nil {
		out = append(out, "the credentials in api-url (user:password@) are sent over plain http:// to "+u.String()+
			", where anyone on the way can read them: use an https:// api-url")
	}
	return out
}

// Warnings lists what in the client's settings puts a credential at risk
// (a token or password sent over plain http); New logs each as a warning.
func (c *Client) Warnings() []string { return c.warnings }

// maxRedirects is how many redirects a request follows, as net/http does by default.
const maxRedirects = 10

// errRedirect is a redirect the client refuses to follow: one is never retried.
var errRedirect = errors.New("redirect refused")

// checkRedirect is the client's redirect policy. net/http keeps the
// Authorization header on a redirect to another port or scheme of the same host
// (and to a subdomain): here a redirect to anything but the api-url's own
// scheme, host and port, at any hop, goes on without it, so that neither the
// token nor the api-url's password reach a server they were not given to. The
// redirect itself is followed, for public builds that need no credentials
// there; a Zuul that needs them answers 401, and the warning logged says why.
// A redirect from https to http is refused, credentials or not: what an
// https:// api-url fetches stays encrypted. next is a CheckRedirect of the
// caller's HTTP client, asked after this one.
func checkRedirect(origin *url.URL, next func(*http.Request, []*http.Request) error, log *slog.Logger) func(*http.Request, []*http.Request) error {
	return func(req *http.Request, via []*http.Request) error {
		if len(via) >= maxRedirects {
			return fmt.Errorf("%w: stopped after %d redirects", errRedirect, maxRedirects)
		}
		from := via[len(via)-1].URL
		if from.Scheme == "https" && req.URL.Scheme != "https" {
			return fmt.Errorf("%w: %s redirected to %s, from https to %s: a Zuul API reached over https is never followed "+
				"to plain http", errRedirect, redact.URL(from.String()), redact.URL(req.URL.String()), req.URL.Scheme)
		}
		left := func(r *http.Request) bool { return !sameOrigin(r.URL, origin) }
		if req.Header.Get("Authorization") != "" && (left(req) || slices.ContainsFunc(via, left)) {
			req.Header.Del("Authorization")
			log.Warn("zuul api: redirected to another scheme, host or port than api-url's; its credentials are not sent there",
				"api_url", origin.String(), "to", redact.URL(req.URL.String()))
		}
		if next != nil {
			return next(req, via)
		}
		return nil
	}
}

// sameOrigin tells whether u has the scheme, host and port of origin.
func sameOrigin(u, origin *url.URL) bool {
	return strings.EqualFold(u.Scheme, origin.Scheme) && strings.EqualFold(u.Hostname(), origin.Hostname()) &&
		port(u) == port(origin)
}

// port is u's port, or its scheme's default.
func port(u *url.URL) string {
	if p := u.Port(); p != "" {
		return p
	}
	if strings.EqualFold(u.Scheme, "https") {
		return "443"
	}
	return "80"
}

func orDuration(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// TrustCA makes hc trust the certificates of a PEM bundle besides the system
// roots: a zuul-image's ca-cert, for its API and for its artifacts.
func TrustCA(hc *http.Client, file string) error {
	pem, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("read Zuul ca-cert %s: %w", file, err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return fmt.Errorf("load Zuul ca-cert %s: no PEM certificate found", file)
	}
	tr, ok := hc.Transport.(*http.Transport)
	if !ok {
		return fmt.Errorf("use Zuul ca-cert %s: the HTTP client's transport is %T, not *http.Transport", file, hc.Transport)
	}
	tr = tr.Clone()
	if tr.TLSClientConfig == nil {
		tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	tr.TLSClientConfig.RootCAs = pool
	hc.Transport = tr
	return nil
}

// attemptsKey keys the attempt counter that countingRetryPolicy keeps in a
// request's context, so that errors can say how often a request was tried.
type attemptsKey struct{}

func countingRetryPolicy(ctx context.Context, resp *http.Response, err error) (bool, error) {
	if n, ok := ctx.Value(attemptsKey{}).(*int); ok {
		*n++
	}
	if errors.Is(err, errRedirect) {
		return false, err
	}
	return retryablehttp.DefaultRetryPolicy(ctx, resp, err)
}

// retryLogger adapts slog to retryablehttp. Failed attempts are logged as
// warnings: the caller gets the final error and decides how loud it is.
type retryLogger struct{ l *slog.Logger }

func (r retryLogger) Error(msg string, kv ...any) { r.l.Warn("zuul api: "+msg, kv...) }
func (r retryLogger) Warn(msg string, kv ...any)  { r.l.Warn("zuul api: "+msg, kv...) }
func (r retryLogger) Info(msg string, kv ...any)  { r.l.Debug("zuul api: "+msg, kv...) }
func (r retryLogger) Debug(msg string, kv ...any) { r.l.Debug("zuul api: "+msg, kv...) }

// token reads the bearer token afresh; "" when no token file is configured.
func (c *Client) token() (string, error) {
	if c.tokenFile == "" {
		return "", nil
	}
	data, err := os.ReadFile(c.tokenFile)
	if err != nil {
		return "", fmt.Errorf("read Zuul auth-token-file: %w", err)
	}
	tok := strings.TrimSpace(string(data))
	if tok == "" {
		return "", fmt.Errorf("read Zuul auth-token-file %s: the file is empty", c.tokenFile)
	}
	return tok, nil
}

// get fetches u and returns the body of a 2xx answer; any other outcome is
// an error, an *Error when Zuul answered. tenant names the tenant in messages.
func (c *Client) get(ctx context.Context, u, token, tenant string) ([]byte, error) {
	attempts := 0
	req, err := retryablehttp.NewRequestWithContext(context.WithValue(ctx, attemptsKey{}, &attempts), http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("build request for %s: %w", u, err)
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "nodepool-builder")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	} else if c.user != nil {
		// As net/http sends the userinfo of a URL, but under the redirect policy.
		pass, _ := c.user.Password()
		req.SetBasicAuth(c.user.Username(), pass)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, fmt.Errorf("GET %s: %w", u, ctxErr)
		}
		return nil, redact.UserinfoError(fmt.Errorf("GET %s (%s): %w", u, plural(attempts, "attempt"), err))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return nil, fmt.Errorf("read answer of GET %s: %w", u, err)
	}
	if len(body) > maxBody {
		return nil, &Error{StatusCode: resp.StatusCode, URL: u, kind: ErrUnexpected,
			msg: fmt.Sprintf("the answer of GET %s is larger than %d bytes; is api-url the Zuul web root?", u, maxBody)}
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return body, nil
	}
	return nil, c.statusError(resp, body, u, tenant, attempts)
}

// statusError turns a non-2xx answer into an *Error whose message tells
// the operator what to change.
func (c *Client) statusError(resp *http.Response, body []byte, u, tenant string, attempts int) *Error {
	e := &Error{StatusCode: resp.StatusCode, URL: u, Description: describe(body)}
	said := ""
	if e.Description != "" {
		said = " (Zuul said: " + e.Description + ")"
	}
	who := "the Zuul API"
	if tenant != "" {
		who = fmt.Sprintf("Zuul tenant %q", tenant)
	}
	switch code := resp.StatusCode; {
	case code == http.StatusUnauthorized && c.tokenFile != "":
		e.kind = ErrUnauthorized
		reason := ""
		if e.Description != "" {
			reason = ": " + e.Description
		}
		e.msg = fmt.Sprintf("Zuul refused the token from %s%s (check auth-token-file)", c.tokenFile, reason)
	case code == http.StatusUnauthorized:
		e.kind = ErrUnauthorized
		e.msg = fmt.Sprintf("%s requires a token: set auth-token-file%s", who, said)
	case code == http.StatusForbidden && c.tokenFile != "":
		e.kind = ErrForbidden
		e.msg = fmt.Sprintf("the token from %s has no access to %s: ask the Zuul admins for access or use another auth-token-file%s", c.tokenFile, who, said)
	case code == http.StatusForbidden:
		e.kind = ErrForbidden
		e.msg = fmt.Sprintf("%s denies access without a token: set auth-token-file%s", who, said)
	case code == http.StatusNotFound && tenant != "":
		e.kind = ErrUnknownTenant
		e.msg = fmt.Sprintf("Zuul at %s has no tenant %q: check tenant and api-url%s", c.root, tenant, said)
	case code == http.StatusNotFound:
		e.kind = ErrUnknownTenant
		e.msg = fmt.Sprintf("Zuul at %s has nothing at %s: check api-url%s", c.root, u, said)
	case code == http.StatusUnprocessableEntity:
		e.kind = ErrTenantNotLoaded
		e.msg = fmt.Sprintf("%s is not loaded yet; Zuul is still reading its configuration, retry later%s", who, said)
	case code >= 500:
		e.kind = ErrServer
		e.msg = fmt.Sprintf("Zuul answered %s for %s after %s%s", resp.Status, u, plural(max(attempts, 1), "attempt"), said)
	default:
		e.kind = ErrUnexpected
		e.msg = fmt.Sprintf("Zuul answered %s for %s%s", resp.Status, u, said)
	}
	return e
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// info is the part of GET /api/info that matters here.
type info struct {
	Info struct {
		Tenant string `json:"tenant"`
	} `json:"info"`
}

// whiteLabelTenant asks /api/info which tenant the root is white-labelled
// for; "" when it serves several.
func (c *Client) whiteLabelTenant(ctx context.Context, token string) (string, error) {
	u := c.root + "api/info"
	body, err := c.get(ctx, u, token, "")
	if err != nil {
		return "", err
	}
	var doc info
	if err := json.Unmarshal(body, &doc); err != nil {
		return "", &Error{StatusCode: http.StatusOK, URL: u, kind: ErrUnexpected,
			msg: fmt.Sprintf("decode Zuul info from %s: %v (is api-url the Zuul web root?)", u, err)}
	}
	return doc.Info.Tenant, nil
}

// buildsURL returns the builds endpoint and the tenant it belongs to.
func (c *Client) buildsURL(ctx context.Context, token string) (endpoint, tenant string, err error) {
	c.mu.Lock()
	wl := c.whiteLabel
	c.mu.Unlock()
	if wl != "" {
		return c.root + "api/builds", wl, nil
	}
	if c.tenant != "" {
		return c.root + "api/tenant/" + url.PathEscape(c.tenant) + "/builds", c.tenant, nil
	}
	wl, err = c.whiteLabelTenant(ctx, token)
	if err != nil {
		return "", "", fmt.Errorf("find the tenant of white-label Zuul root %s: %w", c.root, err)
	}
	if wl == "" {
		return "", "", &Error{URL: c.root + "api/info", kind: ErrNoTenant,
			msg: fmt.Sprintf("Zuul at %s serves several tenants: set tenant", c.root)}
	}
	c.setWhiteLabel(wl)
	return c.root + "api/builds", wl, nil
}

func (c *Client) setWhiteLabel(tenant string) {
	c.mu.Lock()
	c.whiteLabel = tenant
	c.mu.Unlock()
	c.log.Debug("zuul api root is white-labelled", "root", c.root, "tenant", tenant)
}
