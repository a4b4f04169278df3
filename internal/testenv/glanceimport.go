package testenv

import (
	"fmt"
	"strings"
	"testing"
)

// GlanceImportOptions is how a Glance takes images by interoperable import.
type GlanceImportOptions struct {
	// Methods are the import methods it offers (enabled_import_methods), e.g.
	// "glance-direct" and "web-download"; with none it offers none.
	Methods []string
	// Convert, when not empty, is the disk format ("raw", "qcow2" or "vmdk")
	// the image_conversion plugin turns every imported image into, with
	// qemu-img; an image already in it is stored as it came.
	Convert string
}

// WebDownloadHost is the one host a Glance of NewGlanceWithImport fetches
// web-download URLs from, on any port: loopback, which Glance refuses unless
// named.
const WebDownloadHost = "127.0.0.1"

// NewGlanceWithImport starts a Glance for the test behind ks, as
// NewGlanceBehind does, that takes images by interoperable import as opts
// says, and stops it when the test ends. Import runs as a task of the image's
// project in the API process, so it needs Keystone's projects: a Glance
// without Keystone has none to give the task. It skips (or fails under CI)
// when qemu-img, which conversion runs, is not installed.
func NewGlanceWithImport(t testing.TB, ks *Keystone, opts GlanceImportOptions) *Glance {
	t.Helper()
	switch opts.Convert {
	case "":
	case "raw", "qcow2", "vmdk":
		RequireBinary(t, "qemu-img")
	default:
		t.Fatalf("glance cannot convert imported images to %q: it converts to raw, qcow2 or vmdk", opts.Convert)
	}
	return ks.newGlance(t, &opts)
}

// importConfig is the part of a glance-api.conf that sets up import as opts
// says: lines of its [DEFAULT] section, and sections of their own.
//
// The staging area is node_staging_uri, which every Glance of testenv has:
// without enabled_backends Glance keeps staged data and the data web-download
// fetches there, and the conversion's output beside it, and uses neither
// [os_glance_staging_store] nor [os_glance_tasks_store]. The task runs in the
// API process with Glance's default taskflow executor.
func importConfig(opts GlanceImportOptions) (defaults, sections string) {
	defaults = fmt.Sprintf("enabled_import_methods = [%s]\n", strings.Join(opts.Methods, ","))
	// web-download refuses loopback and link-local addresses unless their host
	// is allowed by name, and allows only ports 80 and 443 by default; an
	// empty port list allows every port.
	sections = fmt.Sprintf(`
[import_filtering_opts]
allowed_schemes = [http]
allowed_hosts = [%s]
allowed_ports = []
`, WebDownloadHost)
	if opts.Convert != "" {
		sections += fmt.Sprintf(`
[image_import_opts]
image_import_plugins = [image_conversion]

[image_conversion]
output_format = %s
`, opts.Convert)
	}
	return defaults, sections
}
