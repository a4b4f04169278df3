package config

import (
	"reflect"
	"testing"
	"time"
)

func TestInheritance(t *testing.T) {
	// The leaf is defined before its ancestors: order in the file must not matter.
	cfg := mustParse(t, `images-dir: /i
diskimages:
  - name: leaf
    parent: mid
    elements: [leaf-element]
    env-vars:
      B: leaf
      C: leaf
    release: noble
  - name: mid
    parent: base
    elements: [mid-element]
    env-vars:
      B: mid
    formats: [raw]
    rebuild-age: 600
    pause: true
  - name: base
    abstract: true
    elements: [base-element]
    env-vars:
      A: base
      B: base
    formats: [qcow2, vhd]
    dib-cmd: /opt/dib/bin/disk-image-create
    username: ubuntu
    metadata:
      os_distro: ubuntu
  - name: sibling
    parent: mid
    elements: [sibling-element]
    pause: false
    metadata: {}
`)
	leaf := DiskImage{
		Name:         "leaf",
		Parent:       "mid",
		Elements:     []string{"base-element", "mid-element", "leaf-element"},
		EnvVars:      map[string]string{"A": "base", "B": "leaf", "C": "leaf"},
		Formats:      []string{"raw"},
		Release:      "noble",
		RebuildAge:   600 * time.Second,
		BuildTimeout: DefaultBuildTimeout,
		Pause:        true,
		DIBCmd:       "/opt/dib/bin/disk-image-create",
		Username:     "ubuntu",
		PythonPath:   "auto",
		Metadata:     map[string]string{"os_distro": "ubuntu"},
	}
	mid := DiskImage{
		Name:         "mid",
		Parent:       "base",
		Elements:     []string{"base-element", "mid-element"},
		EnvVars:      map[string]string{"A": "base", "B": "mid"},
		Formats:      []string{"raw"},
		RebuildAge:   600 * time.Second,
		BuildTimeout: DefaultBuildTimeout,
		Pause:        true,
		DIBCmd:       "/opt/dib/bin/disk-image-create",
		Username:     "ubuntu",
		PythonPath:   "auto",
		Metadata:     map[string]string{"os_distro": "ubuntu"},
	}
	sibling := mid
	sibling.Name = "sibling"
	sibling.Parent = "mid"
	sibling.Elements = []string{"base-element", "mid-element", "sibling-element"}
	sibling.Pause = false
	sibling.Metadata = map[string]string{}

	want := []DiskImage{leaf, mid, sibling}
	if !reflect.DeepEqual(cfg.DiskImages, want) {
		t.Errorf("DiskImages =\n%+v\nwant\n%+v", cfg.DiskImages, want)
	}
	if cfg.DiskImage("base") != nil {
		t.Errorf("abstract image base is in DiskImages")
	}

	// Children of one parent must not share storage.
	l := cfg.DiskImage("leaf")
	l.Elements[0] = "changed"
	l.EnvVars["A"] = "changed"
	l.Formats[0] = "changed"
	l.Metadata["os_distro"] = "changed"
	if m := cfg.DiskImage("mid"); !reflect.DeepEqual(*m, mid) {
		t.Errorf("changing a child changed its parent: %+v", m)
	}
}

func TestInheritanceDeepChain(t *testing.T) {
	cfg := mustParse(t, `images-dir: /i
diskimages:
  - {name: l0, abstract: true, elements: [e0], build-timeout: 100}
  - {name: l1, abstract: true, parent: l0, elements: [e1]}
  - {name: l2, abstract: true, parent: l1, elements: [e2]}
  - {name: l3, abstract: true, parent: l2, elements: [e3]}
  - {name: l4, parent: l3, elements: [e4]}
`)
	if got := cfg.ImageNames(); !reflect.DeepEqual(got, []string{"l4"}) {
		t.Fatalf("ImageNames = %v, want only l4", got)
	}
	l4 := cfg.DiskImage("l4")
	if want := []string{"e0", "e1", "e2", "e3", "e4"}; !reflect.DeepEqual(l4.Elements, want) {
		t.Errorf("elements = %v, want %v", l4.Elements, want)
	}
	if l4.BuildTimeout != 100*time.Second {
		t.Errorf("build-timeout = %v, want 100s from l0", l4.BuildTimeout)
	}
}

func TestInheritanceErrorsStayLocal(t *testing.T) {
	// A child of a broken image is not reported again, and an unrelated
	// image is still read.
	_, err := parse(`images-dir: /i
diskimages:
  - name: a
    parent: b
  - name: b
    parent: a
  - name: c
    parent: a
  - name: d
    parent: missing
`)
	var es Errors
	if !asErrors(err, &es) || len(es) != 2 {
		t.Fatalf("errors = %v, want the cycle and the missing parent only", err)
	}
	wantError(t, err, 4, "diskimages[0].parent", "parents form a cycle (a -> b -> a)")
	wantError(t, err, 10, "diskimages[3].parent", `"missing" is not a diskimage`)
}

func asErrors(err error, es *Errors) bool {
	e, ok := err.(Errors)
	*es = e
	return ok
}
