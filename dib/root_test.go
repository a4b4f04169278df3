package dib

import (
	"context"
	"errors"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/internal/systemd"
)

// TestCheckRoot: diskimage-builder's way to root is checked before any build,
// and each way it can be closed is named with what opens it.
func TestCheckRoot(t *testing.T) {
	dir := t.TempDir()
	status := func(nnp string) string {
		path := filepath.Join(dir, "status-"+nnp)
		text := "Name:\tnodepool-builder\nUmask:\t0027\n"
		if nnp != "" {
			text += "NoNewPrivs:\t" + nnp + "\n"
		}
		if err := os.WriteFile(path, []byte(text+"Seccomp:\t0\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	record := filepath.Join(dir, "sudo-args")
	sudo := func(name, body string) string {
		path := filepath.Join(dir, name)
		script := "#!/bin/sh\nprintf '%s\\n' \"$*\" >" + record + "\n" + body + "\n"
		if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		return path
	}
	allowed := sudo("sudo-allows", "exit 0")
	refused := sudo("sudo-refuses", "echo 'sudo: /run/sudo/ts: Read-only file system' >&2; echo 'sudo: a password is required' >&2; exit 1")
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name     string
		status   string
		sudo     string
		systemd  bool
		root     bool
		want     []string // in the error; nil: no error
		wantNot  []string
		sudoRuns bool
	}{
		{name: "sudo allows", status: status("0"), sudo: allowed, sudoRuns: true},
		{name: "no_new_privs, under systemd", status: status("1"), sudo: allowed, systemd: true,
			want: []string{"no_new_privs set, so sudo cannot gain root", "NoNewPrivileges=yes", "LockPersonality=",
				"ln -s " + systemd.DIBDropIn + " " + systemd.DropInDir + "/", "systemctl daemon-reload", "build-diskimages: false"}},
		{name: "no_new_privs, as root", status: status("1"), sudo: allowed, root: true, sudoRuns: true},
		{name: "no_new_privs, elsewhere", status: status("1"), sudo: allowed,
			want: []string{"no_new_privs set", "--security-opt no-new-privileges", "start it without"}, wantNot: []string{"drop-in"}},
		{name: "sudo refuses", status: status("0"), sudo: refused, sudoRuns: true,
			want: []string{"sudo -n true, run as " + me.Username + ", fails: sudo: /run/sudo/ts: Read-only file system; sudo: a password is required. ",
				"uncomment the rule in /etc/sudoers.d/nodepool-builder", me.Username + " ALL=(ALL) NOPASSWD: ALL",
				"in the container image, mount a file of root's holding it there (-v <file>:/etc/sudoers.d/nodepool-builder:ro)"}},
		{name: "no sudo", status: status("0"), sudo: filepath.Join(dir, "absent", "sudo"),
			want: []string{"sudo is not installed", "apt-get install sudo"}},
		{name: "a status without NoNewPrivs", status: status(""), sudo: allowed,
			want: []string{"whether this process may gain privileges is unknown", "has no NoNewPrivs line"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("INVOCATION_ID", "")
			if tt.systemd {
				t.Setenv("INVOCATION_ID", "0123456789abcdef0123456789abcdef")
			}
			os.Remove(record)
			euid := 1000
			if tt.root {
				euid = 0
			}
			err := checkRoot(context.Background(), euid, tt.status, tt.sudo)
			if tt.want == nil && err != nil {
				t.Fatalf("checkRoot: %v", err)
			}
			for _, s := range tt.want {
				if err == nil || !strings.Contains(err.Error(), s) {
					t.Errorf("checkRoot = %v; want an error saying %q", err, s)
				}
			}
			for _, s := range tt.wantNot {
				if err != nil && strings.Contains(err.Error(), s) {
					t.Errorf("checkRoot = %v; it should not say %q", err, s)
				}
			}
			args, readErr := os.ReadFile(record)
			if ran := readErr == nil; ran != tt.sudoRuns {
				t.Errorf("sudo ran: %v, want %v", ran, tt.sudoRuns)
			} else if ran && string(args) != "-n true\n" {
				t.Errorf("sudo ran with %q, want -n true", args)
			}
		})
	}
}

// TestCheckRootCancelled: a check cancelled while sudo runs (the daemon
// stopping during a reload) is the cancellation, not a refusal of sudo's.
func TestCheckRootCancelled(t *testing.T) {
	dir := t.TempDir()
	status := filepath.Join(dir, "status")
	if err := os.WriteFile(status, []byte("NoNewPrivs:\t0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sudo := filepath.Join(dir, "sudo")
	if err := os.WriteFile(sudo, []byte("#!/bin/sh\nexec sleep 60\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := checkRoot(ctx, 1000, status, sudo)
	if !errors.Is(err, context.Canceled) || strings.Contains(err.Error(), "sudoers") {
		t.Errorf("checkRoot with a cancelled context = %v; want the cancellation", err)
	}
}
