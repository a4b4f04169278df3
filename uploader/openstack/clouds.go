package openstack

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gophercloud/gophercloud/v2"
	"gopkg.in/yaml.v3"

	"github.com/nodepool-builder/nodepool-builder/internal/redact"
)

// cloudEntry is one cloud of a clouds.yaml, as far as uploading images needs it.
type cloudEntry struct {
	AuthType              string    `yaml:"auth_type"`
	Auth                  authEntry `yaml:"auth"`
	RegionName            string    `yaml:"region_name"`
	Interface             string    `yaml:"interface"`
	EndpointType          string    `yaml:"endpoint_type"`
	ImageFormat           string    `yaml:"image_format"`
	ImageEndpointOverride string    `yaml:"image_endpoint_override"`
	Verify                *bool     `yaml:"verify"`
	CACert                string    `yaml:"cacert"`
	Cert                  string    `yaml:"cert"`
	Key                   string    `yaml:"key"`
	Profile               string    `yaml:"profile"`
	LegacyProfile         string    `yaml:"cloud"`
	// ImageAPIUseTasks is read only to warn that the builder ignores it.
	ImageAPIUseTasks any `yaml:"image_api_use_tasks"`
}

// authEntry is the auth section of a cloud, with keystoneauth's key names.
type authEntry struct {
	AuthURL                     string `yaml:"auth_url"`
	Username                    string `yaml:"username"`
	UserID                      string `yaml:"user_id"`
	Password                    string `yaml:"password"`
	Token                       string `yaml:"token"`
	ProjectName                 string `yaml:"project_name"`
	ProjectID                   string `yaml:"project_id"`
	TenantName                  string `yaml:"tenant_name"`
	TenantID                    string `yaml:"tenant_id"`
	ProjectDomainName           string `yaml:"project_domain_name"`
	ProjectDomainID             string `yaml:"project_domain_id"`
	UserDomainName              string `yaml:"user_domain_name"`
	UserDomainID                string `yaml:"user_domain_id"`
	DomainName                  string `yaml:"domain_name"`
	DomainID                    string `yaml:"domain_id"`
	DefaultDomainName           string `yaml:"default_domain_name"`
	DefaultDomainID             string `yaml:"default_domain_id"`
	SystemScope                 string `yaml:"system_scope"`
	TrustID                     string `yaml:"trust_id"`
	ApplicationCredentialID     string `yaml:"application_credential_id"`
	ApplicationCredentialName   string `yaml:"application_credential_name"`
	ApplicationCredentialSecret string `yaml:"application_credential_secret"`
}

// Auth types this package knows, by keystoneauth plugin name.
const (
	authNone    = "none"
	authAppCred = "v3applicationcredential"
)

var supportedAuthTypes = []string{authNone, "password", "v3password", authAppCred, "token", "v3token"}

// searchDirs lists the directories openstacksdk looks in for clouds.yaml and
// secure.yaml, in order: the working directory, the user's, then the system's.
func searchDirs() []string {
	var dirs []string
	if cwd, err := os.Getwd(); err == nil {
		dirs = append(dirs, cwd)
	}
	if xdg := os.Getenv("XDG_CONFIG_HOME"); xdg != "" {
		dirs = append(dirs, filepath.Join(xdg, "openstack"))
	}
	if home, err := os.UserHomeDir(); err == nil {
		dirs = append(dirs, filepath.Join(home, ".config", "openstack"))
	}
	dirs = append(dirs, "/etc/openstack")
	return dirs
}

// unique returns paths in order without the ones seen before: the working
// directory may be one of the search directories, and OS_CLIENT_CONFIG_FILE
// may name a file the search looks at anyway.
func unique(paths []string) []string {
	seen := make(map[string]bool, len(paths))
	out := paths[:0:0]
	for _, p := range paths {
		if c := filepath.Clean(p); !seen[c] {
			seen[c] = true
			out = append(out, p)
		}
	}
	return out
}

// CloudsFile returns the clouds.yaml that Open reads when Options.CloudsFile is
// empty, or an error that names every place searched and what to do.
func CloudsFile() (string, error) {
	path, _, err := findCloudsFile("")
	return path, err
}

