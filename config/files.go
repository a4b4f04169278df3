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

// Files names the two files a config is read from: nodepool.yaml, which is
// nodepool's and which nodepool-launcher and Python nodepool-builders read
// too, and the builder's own file, which holds what nodepool's schema has no
// key for (zuul-images and the builder section).
type Files struct {
	Nodepool string
	// Builder is the builder's own file. Empty means BuilderFileName in the
	// directory of Nodepool, read when it exists; a file named here must exist.
	Builder string
}

// builder returns the path of the builder's own file and whether it was
// named, rather than taken beside nodepool.yaml.
func (f Files) builder() (path string, named bool) {
	if f.Builder != "" {
		return f.Builder, true
	}
	return filepath.Join(filepath.Dir(f.Nodepool), BuilderFileName), false
}

// Source is the text of one config file, with the name its errors carry.
type Source struct {
	Name string
	Data []byte
}

// Load reads and validates the config files. Environment variables named in
// %(NODEPOOL_FOO) are taken from the process environment.
func Load(f Files) (*Config, error) {
	data, err := os.ReadFile(f.Nodepool)
	if err != nil {
		return nil, fmt.Errorf("read config %s: %w", f.Nodepool, err)
	}
	own, err := readBuilderFile(f)
	if err != nil {
		return nil, err
	}
	cfg, err := ParseFiles(Source{Name: f.Nodepool, Data: data}, own, os.LookupEnv)
	if err != nil {
		return nil, err
	}
	cfg.Files = f
	return cfg, nil
}

// readBuilderFile reads the builder's own file: nil when it is taken beside
// nodepool.yaml and is not there.
func readBuilderFile(f Files) (*Source, error) {
	path, named := f.builder()
	if same, _ := sameFile(path, f.Nodepool); same {
		return nil, fmt.Errorf("read builder config %s: it is the nodepool config itself; name the builder's own file "+
			"(zuul-images and builder), e.g. %s beside it", path, BuilderFileName)
	}
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		return &Source{Name: path, Data: data}, nil
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

// Snapshot is what the config files hold now, as one value: a change of
// either file (the builder's own file appearing or going included) changes it.
// A daemon compares snapshots to tell when to reload.
func Snapshot(f Files) ([]byte, error) {
	data, err := os.ReadFile(f.Nodepool)
	if err != nil {
		return nil, err
	}
	path, _ := f.builder()
	own, err := os.ReadFile(path)
	var b bytes.Buffer
	b.Write(data)
	switch {
	case err == nil:
		b.WriteString("\x00builder\x00")
		b.Write(own)
	case errors.Is(err, fs.ErrNotExist):
		b.WriteString("\x00no builder file\x00")
	default:
		return nil, err
	}
	return b.Bytes(), nil
}
