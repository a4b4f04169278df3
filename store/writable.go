package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/nodepool-builder/nodepool-builder/internal/systemd"
)

// CheckImagesDir checks, creating nothing, that this process can work in an
// images-dir: create it, or write in it and write the files the builder writes
// there (builder_id.txt, builder.lock, .partial/ and the downloads in it, and
// the SQLite state at dbPath with its -wal and -shm files, when dbPath is set).
// A first start as root leaves them root's, and the service's user then meets
// a bare "permission denied" somewhere: this names them all at once.
func CheckImagesDir(imagesDir, dbPath string) error {
	files := []string{"builder_id.txt", "builder.lock", partialDirName}
	if partials, err := os.ReadDir(filepath.Join(imagesDir, partialDirName)); err == nil {
		for _, e := range partials {
			files = append(files, filepath.Join(partialDirName, e.Name()))
		}
	}
	if dbPath != "" {
		files = append(files, dbPath, dbPath+"-wal", dbPath+"-shm")
		// SQLite makes its -wal and -shm files beside the database.
		if dir := filepath.Dir(dbPath); filepath.Clean(dir) != filepath.Clean(imagesDir) {
			files = append(files, dir)
		}
	}
	return CheckWritable("images-dir", imagesDir, files...)
}

// CheckWritable checks, creating nothing, that this process can work in dir
// (what names it in messages, e.g. "build-log-dir"): create it when it does not
// exist, else write in it and write each of files (names in dir, or absolute
// paths) that exists. The error names every path that cannot be written, its
// owner, the user running, and the command, run as root, that gives them to that
// user.
func CheckWritable(what, dir string, files ...string) error {
	me := currentUser()
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
		return checkCreatable(what, dir, me)
	case err != nil:
		return fmt.Errorf("%s %s: %w", what, dir, err)
	case !fi.IsDir():
		return fmt.Errorf("%s %s is not a directory: point %s at a directory", what, dir, what)
	}
	var denied, outside []string
	check := func(path string, isDir bool) error {
		mode := uint32(unix.W_OK)
		if isDir {
			mode |= unix.X_OK
		}
		err := unix.Access(path, mode)
		if errors.Is(err, syscall.EROFS) {
			writable := dir // what a sandbox must let the builder write
			if !within(path, dir) {
				writable = path
				if !isDir {
					writable = filepath.Dir(path)
				}
			}
			return fmt.Errorf("%s %s is on a read-only file system (%s): point %s at a writable directory%s",
				what, dir, path, what, systemd.ReadOnlyHint(writable, ""))
		}
		if err != nil {
			denied = append(denied, path+" ("+ownerOf(path)+")")
			if !within(path, dir) {
				outside = append(outside, path)
			}
		}
		return nil
	}
	if err := check(dir, true); err != nil {
		return err
	}
	for _, f := range files {
		path := f
		if !filepath.IsAbs(path) {
			path = filepath.Join(dir, f)
		}
		fi, err := os.Lstat(path)
		if err != nil || fi.Mode()&fs.ModeSymlink != 0 {
			continue // missing: the builder makes it in dir
		}
		if err := check(path, fi.IsDir()); err != nil {
			return err
		}
	}
	if len(denied) == 0 {
		return nil
	}
	fix := "chown -R " + me.chown() + " " + dir
	for _, p := range outside {
		fix += " " + p
	}
	return fmt.Errorf("%s %s cannot be written by %s, who runs the builder: %s cannot be written. Give them to that user "+
		"(as root: %s), or run the builder as their owner", what, dir, me, strings.Join(denied, ", "), fix)
}

// checkCreatable checks that dir, which does not exist, can be made: its
// nearest existing parent must be a directory this process can write in.
func checkCreatable(what, dir string, me userInfo) error {
	parent := filepath.Dir(filepath.Clean(dir))
	for {
		if _, err := os.Stat(parent); err == nil || parent == filepath.Dir(parent) {
			break
		}
		parent = filepath.Dir(parent)
	}
	fi, err := os.Stat(parent)
	if err != nil {
		return fmt.Errorf("%s %s does not exist and cannot be created: %w", what, dir, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s %s cannot be created: %s is not a directory", what, dir, parent)
	}
	err = unix.Access(parent, unix.W_OK|unix.X_OK)
	switch {
	case errors.Is(err, syscall.EROFS):
		return fmt.Errorf("%s %s cannot be created: %s is on a read-only file system; point %s at a writable directory%s",
			what, dir, parent, what, systemd.ReadOnlyHint(dir, "install -d -o "+me.name+" -g "+me.group+" "+dir))
	case err != nil:
		return fmt.Errorf("%s %s does not exist, and %s, who runs the builder, cannot create it in %s (%s). Create it for "+
			"that user (as root: install -d -o %s -g %s %s)", what, dir, me, parent, ownerOf(parent), me.name, me.group, dir)
	}
	return nil
}

// within tells whether path is dir or below it.
func within(path, dir string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// userInfo is the user running, as messages and commands name it.
type userInfo struct {
	uid, gid    int
	name, group string // numeric when the system has no name for them
	named       bool   // name is a user name (chown's "name:" takes its login group)
}

func (u userInfo) String() string { return fmt.Sprintf("%s (uid %d)", u.name, u.uid) }

// chown is the owner argument of chown that gives a path to u.
func (u userInfo) chown() string {
	if u.named {
		return u.name + ":"
	}
	return u.name + ":" + u.group
}

func currentUser() userInfo {
	u := userInfo{uid: os.Getuid(), gid: os.Getgid()}
	u.name, u.group = strconv.Itoa(u.uid), strconv.Itoa(u.gid)
	if pw, err := user.LookupId(u.name); err == nil {
		u.name, u.named = pw.Username, true
	}
	if g, err := user.LookupGroupId(u.group); err == nil {
		u.group = g.Name
	}
	return u
}

// ownerOf says who owns path and its mode, e.g. "owned by root, mode 0755".
func ownerOf(path string) string {
	fi, err := os.Stat(path)
	if err != nil {
		return err.Error()
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Sprintf("mode %04o", fi.Mode().Perm())
	}
	owner := strconv.FormatUint(uint64(st.Uid), 10)
	if pw, err := user.LookupId(owner); err == nil {
		owner = pw.Username
	} else {
		owner = "uid " + owner
	}
	return fmt.Sprintf("owned by %s, mode %04o", owner, fi.Mode().Perm())
}
