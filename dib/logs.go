package dib

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// buildIDLen is the length of a build id: a uuid4 in hex.
const buildIDLen = 32

// isImageLog tells whether name is the log of a build of image. The build id
// must be 32 hex digits, so that image "fedora" never claims "fedora-40"'s logs.
func isImageLog(name, image string) bool {
	rest, ok := strings.CutPrefix(name, image+"-")
	if !ok {
		return false
	}
	id, ok := strings.CutSuffix(rest, ".log")
	if !ok || len(id) != buildIDLen {
		return false
	}
	for _, c := range id {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// pruneLogs removes the oldest build logs of image in dir so that keep remain;
// keep < 0 keeps them all. Build ids are random, so age is the file's mtime.
// It returns the paths it removed.
func pruneLogs(dir, image string, keep int) ([]string, error) {
	if keep < 0 {
		return nil, nil
	}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list build logs of %s in %s: %w", image, dir, err)
	}
	type logFile struct {
		name string
		mod  time.Time
	}
	var logs []logFile
	for _, e := range entries {
		if !e.Type().IsRegular() || !isImageLog(e.Name(), image) {
			continue
		}
		info, err := e.Info()
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list build logs of %s in %s: %w", image, dir, err)
		}
		logs = append(logs, logFile{e.Name(), info.ModTime()})
	}
	if len(logs) <= keep {
		return nil, nil
	}
	sort.Slice(logs, func(i, j int) bool {
		if !logs[i].mod.Equal(logs[j].mod) {
			return logs[i].mod.After(logs[j].mod)
		}
		return logs[i].name > logs[j].name
	})
	var removed []string
	for _, l := range logs[keep:] {
		p := filepath.Join(dir, l.name)
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return removed, fmt.Errorf("remove old build log %s: %w", p, err)
		}
		removed = append(removed, p)
	}
	return removed, nil
}
