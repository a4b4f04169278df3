package testenv

import "strings"

// MarkdownSection returns the text of a Markdown document under the heading
// line heading (e.g. "## Commands"), up to the next heading of the same or a
// higher level; ok is false without that heading. The tests that keep the
// docs true to the code read them with it.
func MarkdownSection(doc, heading string) (section string, ok bool) {
	level := HeadingLevel(heading)
	lines := strings.Split(doc, "\n")
	for i, l := range lines {
		if l != heading {
			continue
		}
		end := len(lines)
		for j := i + 1; j < len(lines); j++ {
			if l := HeadingLevel(lines[j]); l > 0 && l <= level {
				end = j
				break
			}
		}
		return strings.Join(lines[i+1:end], "\n"), true
	}
	return "", false
}

// HeadingLevel is the level of a Markdown heading line, 0 for other lines.
func HeadingLevel(line string) int {
	n := len(line) - len(strings.TrimLeft(line, "#"))
	if n == 0 || n > 6 || !strings.HasPrefix(line[n:], " ") {
		return 0
	}
	return n
}
