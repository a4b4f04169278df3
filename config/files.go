package config

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// BuilderFileName is the builder's own config file, read beside nodepool.yaml
// unless another is named.
const BuilderFileName = "nodepool-builder.yaml"

// Files names the files a config is read from: nodepool.yaml, which is
// nodepool's and which nodepool-launcher and Python nodepool-builders read
// too; the builder's own file, which holds what nodepool's schema has no key
// for (zuul-images and the builder section); and nodepool's secure file, when
// one is named.
type Files struct {
	Nodepool string
	// Builder is the builder's own file. Empty means BuilderFileName in the
	// directory of Nodepool, read when it exists; a file named here must exist.
	Builder string
	// Secure is nodepool's secure file (its -s), which holds the ZooKeeper
	// settings and diskimages' env-vars a site keeps apart; empty: none. A
	// file named here must exist.
	Secure string
}

// Flags are the command-line flags that name these files, for a command an
// error tells the operator to run.
func (f Files) Flags() string {
	flags := "-c " + f.Nodepool
	if f.Builder != "" {
		flags += " --builder-config " + f.Builder
	}
	if f.Secure != "" {
		flags += " -s " + f.Secure
	}
	return flags
}

// builder returns the path of the builder's own file and whether it was
// named, rather than taken beside nodepool.yaml.
func (f Files) builder() (path string, named bool) {
	if f.Builder != "" {
		return f.Builder, true
	}
	return filepath.Join(filepath.Dir(f.Nodepool), BuilderFileName), false
}

// Text is the text of one config file, with the name its errors carry.
type Text struct {
	Name string
	Data []byte
}

// Load reads and validates the config files. Environment variables named in
// %(NODEPOOL_FOO) are taken from the process environment.
func Load(f Files) (*Config, error) {
	s, err := Read(f)
	if err != nil {
		return nil, err
	}
	return s.Load()
}

// Snapshot is the text of the config files as read at one time. A daemon
// compares snapshots to tell when to reload, and loads the very snapshot it
// compared: a later read of the files could hold something else.
type Snapshot struct {
	Files    Files
	Nodepool Text
	Builder  *Text // nil: there is no builder file beside nodepool.yaml
	Secure   *Text // nil: no secure file is named
}

// Read reads the config files, the one place that does.
func Read(f Files) (*Snapshot, error) {
	data, err := os.ReadFile(f.Nodepool)
	if err != nil {
		return nil, fmt.Errorf("read config %s: %w", f.Nodepool, err)
	}
	own, err := readBuilderFile(f)
	if err != nil {
		return nil, err
	}
	secure, err := readSecureFile(f)
	if err != nil {
		return nil, err
	}
	return &Snapshot{Files: f, Nodepool: Text{Name: f.Nodepool, Data: data}, Builder: own, Secure: secure}, nil
}

// Load validates the snapshot's text, as Load does the files'.
func (s *Snapshot) Load() (*Config, error) {
	cfg, err := ParseFiles(s.Nodepool, s.Builder, s.Secure, os.LookupEnv)
	if err != nil {
		return nil, err
	}
	cfg.Files = s.Files
	cfg.Snapshot = s
	return cfg, nil
}

// Equal tells whether two snapshots hold the same text: a change of any
// file, the builder's own file coming or going included, makes them differ.
func (s *Snapshot) Equal(o *Snapshot) bool {
	if s == nil || o == nil {
		return s == o
	}
	return s.Files == o.Files && bytes.Equal(s.Nodepool.Data, o.Nodepool.Data) &&
		sameText(s.Builder, o.Builder) && sameText(s.Secure, o.Secure)
}

// sameText tells whether two optional files hold the same text.
func sameText(a, b *Text) bool {
	if a == nil || b == nil {
		return a == b
	}
	return bytes.Equal(a.Data, b.Data)
}

// readSecureFile reads nodepool's secure file: nil when none is named.
func readSecureFile(f Files) (*Text, error) {
	if f.Secure == "" {
		return nil, nil
	}
	data, err := os.ReadFile(f.Secure)
	if err != nil {
		return nil, fmt.Errorf("read secure config %s: %w; -s names nodepool's secure file (zookeeper-servers, "+
			"zookeeper-tls, and diskimages' env-vars): check the path, or leave out -s when there is none", f.Secure, err)
	}
	return &Text{Name: f.Secure, Data: data}, nil
}

// readBuilderFile reads the builder's own file: nil when it is taken beside
// nodepool.yaml and is not there.
func readBuilderFile(f Files) (*Text, error) {
	path, named := f.builder()
	if same, _ := sameFile(path, f.Nodepool); same {
		return nil, fmt.Errorf("read builder config %s: it is the nodepool config itself; name the builder's own file "+
			"(zuul-images and builder), e.g. %s beside it", path, BuilderFileName)
	}
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		return &Text{Name: path, Data: data}, nil
	case errors.Is(err, fs.ErrNotExist) && !named:
		return nil, nil
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("read builder config %s: %w; --builder-config names the builder's own file "+
			"(zuul-images and builder): create it, or leave the flag out to read %s beside %s when it exists",
			path, err, BuilderFileName, f.Nodepool)
	default:
		return nil, fmt.Errorf("read builder config %s: %w", path, err)
	}
}

// sameFile tells whether two paths name one file.
func sameFile(a, b string) (bool, error) {
	fa, err := os.Stat(a)
	if err != nil {
		return false, err
	}
	fb, err := os.Stat(b)
	if err != nil {
		return false, err
	}
	return os.SameFile(fa, fb), nil
}
