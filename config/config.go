// Package config loads and validates the builder's config: nodepool.yaml, whose
// keys this builder uses are typed and checked, whose other keys of nodepool's
// are accepted and ignored, and where any other key is an error; and the
// builder's own file beside it, with what nodepool has no key for.
package config

import (
	"errors"
	"net/netip"
	"slices"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/hostpattern"
)

// ErrUnusable is wrapped by the errors of a config that loads but cannot be
// used: a clouds.yaml entry that is missing, a ca-cert that does not read, a
// changed images-dir, ZooKeeper TLS files that do not load.
var ErrUnusable = errors.New("config cannot be used")

// Config is a loaded, validated config.
type Config struct {
	// Files are the files the config was loaded from, as Load was given them,
	// so that a reload reads the same.
	Files Files
	// Snapshot is the text the config was loaded from; nil when it was
	// parsed from text rather than loaded.
	Snapshot *Snapshot
	// Path is nodepool.yaml, BuilderPath the builder's own file ("" when there
	// was none), SecurePath nodepool's secure file ("" when there was none),
	// as errors name them.
	Path        string
	BuilderPath string
	SecurePath  string
	// Warnings are what loads but should change: a layout nodepool's tools
	// refuse, a zuul-image nodepool-launcher cannot boot.
	Warnings []string

	ImagesDir         string
	BuildLogDir       string // default /var/log/nodepool/builds
	BuildLogRetention int    // default 7; -1 keeps all
	ElementsDir       string
	// LauncherWebapp is nodepool-launcher's webapp section: checked, but
	// never served by the builder, whose pages are Builder.Webapp. nil when
	// absent.
	LauncherWebapp *Webapp
	// ZooKeeper is where the state lives when set; nil keeps it in SQLite.
	ZooKeeper *ZooKeeper

	DiskImages []DiskImage // abstract images are dropped after inheritance is applied
	ZuulImages []ZuulImage
	Providers  []Provider // only providers this builder uploads to (driver openstack)
	Builder    Builder

	// own is the builder's own settings as read, its sections decoded: what
	// OwnSettingsChanged compares.
	own map[string]any
}

// Webapp is the address of status pages: the builder's own (builder.webapp)
// or nodepool-launcher's (the top-level webapp).
type Webapp struct {
	ListenAddress string
	Port          int
	// HostNames are the names, besides localhost, the host's own name and
	// the listen address, that requests to the pages may carry as their Host:
	// a DNS alias, or the name a reverse proxy passes on (builder.webapp only).
	HostNames []string
}

// Equal tells whether two webapp sections say the same.
func (w *Webapp) Equal(o *Webapp) bool {
	if w == nil || o == nil {
		return w == o
	}
	return w.ListenAddress == o.ListenAddress && w.Port == o.Port && slices.Equal(w.HostNames, o.HostNames)
}

// DiskImage is a diskimages entry after parent/abstract inheritance.
type DiskImage struct {
	Name              string
	Parent            string
	Elements          []string
	EnvVars           map[string]string
	Formats           []string
	KeepFormats       []string
	DeleteAfterUpload bool
	Release           string
	RebuildAge        time.Duration // default 86400s
	BuildTimeout      time.Duration // default 28800s
	Pause             bool
	DIBCmd            string // default disk-image-create
	Username          string // default zuul
	PythonPath        string // default auto
	ShellType         string
	Metadata          map[string]string
}

// ZuulImage is a zuul-images entry: an image built by a Zuul job.
type ZuulImage struct {
	// Declared tells whether nodepool.yaml declares the image as a diskimage
	// of its name, as nodepool requires of every image its providers and
	// labels name. Username, PythonPath and ShellType are that declaration's
	// (nodepool's defaults when it has none): nodepool-launcher connects to the
	// nodes it boots from the image as the upload records say.
	Declared   bool
	Username   string // default zuul
	PythonPath string // default auto
	ShellType  string

	Name            string
	APIURL          string
	Tenant          string // may be empty for a white-label root
	Project         string
	Branch          string
	Pipelines       []string
	JobName         string
	PollInterval    time.Duration // default Builder.PollInterval
	AuthTokenFile   string
	CACert          string
	RequireChecksum bool
	Formats         []string // extra formats fetched even if no provider needs them
	Artifacts       []ArtifactMapping
	Pause           bool
	Metadata        map[string]string
	// AllowUnmergedChanges lets builds of changes (a ref with a change number,
	// as in check) be fetched; only builds of merged refs are, by default.
	AllowUnmergedChanges bool
	// ArtifactHosts, when set, are the only hosts artifacts are fetched from,
	// and all of them may be on internal addresses. nil allows the api-url's
	// host and port and each build's log_url host (not on internal addresses).
	ArtifactHosts []hostpattern.Pattern
}

