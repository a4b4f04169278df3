// Package systemd says whether the builder runs as a systemd service, and how
// an operator changes that service's sandbox: the drop-ins that give it a path
// to write, or give back the privileges diskimage-builder needs.
package systemd

import (
	"fmt"
	"os"
)

const (
	// Unit is the service the package installs.
	Unit = "nodepool-builder.service"
	// DropInDir is where the operator's drop-ins of Unit go.
	DropInDir = "/etc/systemd/system/" + Unit + ".d"
	// DIBDropIn is the drop-in the package ships for a builder of diskimages:
	// linked into DropInDir, it lifts what keeps sudo from gaining root.
	DIBDropIn = "/usr/share/nodepool-builder/dib.conf"
)

// Running tells whether systemd started this process as a service (or a
// command of one): systemd sets INVOCATION_ID for every unit it runs.
func Running() bool { return os.Getenv("INVOCATION_ID") != "" }

// ReadOnlyHint is what to add to an error about path, which the builder must
// write and found on a read-only file system, when systemd runs the builder:
// the unit's sandbox (ProtectSystem=strict) is then the likely cause, and a
// drop-in adding path to ReadWritePaths the fix. create, when path does not
// exist yet, is the command that makes it: a path in ReadWritePaths must exist
// before the service starts. It is "" outside systemd.
func ReadOnlyHint(path, create string) string {
	if !Running() {
		return ""
	}
	first := ""
	if create != "" {
		first = fmt.Sprintf(" (it must exist before the service starts: %s)", create)
	}
	return fmt.Sprintf(". Under systemd, the sandbox of %s leaves only its ReadWritePaths writable: add %s to them%s "+
		"in a drop-in, %s/paths.conf holding the lines \"[Service]\" and \"ReadWritePaths=%s\", then run "+
		"systemctl daemon-reload && systemctl restart %s", Unit, path, first, DropInDir, path, Unit)
}
