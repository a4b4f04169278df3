// Package openstack is the uploader's Cloud for OpenStack: it reads clouds.yaml the way
// openstacksdk does and creates, uploads, lists and deletes Glance images with gophercloud.
package openstack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/tokens"

	"github.com/nodepool-builder/nodepool-builder/internal/redact"
	"github.com/nodepool-builder/nodepool-builder/uploader"
)

// Options says which cloud to open and how to reach it.
type Options struct {
	// Cloud is the clouds.yaml entry (a provider's cloud key). Required.
	Cloud string
	// Region overrides the cloud's region_name when not empty.
	Region string
	// CloudsFile names the clouds.yaml to read, and nothing else is; when empty
	// it is searched for as openstacksdk does: $OS_CLIENT_CONFIG_FILE,
	// ./clouds.yaml, ~/.config/openstack/clouds.yaml,
	// /etc/openstack/clouds.yaml. Either way secure.yaml is found by one rule:
	// $OS_CLIENT_SECURE_FILE, beside the clouds.yaml named (here or by
	// $OS_CLIENT_CONFIG_FILE), then openstacksdk's search directories.
	CloudsFile string
	// HTTPClient is used for every request when set, as given: the cloud's verify,
	// cacert and cert settings then apply only if the caller put them there.
	HTTPClient *http.Client
	// Logger receives debug logs; nil discards them.
	Logger *slog.Logger
}

// Cloud is the Glance image service of one clouds.yaml cloud. It logs in on first use,
// so opening never touches the network. It is safe for concurrent use.
type Cloud struct {
	name        string
	imageFormat string
	log         *slog.Logger
	httpClient  http.Client

	// auth is nil for auth_type none, where Glance is reached without a token.
	auth *gophercloud.AuthOptions
	// authURL is auth_url as messages show it: without userinfo.
	authURL string
	// warnings say what in the cloud's settings puts its credentials at risk,
	// and which of its keys the builder ignores though openstacksdk follows them.
	warnings []string
	// authType is the keystoneauth plugin of auth, to say what to check when
	// Keystone refuses it.
	authType     string
	endpointOpts gophercloud.EndpointOpts
	// override is the image_endpoint_override root, used instead of the catalog.
	override string

	// pageSize is how many images one list request asks for.
	pageSize int

	mu      sync.Mutex
	service *gophercloud.ServiceClient
	// project is the id of the project the token is scoped to, known once
	// logged in; "" without authentication or a project.
	project string
}

// Cloud is what the uploader needs.
var _ uploader.Cloud = (*Cloud)(nil)

// defaultPageSize stays below Glance's default api_limit_max of 1000.
const defaultPageSize = 200

// Open reads the cloud's clouds.yaml entry and checks that it can be used. It does not
// log in: that happens on the first call, so a cloud that is down does not stop the
// builder from starting.
func Open(ctx context.Context, opts Options) (*Cloud, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	entry, file, err := loadCloud(opts.Cloud, opts.CloudsFile)
	if err != nil {
		return nil, err
	}
	c, err := newCloud(opts, entry)
	if err != nil {
		return nil, redact.UserinfoError(fmt.Errorf("open cloud %q from %s: %w", opts.Cloud, file, err))
	}
	return c, nil
}