// findCloudsFile returns the clouds.yaml to use and the candidates it considered.
// An explicit file is the only candidate; otherwise $OS_CLIENT_CONFIG_FILE comes first,
// then clouds.yaml in each search directory.
func findCloudsFile(explicit string) (string, []string, error) {
	candidates := []string{explicit}
	if explicit == "" {
		candidates = searched("OS_CLIENT_CONFIG_FILE", "clouds.yaml")
	}
	if path := firstFile(candidates); path != "" {
		return path, candidates, nil
	}
	return "", candidates, fmt.Errorf("no clouds.yaml found (searched %s): create one, or set OS_CLIENT_CONFIG_FILE to its path",
		strings.Join(candidates, ", "))
}

// SecureFile returns the secure.yaml that Open merges over cloudsFile, the
// clouds.yaml CloudsFile returns, or "" when there is none.
func SecureFile(cloudsFile string) string { return findSecureFile(cloudsFile, "") }

// findSecureFile returns the secure.yaml whose clouds are merged over those of
// cloudsFile, the clouds.yaml read, or "" when there is none. openstacksdk looks
// at $OS_CLIENT_SECURE_FILE, then in the search directories. Between them this
// looks beside cloudsFile when it is the file named, by explicit (Options.CloudsFile)
// or else by $OS_CLIENT_CONFIG_FILE, so that one directory holds both, as
// /etc/nodepool does in the container image.
func findSecureFile(cloudsFile, explicit string) string {
	named := explicit
	if named == "" {
		named = os.Getenv("OS_CLIENT_CONFIG_FILE")
	}
	var beside []string
	if named != "" && cloudsFile == named {
		beside = append(beside, filepath.Join(filepath.Dir(cloudsFile), "secure.yaml"))
	}
	return firstFile(searched("OS_CLIENT_SECURE_FILE", "secure.yaml", beside...))
}

// searched is where openstacksdk looks for a file by name: the path the
// environment variable env names, then name in each search directory. then are
// looked at between the two.
func searched(env, name string, then ...string) []string {
	var candidates []string
	if path := os.Getenv(env); path != "" {
		candidates = append(candidates, path)
	}
	candidates = append(candidates, then...)
	for _, dir := range searchDirs() {
		candidates = append(candidates, filepath.Join(dir, name))
	}
	return unique(candidates)
}

// firstFile is the first of paths that is a file; "" when none is.
func firstFile(paths []string) string {
	for _, path := range paths {
		if fi, err := os.Stat(path); err == nil && !fi.IsDir() {
			return path
		}
	}
	return ""
}

// readClouds returns the clouds section of a clouds.yaml or secure.yaml by cloud
// name, each cloud's option names normalised as openstacksdk does ("region-name"
// is "region_name"). Cloud names stay as written: openstacksdk looks a cloud up
// by its exact name, so "cloud-a" and "cloud_a" are two clouds.
func readClouds(path string) (map[string]any, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	var doc struct {
		Clouds map[string]any `yaml:"clouds"`
	}
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	clouds := make(map[string]any, len(doc.Clouds))
	for name, cloud := range doc.Clouds {
		clouds[name] = normalizeKeys(cloud)
	}
	return clouds, nil
}

// normalizeKeys replaces "-" by "_" in every map key, recursively.
func normalizeKeys(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, val := range v {
			out[strings.ReplaceAll(k, "-", "_")] = normalizeKeys(val)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, val := range v {
			out[i] = normalizeKeys(val)
		}
		return out
	default:
		return v
	}
}

// mergeMaps returns base with over laid on top, recursing into maps that both have.
func mergeMaps(base, over map[string]any) map[string]any {
	out := make(map[string]any, len(base)+len(over))
	for k, v := range base {
		out[k] = v
	}
	for k, v := range over {
		bm, ok1 := out[k].(map[string]any)
		om, ok2 := v.(map[string]any)
		if ok1 && ok2 {
			out[k] = mergeMaps(bm, om)
			continue
		}
		out[k] = v
	}
	return out
}

