package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strconv"
	"time"

	"github.com/z-division/go-zookeeper/zk"
)

// The writes of nodepool's flag nodes of an image: its request-build and
// pause nodes.

// flag creates a flag node (pause, request-build) and records it in the cache.
// nodepool makes these nodes empty and takes their ctime, the server's clock, as
// when they were made; ours hold our clock's time in milliseconds, so that
// comparing them with the times of our builds does not depend on clock skew.
func (b *Backend) flag(p string) error {
	if err := b.ensure(path.Dir(p)); err != nil {
		return err
	}
	ms := strconv.FormatInt(b.now().UnixMilli(), 10)
	if _, err := b.create(p, []byte(ms), 0); err != nil && !errors.Is(err, zk.ErrNodeExists) {
		return err
	}
	data, stat, err := b.get(p)
	if errors.Is(err, zk.ErrNoNode) {
		return nil // cleared meanwhile
	}
	if err != nil {
		return err
	}
	b.cache.put(written{p, data, *stat})
	return nil
}

// RequestBuild creates nodepool's request-build node of the image.
func (b *Backend) RequestBuild(_ context.Context, image string) error {
	if err := b.flag(requestPath(image)); err != nil {
		return fmt.Errorf("record build request for %s: %w", image, err)
	}
	return nil
}

// ClearBuildRequest deletes an image's request-build node made at or before asOf.
func (b *Backend) ClearBuildRequest(_ context.Context, image string, asOf time.Time) error {
	data, stat, err := b.get(requestPath(image))
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("clear build request for %s: %w", image, err)
	}
	if flagTime(data, *stat).After(asOf) {
		return nil
	}
	if err := b.delete(requestPath(image), stat.Version); err != nil && !errors.Is(err, zk.ErrNoNode) {
		return fmt.Errorf("clear build request for %s: %w", image, err)
	}
	b.cache.drop(requestPath(image))
	return nil
}

// SetPaused creates or deletes nodepool's pause node of the image.
func (b *Backend) SetPaused(_ context.Context, image string, paused bool) error {
	var err error
	if paused {
		err = b.flag(pausePath(image))
	} else if err = b.delete(pausePath(image), -1); errors.Is(err, zk.ErrNoNode) {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("set pause of %s: %w", image, err)
	}
	if !paused {
		b.cache.drop(pausePath(image))
	}
	return nil
}
