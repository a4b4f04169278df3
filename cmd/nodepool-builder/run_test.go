package main

import (
	"errors"
	"fmt"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/service"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// TestServiceExitCodes: what the service says of its end makes the exit code
// the builder has always given it, with the message unchanged.
func TestServiceExitCodes(t *testing.T) {
	steps := errors.Join(errors.New("poll debian: 503"), errors.New("upload debian to cloud-a: 403"))
	for _, tt := range []struct {
		name string
		err  error
		code int
	}{
		{"images-dir locked", fmt.Errorf("lock /images: %w", store.ErrLocked), exitLocked},
		{"config unusable", fmt.Errorf("%w: provider pa: no cloud", config.ErrUnusable), exitUsage},
		{"another builder's state", fmt.Errorf("state: %w", store.ErrOtherBuilder), exitUsage},
		{"another program's images-dir", fmt.Errorf("state: %w", store.ErrForeignImagesDir), exitUsage},
		{"pid file", errors.New("pid file: permission denied"), exitFailed},
		{"--once steps", &service.StepsError{Err: steps}, exitFailed},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := withServiceCode(tt.err)
			var ee *exitError
			if !errors.As(err, &ee) || ee.code != tt.code {
				t.Fatalf("%v: exit %v, want %d", tt.err, err, tt.code)
			}
			var failed *stepsFailed
			if errors.As(tt.err, new(*service.StepsError)) {
				if !errors.As(err, &failed) || len(failed.errs) != 2 {
					t.Errorf("--once summary %#v, want its two steps", err)
				}
			} else if err.Error() != tt.err.Error() {
				t.Errorf("message %q, want %q", err, tt.err)
			}
		})
	}
	if withServiceCode(nil) != nil {
		t.Error("a run that ended well has an exit error")
	}
}