// loadCloud finds clouds.yaml, merges the named cloud with its secure.yaml entry, and
// returns it with the path of the clouds.yaml it came from.
func loadCloud(name, explicitFile string) (cloudEntry, string, error) {
	if name == "" {
		return cloudEntry{}, "", errors.New("no cloud name given: set the provider's cloud to an entry of clouds.yaml")
	}
	path, searched, err := findCloudsFile(explicitFile)
	if err != nil {
		return cloudEntry{}, "", fmt.Errorf("load cloud %q: %w", name, err)
	}
	clouds, err := readClouds(path)
	if err != nil {
		return cloudEntry{}, "", fmt.Errorf("load cloud %q: %w", name, err)
	}
	raw, ok := clouds[name].(map[string]any)
	if !ok {
		known := make([]string, 0, len(clouds))
		for k := range clouds {
			known = append(known, k)
		}
		slices.Sort(known)
		return cloudEntry{}, "", fmt.Errorf("cloud %q is not defined in %s (it defines: %s), %s: add the cloud there, or set "+
			"OS_CLIENT_CONFIG_FILE to a file that has it", name, path, orNothing(strings.Join(known, ", ")), searchedAround(path, searched))
	}
	if secure := findSecureFile(path, explicitFile); secure != "" {
		secrets, err := readClouds(secure)
		if err != nil {
			return cloudEntry{}, "", fmt.Errorf("load cloud %q: %w", name, err)
		}
		if s, ok := secrets[name].(map[string]any); ok {
			raw = mergeMaps(raw, s)
		}
	}
	// Decoding through YAML again gives typed fields with the file's own leniency.
	data, err := yaml.Marshal(raw)
	if err != nil {
		return cloudEntry{}, "", fmt.Errorf("load cloud %q from %s: %w", name, path, err)
	}
	var entry cloudEntry
	if err := yaml.Unmarshal(data, &entry); err != nil {
		return cloudEntry{}, "", fmt.Errorf("load cloud %q from %s: %w", name, path, err)
	}
	return entry, path, nil
}

// searchedAround says how the search came to use the clouds.yaml at path, naming
// each other candidate once: those looked at before it (which do not exist), and
// those after it that exist but are not read.
func searchedAround(path string, searched []string) string {
	var before, shadowed []string
	found := false
	for _, c := range searched {
		switch {
		case c == path:
			found = true
		case !found:
			before = append(before, c)
		default:
			if fi, err := os.Stat(c); err == nil && !fi.IsDir() {
				shadowed = append(shadowed, c)
			}
		}
	}
	msg := "the first clouds.yaml found"
	if len(before) > 0 {
		msg += " (none at " + strings.Join(before, ", ") + ")"
	}
	msg += " and the only one read"
	switch len(shadowed) {
	case 0:
	case 1:
		msg += " (" + shadowed[0] + " is not)"
	default:
		msg += " (" + strings.Join(shadowed, ", ") + " are not)"
	}
	return msg
}

// orNothing is s, or "nothing" when s is empty.
func orNothing(s string) string {
	if s == "" {
		return "nothing"
	}
	return s
}

// authType returns the keystoneauth plugin a cloud uses; openstacksdk's default is
// password, and the fields present tell application credentials and tokens apart.
func (e cloudEntry) authType() string {
	switch {
	case e.AuthType != "":
		return strings.ToLower(e.AuthType)
	case e.Auth.ApplicationCredentialSecret != "":
		return authAppCred
	case e.Auth.Token != "" && e.Auth.Password == "":
		return "token"
	default:
		return "password"
	}
}