// ArtifactMapping says which Zuul artifact holds a format.
type ArtifactMapping struct {
	Format string // normalised: "qcow" becomes "qcow2"
	Type   string // matched against artifact metadata.type
	Name   string // optional: also matched against the artifact name
}

// Provider is an openstack provider this builder uploads to.
type Provider struct {
	Name               string
	Cloud              string
	RegionName         string
	ImageFormat        string // as configured; empty means clouds.yaml image_format, else qcow2
	ImageNameFormat    string // default "{image_name}-{timestamp}"
	ImageUploadTimeout time.Duration
	PostUploadHook     string
	Rate               float64
	DiskImages         []ProviderImage
}

// ProviderImage is an entry of a provider's diskimages list.
type ProviderImage struct {
	Name  string
	Pause bool
	Meta  map[string]string
}

// Builder holds the settings of this program that nodepool has no key for.
type Builder struct {
	PollInterval   time.Duration // default 60s
	UploadWorkers  int           // default 4
	KeepBuilds     int           // default 2
	KeepUploads    int           // default 2
	UploadAttempts int           // default 5
	StateDB        string        // default <images-dir>/builder.db
	// GearmanServers are the gearman job servers the builder works for: the
	// builder section's and nodepool's old top-level gearman-servers.
	GearmanServers []GearmanServer
	// GearmanUnservedAfter: a job for a builder function nobody serves is
	// answered as failed after waiting this long; default 30s.
	GearmanUnservedAfter time.Duration
	// GearmanFunctions are the kinds of gearman functions the builder serves
	// (GearmanBuild, GearmanUpload, GearmanDelete); nil serves them all.
	GearmanFunctions []string
	// GearmanMinBuildInterval: an image-build job for a diskimage whose newest
	// ready build is younger than this is refused; 0 refuses none. Default
	// DefaultGearmanMinBuildInterval.
	GearmanMinBuildInterval time.Duration
	// DownloadConnections is how many connections fetch one artifact when its
	// server takes Range requests; 0 means the fetcher's default.
	DownloadConnections int
	// LeaveDiskImages (build-diskimages: false) leaves the diskimages to other
	// builders sharing the state (Python nodepool-builders reading the same
	// nodepool.yaml): this builder builds none, and rotates and deletes them
	// as nodepool's builders do.
	LeaveDiskImages bool
	LeakSweep       bool  // default true
	MaxImageSize    int64 // bytes; default DefaultMaxImageSize
	// NAT64Prefixes are the prefixes of the network's NAT64 translators
	// besides the well-known 64:ff9b::/96, each one nat64.CheckPrefix accepts:
	// an artifact host's address in one is judged by the IPv4 address it carries.
	NAT64Prefixes []netip.Prefix
	// Webapp is where the daemon serves its status pages; nil serves none.
	Webapp *Webapp
	// ZuulMQTT is the broker the daemon listens to for Zuul's reports, which
	// make it poll a zuul-image at once; nil listens to none.
	ZuulMQTT *ZuulMQTT
	// Providers are the builder's own settings of nodepool.yaml's providers
	// (builder.providers), by provider name; a provider without is absent.
	Providers map[string]BuilderProvider
}

// BuilderProvider is the builder's own settings of one of nodepool.yaml's
// providers: builder.providers, which nodepool's schema has no key for.
type BuilderProvider struct {
	Name string
	// UploadMethod is how images reach the provider's Glance: UploadPut
	// (the default), UploadGlanceDirect or UploadWebDownload.
	UploadMethod string

	line int    // where the entry is, for the check that the provider exists
	path string // its key path, for the same
}

// The upload methods of builder.providers[].upload-method.
const (
	// UploadPut sends the image in one PUT of the image's data.
	UploadPut = "put"
	// UploadGlanceDirect stages the image and has Glance import it, which
	// converts it where the cloud converts on import.
	UploadGlanceDirect = "glance-direct"
	// UploadWebDownload has Glance fetch a Zuul-built image's artifact itself.
	UploadWebDownload = "web-download"
)

// UploadMethods are the upload methods the builder takes.
var UploadMethods = []string{UploadPut, UploadGlanceDirect, UploadWebDownload}

// UploadMethod is how images reach a provider's Glance: its
// builder.providers entry's upload-method, UploadPut by default.
func (b Builder) UploadMethod(provider string) string {
	if bp, ok := b.Providers[provider]; ok && bp.UploadMethod != "" {
		return bp.UploadMethod
	}
	return UploadPut
}

// ServesGearman tells whether the builder serves gearman functions of a kind
// (GearmanBuild, GearmanUpload, GearmanDelete).
func (b Builder) ServesGearman(kind string) bool {
	return b.GearmanFunctions == nil || slices.Contains(b.GearmanFunctions, kind)
}

// GearmanServer is a gearman job server address.
type GearmanServer struct {
	Host string
	Port int // default 4730
}
