package config

import (
	"errors"
	"fmt"
	"testing"
)

func TestErrorFormat(t *testing.T) {
	tests := []struct {
		err  Error
		want string
	}{
		{
			Error{File: "nodepool.yaml", Line: 23, Path: "providers[1].diskimages[0].name", Msg: `"debian" is neither a diskimage nor a zuul-image`},
			`nodepool.yaml:23: providers[1].diskimages[0].name: "debian" is neither a diskimage nor a zuul-image`,
		},
		{Error{File: "/etc/nodepool/nodepool.yaml", Line: 1, Msg: "YAML syntax error: x"}, "/etc/nodepool/nodepool.yaml:1: YAML syntax error: x"},
		{Error{File: "a.yaml", Path: "images-dir", Msg: "is required"}, "a.yaml: images-dir: is required"},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("Error() = %q, want %q", got, tt.want)
		}
	}
}

func TestErrorsJoinAndAs(t *testing.T) {
	first := &Error{File: "f", Line: 1, Path: "a", Msg: "one"}
	second := &Error{File: "f", Line: 2, Path: "b", Msg: "two"}
	var err error = fmt.Errorf("load: %w", Errors{first, second})

	if got, want := err.Error(), "load: f:1: a: one\nf:2: b: two"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	var e *Error
	if !errors.As(err, &e) || e != first {
		t.Errorf("errors.As(*Error) = %v, want the first error", e)
	}
	if !errors.Is(err, second) {
		t.Errorf("errors.Is does not find the second error")
	}
	var es Errors
	if !errors.As(err, &es) || len(es) != 2 {
		t.Errorf("errors.As(Errors) = %v, want both errors", es)
	}
}

func TestErrorsSorted(t *testing.T) {
	es := Errors{{Line: 9, Path: "b"}, {Line: 2, Path: "z"}, {Line: 9, Path: "a"}}.sorted()
	var got []string
	for _, e := range es {
		got = append(got, fmt.Sprintf("%d:%s", e.Line, e.Path))
	}
	if fmt.Sprint(got) != "[2:z 9:a 9:b]" {
		t.Errorf("sorted = %v, want [2:z 9:a 9:b]", got)
	}
}