// authOptions turns the auth section into gophercloud's options. Domains follow
// openstacksdk: domain_* and default_domain_* stand in for missing user and project
// domains when a project is named.
func (e cloudEntry) authOptions() (gophercloud.AuthOptions, error) {
	a := e.Auth
	if a.AuthURL == "" {
		return gophercloud.AuthOptions{}, errors.New("auth.auth_url is not set")
	}
	projectName := coalesce(a.ProjectName, a.TenantName)
	projectID := coalesce(a.ProjectID, a.TenantID)
	project := projectName != "" || projectID != ""

	userDomainID, userDomainName := a.UserDomainID, a.UserDomainName
	projectDomainID, projectDomainName := a.ProjectDomainID, a.ProjectDomainName
	if userDomainID == "" && userDomainName == "" {
		userDomainID = coalesce(a.DefaultDomainID, pick(project, a.DomainID))
		userDomainName = coalesce(a.DefaultDomainName, pick(project, a.DomainName))
	}
	if projectDomainID == "" && projectDomainName == "" {
		projectDomainID = coalesce(a.DefaultDomainID, pick(project, a.DomainID))
		projectDomainName = coalesce(a.DefaultDomainName, pick(project, a.DomainName))
	}

	opts := gophercloud.AuthOptions{
		IdentityEndpoint: a.AuthURL,
		// A daemon outlives its token; gophercloud logs in again on a 401.
		AllowReauth: true,
	}
	switch e.authType() {
	case authAppCred:
		if a.ApplicationCredentialSecret == "" || (a.ApplicationCredentialID == "" && a.ApplicationCredentialName == "") {
			return gophercloud.AuthOptions{}, errors.New("application credential auth needs auth.application_credential_secret and auth.application_credential_id (or _name with a user)")
		}
		opts.ApplicationCredentialID = a.ApplicationCredentialID
		opts.ApplicationCredentialName = a.ApplicationCredentialName
		opts.ApplicationCredentialSecret = a.ApplicationCredentialSecret
		opts.Username, opts.UserID = a.Username, a.UserID
		opts.DomainID, opts.DomainName = userDomainID, userDomainName
		// Keystone refuses a scope with application credentials: they carry their own.
		return opts, nil
	case "token", "v3token":
		if a.Token == "" {
			return gophercloud.AuthOptions{}, errors.New("token auth needs auth.token")
		}
		opts.TokenID = a.Token
	default:
		if a.Password == "" || (a.Username == "" && a.UserID == "") {
			return gophercloud.AuthOptions{}, errors.New("password auth needs auth.password and auth.username (or auth.user_id)")
		}
		if a.UserID == "" && userDomainID == "" && userDomainName == "" {
			return gophercloud.AuthOptions{}, errors.New("auth.username needs auth.user_domain_name or auth.user_domain_id (Keystone v3 looks users up by domain)")
		}
		opts.Username, opts.UserID, opts.Password = a.Username, a.UserID, a.Password
		opts.DomainID, opts.DomainName = userDomainID, userDomainName
	}

	switch {
	case a.TrustID != "":
		opts.Scope = &gophercloud.AuthScope{TrustID: a.TrustID}
	case a.SystemScope != "":
		if a.SystemScope != "all" {
			return gophercloud.AuthOptions{}, fmt.Errorf("auth.system_scope %q: only \"all\" exists", a.SystemScope)
		}
		opts.Scope = &gophercloud.AuthScope{System: true}
	case projectID != "":
		opts.Scope = &gophercloud.AuthScope{ProjectID: projectID}
	case projectName != "":
		if projectDomainID == "" && projectDomainName == "" {
			return gophercloud.AuthOptions{}, errors.New("auth.project_name needs auth.project_domain_name or auth.project_domain_id")
		}
		opts.Scope = &gophercloud.AuthScope{ProjectName: projectName, DomainID: projectDomainID, DomainName: projectDomainName}
	case a.DomainID != "":
		opts.Scope = &gophercloud.AuthScope{DomainID: a.DomainID}
	case a.DomainName != "":
		opts.Scope = &gophercloud.AuthScope{DomainName: a.DomainName}
	}
	return opts, nil
}

