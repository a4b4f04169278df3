package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/z-division/go-zookeeper/zk"
)

// The writes of the marks of leaked images, under our root.

// LeakMark records the first sighting of a leaked image under our root.
func (b *Backend) LeakMark(_ context.Context, provider, externalID string) (time.Time, error) {
	p := leakPath(provider, externalID)
	if err := b.ensure(ourRoot + "/leaks/" + provider); err != nil {
		return time.Time{}, err
	}
	now := b.now()
	_, err := b.create(p, []byte(strconv.FormatInt(now.UnixNano(), 10)), 0)
	if err != nil && !errors.Is(err, zk.ErrNodeExists) {
		return time.Time{}, fmt.Errorf("record leaked image %s in %s: %w", externalID, provider, err)
	}
	data, _, err := b.get(p)
	if err != nil {
		return time.Time{}, fmt.Errorf("read leaked image %s in %s: %w", externalID, provider, err)
	}
	n, err := strconv.ParseInt(string(data), 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("read leaked image %s in %s: %w", externalID, provider, err)
	}
	return time.Unix(0, n).UTC(), nil
}

// ClearLeakMarks forgets a provider's marks except keep.
func (b *Backend) ClearLeakMarks(_ context.Context, provider string, keep map[string]bool) error {
	kids, _, err := b.children(ourRoot + "/leaks/" + provider)
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list leak marks of %s: %w", provider, err)
	}
	for _, id := range kids {
		if keep[id] {
			continue
		}
		if err := b.delete(leakPath(provider, id), -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
			return fmt.Errorf("clear leak mark %s in %s: %w", id, provider, err)
		}
	}
	return nil
}
