package dib

import (
	"bytes"
	"io"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/nodepool-builder/nodepool-builder/progress"
)

// stepsEvery is how often the build log is read for the step DIB is at.
const stepsEvery = 500 * time.Millisecond

// maxNote bounds a step note, in characters: DIB's output is untrusted and may
// be long.
const maxNote = 80

var (
	// "dib-run-parts Running /tmp/in_target.d/install.d/10-apt" names the phase
	// and the script of an element that runs now.
	runningScript = regexp.MustCompile(`Running (?:\S*/)?([A-Za-z0-9_.-]+\.d)/([A-Za-z0-9_.-]+)`)
	// "Building elements: base debian-minimal ..." starts a build.
	buildingElements = regexp.MustCompile(`Building elements: (.+)`)
)

// stepOf returns the step a line of DIB's output names, or "".
func stepOf(line string) string {
	var note string
	if m := runningScript.FindStringSubmatch(line); m != nil {
		note = m[1] + "/" + m[2]
	} else if m := buildingElements.FindStringSubmatch(line); m != nil {
		note = "elements: " + m[1]
	} else {
		return ""
	}
	note = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || r == unicode.ReplacementChar {
			return -1
		}
		return r
	}, note)
	if r := []rune(note); len(r) > maxNote {
		note = string(r[:maxNote-1]) + "…"
	}
	return strings.TrimSpace(note)
}

// followSteps keeps the task's note on the last step DIB's log names, until
// the returned stop is called. DIB writes its log itself, with nothing of ours
// in between, so the log is read as it grows.
func followSteps(logFile string, task *progress.Task) (stop func()) {
	if task == nil {
		return func() {}
	}
	f, err := os.Open(logFile)
	if err != nil {
		// The build goes on; it only shows no step.
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		defer f.Close()
		t := time.NewTicker(stepsEvery)
		defer t.Stop()
		var partial []byte
		buf := make([]byte, 64<<10)
		for {
			for {
				n, err := f.Read(buf)
				partial = append(partial, buf[:n]...)
				for {
					i := bytes.IndexByte(partial, '\n')
					if i < 0 {
						break
					}
					if note := stepOf(string(partial[:i])); note != "" {
						task.SetNote(note)
					}
					partial = partial[i+1:]
				}
				// A line that never ends is not a step worth holding in memory.
				if len(partial) > 4<<10 {
					partial = partial[:0]
				}
				if n == 0 || err == io.EOF || err != nil {
					break
				}
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}
