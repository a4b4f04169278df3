package store_test

import (
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nodepool-builder/nodepool-builder/internal/systemd"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// TestCheckWritable covers what any user meets; the permission cases, which
// need a user other than the files' owner, are in the command's tests.
func TestCheckWritable(t *testing.T) {
	root := t.TempDir()
	file := filepath.Join(root, "a-file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "exists", ".partial"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		dir     string
		want    []string // in the error; nil: no error
		created bool     // dir exists afterwards
	}{
		{name: "existing directory", dir: filepath.Join(root, "exists"), created: true},
		{name: "to be made, parents too", dir: filepath.Join(root, "new", "deeper", "images")},
		{name: "a file", dir: file, want: []string{"images-dir " + file + " is not a directory"}, created: true},
		{name: "below a file", dir: filepath.Join(file, "images"), want: []string{"cannot be created", file + " is not a directory"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := store.CheckImagesDir(tt.dir, filepath.Join(tt.dir, "builder.db"))
			if tt.want == nil && err != nil {
				t.Fatalf("CheckImagesDir(%s): %v", tt.dir, err)
			}
			for _, s := range tt.want {
				if err == nil || !strings.Contains(err.Error(), s) {
					t.Errorf("CheckImagesDir(%s) = %v, want an error saying %q", tt.dir, err, s)
				}
			}
			if _, err := os.Stat(tt.dir); (err == nil) != tt.created {
				t.Errorf("after the check, %s exists: %v; want %v", tt.dir, err == nil, tt.created)
			}
		})
	}
}

// readOnlyDir names, in the environment of TestReadOnlyUnderSystemd's child,
// the directory where it mounts a read-only file system.
const readOnlyDir = "STORE_TEST_READ_ONLY_DIR"

// TestReadOnlyUnderSystemd: a path the builder must write that is on a
// read-only file system is named as such; when systemd runs the builder, whose
// sandbox makes every path but its ReadWritePaths read-only, the message says
// which path to add there, in which drop-in, and that it must exist first. The
// read-only file system is a real one, mounted by a child of the test in a
// mount namespace of its own.
func TestReadOnlyUnderSystemd(t *testing.T) {
	if dir := os.Getenv(readOnlyDir); dir != "" {
		checkReadOnly(t, dir)
		return
	}
	if os.Geteuid() != 0 {
		testenv.Unavailable(t, "mounting a read-only file system needs root")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestReadOnlyUnderSystemd$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), readOnlyDir+"="+t.TempDir())
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS} // the mount stays the child's
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestReadOnlyUnderSystemd") {
		t.Fatalf("the child that mounts a read-only file system: %v\n%s", err, out)
	}
	t.Logf("the child:\n%s", out)
}

// checkReadOnly is TestReadOnlyUnderSystemd in the child, in its own mount
// namespace: it mounts a file system on dir holding ro/images and ro/state,
// makes it read-only, and checks what the builder says of paths in it.
func checkReadOnly(t *testing.T, dir string) {
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("mount a tmpfs on %s: %v", dir, err)
	}
	ro := filepath.Join(dir, "ro")
	for _, d := range []string{filepath.Join(ro, "images"), filepath.Join(ro, "state")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Fatalf("make %s read-only: %v", dir, err)
	}
	writable := t.TempDir()
	images, fresh := filepath.Join(ro, "images"), filepath.Join(ro, "new", "images")
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	group, err := user.LookupGroupId(me.Gid)
	if err != nil {
		t.Fatal(err)
	}
	dropIn := "in a drop-in, " + systemd.DropInDir + "/paths.conf"
	for _, tt := range []struct {
		name      string
		images    string
		db        string
		says      []string
		addsUnder string // the path the message adds to ReadWritePaths under systemd
		create    string // the command that makes it first, when it does not exist
	}{
		{name: "images-dir", images: images, db: filepath.Join(images, "builder.db"),
			says: []string{"images-dir " + images + " is on a read-only file system (" + images + ")"}, addsUnder: images},
		{name: "images-dir to be made", images: fresh, db: filepath.Join(fresh, "builder.db"),
			says:      []string{"images-dir " + fresh + " cannot be created: " + ro + " is on a read-only file system"},
			addsUnder: fresh, create: "install -d -o " + me.Username + " -g " + group.Name + " " + fresh},
		{name: "state-db elsewhere", images: writable, db: filepath.Join(ro, "state", "builder.db"),
			says: []string{"images-dir " + writable + " is on a read-only file system (" + filepath.Join(ro, "state") + ")"}, addsUnder: filepath.Join(ro, "state")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("INVOCATION_ID", "")
			os.Unsetenv("INVOCATION_ID")
			plain := store.CheckImagesDir(tt.images, tt.db)
			t.Setenv("INVOCATION_ID", "0123456789abcdef0123456789abcdef")
			underSystemd := store.CheckImagesDir(tt.images, tt.db)
			if plain == nil || underSystemd == nil {
				t.Fatalf("CheckImagesDir(%s, %s) = %v, and under systemd %v; want errors", tt.images, tt.db, plain, underSystemd)
			}
			for _, s := range tt.says {
				if !strings.Contains(plain.Error(), s) || !strings.Contains(underSystemd.Error(), s) {
					t.Errorf("the errors do not say %q:\n%v\n%v", s, plain, underSystemd)
				}
			}
			if strings.Contains(plain.Error(), "ReadWritePaths") {
				t.Errorf("outside systemd the error speaks of ReadWritePaths: %v", plain)
			}
			for _, s := range []string{"ReadWritePaths=" + tt.addsUnder + "\"", dropIn, "systemctl daemon-reload"} {
				if !strings.Contains(underSystemd.Error(), s) {
					t.Errorf("under systemd the error does not say %q: %v", s, underSystemd)
				}
			}
			if tt.create != "" && !strings.Contains(underSystemd.Error(), "it must exist before the service starts: "+tt.create) {
				t.Errorf("under systemd the error does not say to make %s first with %q: %v", tt.addsUnder, tt.create, underSystemd)
			}
		})
	}
}
