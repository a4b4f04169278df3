package zookeeper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/z-division/go-zookeeper/zk"

	"github.com/nodepool-builder/nodepool-builder/store"
)

// BindBuilder returns id: builders that share a cluster each have their own id,
// which every build records; there is no single one to bind the state to.
func (b *Backend) BindBuilder(_ context.Context, id string) (string, error) { return id, nil }

// Build reads one build afresh from ZooKeeper (not from the cache): callers
// read a build to change it.
func (b *Backend) Build(_ context.Context, id string) (store.Build, error) {
	image, ok := b.cache.imageOf(id)
	if !ok {
		// Made by another builder a moment ago, perhaps: look in every image.
		if image, ok = b.findBuild(id); !ok {
			return store.Build{}, fmt.Errorf("build %s: %w", id, store.ErrNotFound)
		}
	}
	p := buildPath(image, id)
	data, stat, err := b.get(p)
	if errors.Is(err, zk.ErrNoNode) {
		return store.Build{}, fmt.Errorf("build %s: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return store.Build{}, fmt.Errorf("read build %s: %w", id, err)
	}
	put := []written{{p, data, *stat}}
	extra, xstat, err := b.get(p + "/" + extraNode)
	if errors.Is(err, zk.ErrNoNode) {
		extra = nil
	} else if err != nil {
		return store.Build{}, fmt.Errorf("read build %s: %w", id, err)
	} else {
		put = append(put, written{p + "/" + extraNode, extra, *xstat})
	}
	b.cache.put(put...)
	bd, err := decodeBuild(image, id, data, stat, extra)
	if err != nil {
		return store.Build{}, fmt.Errorf("record %s is refused: %w", p, err)
	}
	return bd, nil
}

// findBuild looks for a build in ZooKeeper itself.
func (b *Backend) findBuild(id string) (string, bool) {
	images, _, err := b.children(imageRoot)
	if err != nil {
		return "", false
	}
	for _, image := range images {
		if ok, _, err := b.exists(buildPath(image, id)); err == nil && ok {
			return image, true
		}
	}
	return "", false
}

// flagTime is when a flag node was made: the time it holds, or its ctime for
// one nodepool made.
func flagTime(data []byte, stat zk.Stat) time.Time {
	if ms, err := strconv.ParseInt(string(data), 10, 64); err == nil {
		return time.UnixMilli(ms).UTC()
	}
	return time.UnixMilli(stat.Ctime).UTC()
}

// Builds returns the cached builds that match f, newest first.
func (b *Backend) Builds(_ context.Context, f store.BuildFilter) ([]store.Build, error) {
	v := b.cache.records()
	var out []store.Build
	for _, bd := range v.builds {
		if (f.Image == "" || bd.Image == f.Image) && (f.State == "" || bd.State == f.State) &&
			(f.Source == "" || bd.Source == f.Source) {
			out = append(out, ownBuild(bd))
		}
	}
	return out, nil
}

// ownBuild copies what a build shares with the cache's view, which callers
// may change (SetFile, Refuse) and the view must not see.
func ownBuild(bd store.Build) store.Build {
	bd.Files = slices.Clone(bd.Files)
	if bd.Refused != nil {
		bd.Refused = maps.Clone(bd.Refused)
	}
	return bd
}

// Uploads returns the cached uploads that match f: newest build first, then by
// provider, newest upload first. An upload whose build record is gone or not
// read yet is left out.
func (b *Backend) Uploads(_ context.Context, f store.UploadFilter) ([]store.Upload, error) {
	v := b.cache.records()
	match := func(u *store.Upload) bool {
		return (f.Provider == "" || u.Provider == f.Provider) && (f.State == "" || u.State == f.State)
	}
	// Counted first: a step reads every upload, and growing a slice of tens
	// of thousands by appending copies them over and over.
	var spans [][2]int
	n := 0
	for i, bd := range v.builds {
		if (f.BuildID != "" && bd.ID != f.BuildID) || (f.Image != "" && bd.Image != f.Image) {
			continue
		}
		spans = append(spans, v.spans[i])
		for k := v.spans[i][0]; k < v.spans[i][1]; k++ {
			if match(&v.uploads[k]) {
				n++
			}
		}
	}
	if n == 0 {
		return nil, nil
	}
	out := make([]store.Upload, 0, n)
	for _, sp := range spans {
		for k := sp[0]; k < sp[1]; k++ {
			if match(&v.uploads[k]) {
				out = append(out, v.uploads[k])
			}
		}
	}
	return out, nil
}

// Cursor reads an image's poll cursor.
func (b *Backend) Cursor(_ context.Context, image string) (store.Cursor, error) {
	c := store.Cursor{Image: image}
	data, _, err := b.get(cursorPath(image))
	if errors.Is(err, zk.ErrNoNode) {
		return c, nil
	}
	if err != nil {
		return c, fmt.Errorf("read poll cursor of %s: %w", image, err)
	}
	var j cursorJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return c, fmt.Errorf("read poll cursor of %s: %w", image, err)
	}
	c.ZuulID, c.ZuulUUID, c.Outcome, c.Reason, c.Time = j.ZuulID, j.ZuulUUID, j.Outcome, j.Reason, fromSeconds(j.Time)
	c.ZuulEndTime, c.BehindID, c.Build, c.Waiting = fromSeconds(j.ZuulEndTime), j.BehindID, j.Build, j.Waiting
	return c, store.RefuseCursor(c)
}

// BuildRequests returns the images with a request-build node, with when it was
// made.
func (b *Backend) BuildRequests(context.Context) (map[string]time.Time, error) {
	return b.cache.flags("request-build"), nil
}

// BuildRequest reads an image's request-build node afresh from ZooKeeper.
func (b *Backend) BuildRequest(_ context.Context, image string) (time.Time, bool, error) {
	data, stat, err := b.get(requestPath(image))
	if errors.Is(err, zk.ErrNoNode) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, fmt.Errorf("read build request for %s: %w", image, err)
	}
	return flagTime(data, *stat), true, nil
}

// Paused returns the images with a pause node, with when it was made.
func (b *Backend) Paused(context.Context) (map[string]time.Time, error) {
	return b.cache.flags("pause"), nil
}

// ImageNames lists the image nodes under /nodepool/images, as nodepool's
// getImageNames does: an image keeps its node once it has one.
func (b *Backend) ImageNames(context.Context) ([]string, error) {
	return b.cache.imageNames(), nil
}
