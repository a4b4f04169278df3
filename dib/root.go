package dib

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/escape"
	"github.com/nodepool-builder/nodepool-builder/internal/systemd"
)

// sudoTimeout bounds the sudo that CheckRoot runs: a sudo that waits on
// something (a PAM module, a name service) must not hold the start.
const sudoTimeout = 30 * time.Second

// sudoersFile is the package's sudoers drop-in, whose rule a builder of
// diskimages uncomments, and where the container image's is mounted.
const sudoersFile = "/etc/sudoers.d/nodepool-builder"

// CheckRoot checks that diskimage-builder, started by this process, can become
// root as it does: through sudo, without a password. It fails when a process
// of a user other than root has no_new_privs set (then sudo cannot gain
// anything: under systemd the unit's NoNewPrivileges=, or any of the sandbox
// settings that imply it, sets it), when sudo is missing, and when sudo -n true
// is refused. Each error says what to change. It runs sudo -n true, which
// changes nothing.
func CheckRoot(ctx context.Context) error {
	return checkRoot(ctx, os.Geteuid(), "/proc/self/status", "sudo")
}

// checkRoot is CheckRoot for a process of effective uid euid, reading its
// status at status and running sudo, a name looked up in PATH or a path.
func checkRoot(ctx context.Context, euid int, status, sudo string) error {
	const why = "diskimage-builder becomes root with sudo to build the diskimages of the config"
	nnp, err := noNewPrivs(status)
	if err != nil {
		return fmt.Errorf("%s, and whether this process may gain privileges is unknown: %w", why, err)
	}
	// Root's sudo gains nothing, and no_new_privs does not stop it.
	if nnp && euid != 0 {
		return fmt.Errorf("%s, but this process has no_new_privs set, so sudo cannot gain root. %s; or set "+
			"builder.build-diskimages: false if this host builds no diskimage", why, noNewPrivsFix())
	}
	path, err := exec.LookPath(sudo)
	if err != nil {
		return fmt.Errorf("%s, but sudo is not installed (%v): install it (apt-get install sudo)", why, err)
	}
	ctx, cancel := context.WithTimeout(ctx, sudoTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, "-n", "true")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		var lines []string // what sudo said, on one line
		for l := range strings.Lines(out.String()) {
			if l = strings.TrimSpace(l); l != "" {
				lines = append(lines, l)
			}
		}
		said := strings.Join(lines, "; ")
		switch {
		case errors.Is(ctx.Err(), context.Canceled):
			return fmt.Errorf("run sudo -n true: %w", ctx.Err())
		case ctx.Err() != nil:
			said = fmt.Sprintf("no answer within %s", sudoTimeout)
		case said == "":
			said = err.Error()
		}
		name, rule := whoAmI()
		return fmt.Errorf("%s, but sudo -n true, run as %s, fails: %s. Let %s run every command as root without a "+
			"password: uncomment the rule in %s (the package's), or write one there, %s ALL=(ALL) NOPASSWD: ALL, "+
			"mode 0440, checked with visudo -c; in the container image, mount a file of root's holding it there "+
			"(-v <file>:%s:ro)", why, name, escape.Controls(said), name, sudoersFile, rule, sudoersFile)
	}
	return nil
}

// noNewPrivsFix says how to start the builder without no_new_privs.
func noNewPrivsFix() string {
	if systemd.Running() {
		return fmt.Sprintf("Under systemd the unit's sandbox sets it: NoNewPrivileges=yes, and, for a User= other than "+
			"root, every setting that systemd.exec(5) says implies it (SystemCallFilter=, LockPersonality=, "+
			"ProtectClock=, PrivateDevices=, ...). Link the drop-in that lifts them all: mkdir -p %s && ln -s %s %s/ "+
			"(%s is the package's; from source, install examples/dib.conf there), then systemctl daemon-reload && "+
			"systemctl restart %s", systemd.DropInDir, systemd.DIBDropIn, systemd.DropInDir, systemd.DIBDropIn, systemd.Unit)
	}
	return "Whatever started the builder set it (a container run with --security-opt no-new-privileges, setpriv " +
		"--no-new-privs, a service manager's sandbox): start it without"
}

// noNewPrivs reads the NoNewPrivs line of a process status file.
func noNewPrivs(status string) (bool, error) {
	f, err := os.Open(status)
	if err != nil {
		return false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "NoNewPrivs:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				return false, fmt.Errorf("%s: NoNewPrivs is %q", status, strings.TrimSpace(v))
			}
			return n != 0, nil
		}
	}
	if err := sc.Err(); err != nil {
		return false, fmt.Errorf("read %s: %w", status, err)
	}
	return false, errors.New(status + " has no NoNewPrivs line")
}

// whoAmI names the user running, and says how a sudoers rule names it.
func whoAmI() (name, rule string) {
	uid := strconv.Itoa(os.Getuid())
	if u, err := user.LookupId(uid); err == nil {
		return u.Username, u.Username
	}
	return "uid " + uid, "#" + uid
}
