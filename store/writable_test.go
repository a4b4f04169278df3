package store_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

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