// newCloud checks a clouds.yaml entry and turns it into a Cloud.
func newCloud(opts Options, entry cloudEntry) (*Cloud, error) {
	if p := coalesce(entry.Profile, entry.LegacyProfile); p != "" {
		return nil, fmt.Errorf("vendor profile %q is not supported: write its auth_url, region_name and image_format into the cloud", p)
	}
	c := &Cloud{
		name:        opts.Cloud,
		imageFormat: entry.ImageFormat,
		log:         opts.Logger,
		endpointOpts: gophercloud.EndpointOpts{
			Region:       coalesce(opts.Region, entry.RegionName),
			Availability: entry.availability(),
		},
		pageSize: defaultPageSize,
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	c.log = c.log.With("cloud", c.name)
	if entry.Verify != nil && !*entry.Verify {
		c.warnings = append(c.warnings, "clouds.yaml sets verify: false: TLS certificates of this cloud are not checked, so anyone "+
			"on the way can read its credentials and change the images; give it a cacert instead")
	}
	c.warnings = append(c.warnings, entry.plainHTTPWarnings()...)
	c.warnings = append(c.warnings, entry.ignoredKeyWarnings()...)
	for _, w := range c.warnings {
		c.log.Warn(w)
	}

	if entry.ImageEndpointOverride != "" {
		root, err := imageRoot(entry.ImageEndpointOverride)
		if err != nil {
			return nil, err
		}
		c.override = root
	}

	switch t := entry.authType(); {
	case t == authNone:
		if c.override == "" {
			return nil, errors.New("auth_type none needs image_endpoint_override: set it to the Glance URL, e.g. http://glance.example.com:9292")
		}
	case slices.Contains(supportedAuthTypes, t):
		ao, err := entry.authOptions()
		if err != nil {
			return nil, err
		}
		c.auth, c.authType, c.authURL = &ao, t, redact.Userinfo(ao.IdentityEndpoint)
	default:
		return nil, fmt.Errorf("auth_type %q is not supported (use one of %s)", entry.AuthType, strings.Join(supportedAuthTypes, ", "))
	}

	if opts.HTTPClient != nil {
		c.httpClient = *opts.HTTPClient
	} else {
		tlsCfg, err := entry.tlsConfig()
		if err != nil {
			return nil, err
		}
		transport := http.DefaultTransport.(*http.Transport).Clone()
		if tlsCfg != nil {
			transport.TLSClientConfig = tlsCfg
		}
		// No overall timeout: an upload takes as long as it takes; contexts bound calls.
		c.httpClient = http.Client{Transport: transport}
	}
	return c, nil
}

// ImageFormat is the cloud's image_format from clouds.yaml, "" when it sets none.
func (c *Cloud) ImageFormat() string { return c.imageFormat }

// Name is the clouds.yaml entry this Cloud was opened from.
func (c *Cloud) Name() string { return c.name }

// Warnings lists what in the cloud's clouds.yaml entry puts its credentials at
// risk (verify: false, a password sent to an http:// auth_url), and the keys
// of it that openstacksdk follows and the builder ignores
// (image_api_use_tasks); Open logs each.
func (c *Cloud) Warnings() []string { return c.warnings }

// imageService returns the Glance client, logging in first if this is the first use or
// the last attempt failed.
func (c *Cloud) imageService(ctx context.Context) (*gophercloud.ServiceClient, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.service != nil {
		return c.service, nil
	}
	if c.auth == nil {
		provider := &gophercloud.ProviderClient{HTTPClient: c.httpClient}
		provider.UserAgent.Prepend(userAgent)
		c.service = c.serviceAt(provider, c.override)
		c.log.Debug("using Glance without authentication", "endpoint", redact.Userinfo(c.override))
		return c.service, nil
	}

	provider, err := openstack.NewClient(c.auth.IdentityEndpoint)
	if err != nil {
		return nil, redact.UserinfoError(fmt.Errorf("cloud %s: auth_url %q: %w", c.name, c.authURL, err))
	}
	provider.HTTPClient = c.httpClient
	provider.UserAgent.Prepend(userAgent)
	if err := openstack.Authenticate(ctx, provider, *c.auth); err != nil {
		return nil, fmt.Errorf("authenticate to cloud %s: %w", c.name, c.identityError(err))
	}
	project := tokenProject(provider.GetAuthResult())
	if c.override != "" {
		c.service = c.serviceAt(provider, c.override)
	} else {
		sc, err := openstack.NewImageV2(provider, c.endpointOpts)
		var netErr net.Error
		switch {
		case errors.As(err, &netErr):
			// The catalog names an endpoint, whose versions gophercloud asks for, and it
			// does not answer: Glance is down or unreachable, which a later try may not be.
			return nil, redact.UserinfoError(fmt.Errorf("%w: cloud %s: reach the image service the catalog names for region %q, interface %s: %w",
				uploader.ErrUnavailable, c.name, c.endpointOpts.Region, c.endpointOpts.Availability, err))
		case err != nil:
			return nil, fmt.Errorf("cloud %s: find the image service in the catalog (region %q): %w", c.name, c.endpointOpts.Region, err)
		}
		// Some catalogs list Glance with its version; gophercloud would add a second one.
		if strings.HasSuffix(sc.Endpoint, "/v2/") {
			sc.ResourceBase = sc.Endpoint
		}
		c.service = sc
	}
	c.project = project
	c.log.Debug("authenticated", "auth_url", c.authURL, "image_endpoint", redact.Userinfo(c.service.Endpoint), "project_id", project)
	return c.service, nil
}

// Project is the id of the project the cloud's token is scoped to, which Glance
// makes the owner of the images it creates. It logs in first if no call has.
// It is "" for auth_type none, and for a token scoped to no project.
func (c *Cloud) Project(ctx context.Context) (string, error) {
	if _, err := c.imageService(ctx); err != nil {
		return "", err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.project, nil
}

// tokenProject is the project id of Keystone's answer to a login: a new token,
// or the token given, read back. "" when it names none.
func tokenProject(r gophercloud.AuthResult) string {
	scoped, ok := r.(interface {
		ExtractProject() (*tokens.Project, error)
	})
	if !ok {
		return ""
	}
	p, err := scoped.ExtractProject()
	if err != nil || p == nil {
		return ""
	}
	return p.ID
}

// serviceAt is an image service client for a Glance root URL ending in "/".
func (c *Cloud) serviceAt(provider *gophercloud.ProviderClient, root string) *gophercloud.ServiceClient {
	return &gophercloud.ServiceClient{
		ProviderClient: provider,
		Endpoint:       root,
		ResourceBase:   root + "v2/",
		Type:           "image",
	}
}

// userAgent names this program to the cloud, ahead of gophercloud's own.
const userAgent = "nodepool-builder"

// identityError is a failed login: Keystone, at the cloud's auth_url, answered
// it, not Glance. A refusal says what in clouds.yaml to check; Keystone being
// down or unreachable is marked uploader.ErrUnavailable, as Glance's is. No
// userinfo of a URL shows in it.
func (c *Cloud) identityError(err error) error {
	return redact.UserinfoError(c.loginError(err))
}

func (c *Cloud) loginError(err error) error {
	var code gophercloud.ErrUnexpectedResponseCode
	var netErr net.Error
	switch {
	case errors.Is(err, context.Canceled):
		return err
	case errors.As(err, &code):
		e := &identityStatusError{authURL: c.authURL, status: code.Actual,
			detail: bodyDetail(code.Body, code.Actual), err: err}
		if code.Actual == http.StatusUnauthorized {
			e.check = c.credentialsHint()
		}
		if code.Actual >= 500 {
			return fmt.Errorf("%w: %w", uploader.ErrUnavailable, e)
		}
		return e
	case errors.As(err, &netErr):
		return fmt.Errorf("%w: reach Keystone at %s: %w", uploader.ErrUnavailable, c.authURL, err)
	}
	return fmt.Errorf("log in at Keystone %s: %w", c.authURL, err)
}

// credentialsHint says what to check in clouds.yaml when Keystone refuses the
// login of this cloud's auth type.
func (c *Cloud) credentialsHint() string {
	where := "in the cloud's auth section of clouds.yaml (or secure.yaml)"
	switch c.authType {
	case authAppCred:
		return "check auth.application_credential_id (or _name) and auth.application_credential_secret " + where +
			", and that the application credential still exists and has not expired (openstack application credential show)"
	case "token", "v3token":
		return "auth.token " + where + " is not valid, or has expired: give a new one, or use a password or an application " +
			"credential, with which the builder can log in again by itself"
	default:
		return "check auth.username (or auth.user_id), auth.password and the user's and project's domains " + where +
			", and that the user is enabled and has a role in the project"
	}
}

// identityStatusError is an answer from Keystone other than a token. Like
// statusError it is short; the gophercloud error stays reachable through
// errors.As. It never holds the credentials: Keystone does not echo them.
type identityStatusError struct {
	authURL string
	status  int
	detail  string
	check   string
	err     error
}

func (e *identityStatusError) Error() string {
	what := fmt.Sprintf("answered HTTP %d %s", e.status, http.StatusText(e.status))
	if e.status == http.StatusUnauthorized {
		what = "refused the credentials (HTTP 401 Unauthorized)"
	}
	msg := "Keystone at " + e.authURL + " (auth_url) " + what
	if e.detail != "" {
		msg += ": " + strings.TrimRight(e.detail, ".")
	}
	if e.check != "" {
		msg += "; " + e.check
	}
	return msg
}

func (e *identityStatusError) Unwrap() error { return e.err }