// plainHTTPWarnings says which credentials of the cloud a login sends to an
// http:// auth_url, where anyone on the way can read them. A warning, not an
// error: a Keystone on loopback, as in tests, is fine over http.
func (e cloudEntry) plainHTTPWarnings() []string {
	u, err := url.Parse(e.Auth.AuthURL)
	if err != nil || u.Scheme != "http" || e.authType() == authNone {
		return nil
	}
	var sent []string
	switch e.authType() {
	case authAppCred:
		sent = append(sent, "auth.application_credential_secret")
	case "token", "v3token":
		sent = append(sent, "auth.token")
	default:
		sent = append(sent, "auth.password")
	}
	if u.User != nil {
		sent = append(sent, "the user:password@ of auth_url")
	}
	return []string{fmt.Sprintf("a login to this cloud sends %s over plain http:// to Keystone at %s, where anyone on "+
		"the way can read it: use an https:// auth_url", strings.Join(sent, " and "), redact.Userinfo(e.Auth.AuthURL))}
}

// ignoredKeyWarnings says which keys of the cloud that change how openstacksdk
// uploads an image the builder does not follow: image_api_use_tasks, with
// which openstacksdk (and so nodepool's Python builder) uploads through a
// Glance task, where the builder sends the data with a PUT.
func (e cloudEntry) ignoredKeyWarnings() []string {
	if !setTrue(e.ImageAPIUseTasks) {
		return nil
	}
	return []string{"clouds.yaml sets image_api_use_tasks, which the builder ignores: it uploads an image's data to Glance " +
		"with a PUT, never through a Glance task as openstacksdk does with this key; if this cloud takes images only through " +
		"tasks, every upload to it fails: leave the cloud's images to a Python nodepool-builder, or remove the key if the cloud " +
		"takes a PUT"}
}

// setTrue says whether a clouds.yaml value turns an option on: a true boolean,
// a number other than 0, or a string other than the words YAML 1.1 (which
// openstacksdk's parser speaks) and Python read as false.
func setTrue(v any) bool {
	switch v := v.(type) {
	case nil:
		return false
	case bool:
		return v
	case int:
		return v != 0
	case float64:
		return v != 0
	case string:
		return !slices.Contains([]string{"", "false", "no", "off"}, strings.ToLower(strings.TrimSpace(v)))
	default:
		return true
	}
}

// availability maps clouds.yaml interface (or the older endpoint_type) to the catalog
// interface to use.
func (e cloudEntry) availability() gophercloud.Availability {
	switch strings.TrimSuffix(coalesce(e.Interface, e.EndpointType), "URL") {
	case "internal":
		return gophercloud.AvailabilityInternal
	case "admin":
		return gophercloud.AvailabilityAdmin
	default:
		return gophercloud.AvailabilityPublic
	}
}

// tlsConfig builds the TLS settings of the cloud: verify, cacert, cert and key. It is
// nil when the cloud sets none of them.
func (e cloudEntry) tlsConfig() (*tls.Config, error) {
	if e.Verify == nil && e.CACert == "" && e.Cert == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if e.Verify != nil && !*e.Verify {
		cfg.InsecureSkipVerify = true
	}
	if e.CACert != "" {
		pem, err := os.ReadFile(e.CACert)
		if err != nil {
			return nil, fmt.Errorf("read cacert: %w", err)
		}
		// Like openstacksdk, a cacert replaces the system roots rather than adding to them.
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("cacert %s holds no PEM certificate", e.CACert)
		}
		cfg.RootCAs = pool
	}
	if e.Cert != "" {
		key := coalesce(e.Key, e.Cert)
		pair, err := tls.LoadX509KeyPair(e.Cert, key)
		if err != nil {
			return nil, fmt.Errorf("load client certificate %s: %w", e.Cert, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// imageRoot turns image_endpoint_override into the root gophercloud wants: the service
// URL without the API version, ending in "/". Operators write it with or without /v2.
func imageRoot(override string) (string, error) {
	u, err := url.Parse(override)
	if err != nil {
		return "", fmt.Errorf("image_endpoint_override %q: %w", override, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("image_endpoint_override %q is not an http(s) URL", override)
	}
	p := strings.TrimSuffix(strings.TrimRight(u.Path, "/"), "/v2")
	u.Path = strings.TrimRight(p, "/") + "/"
	u.RawQuery, u.Fragment = "", ""
	return u.String(), nil
}

// coalesce returns the first non-empty string.
func coalesce(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// pick returns s when cond holds, else "".
func pick(cond bool, s string) string {
	if cond {
		return s
	}
	return ""
}
