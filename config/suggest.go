package config

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// unknownKeyMsg says that key is not one of known in what, and names the
// known key the writer most likely meant, or lists them all when none is close.
func unknownKeyMsg(key, what string, known []string) string {
	if near, ok := nearestKey(key, known); ok {
		return fmt.Sprintf("unknown key in %s; did you mean %s?", what, near)
	}
	return fmt.Sprintf("unknown key in %s; known keys are %s", what, strings.Join(known, ", "))
}

// maxSuggestLen bounds the keys a suggestion is looked for: a longer one is
// no typo of a config key, and the distance costs its length squared.
const maxSuggestLen = 64

// nearestKey returns the known key that key is most likely a misspelling of:
// the same but for case or '_' against '-' (image_format for image-format),
// else the nearest by edit distance when it is close for the key's length.
// Among equally near keys the first in known wins.
func nearestKey(key string, known []string) (string, bool) {
	if utf8.RuneCountInString(key) > maxSuggestLen {
		return "", false
	}
	norm := func(s string) string { return strings.ToLower(strings.ReplaceAll(s, "_", "-")) }
	k := norm(key)
	// One edit is close for a short key; two for a longer one, whose
	// typos are more often two letters (elemnts, image_fromat).
	limit := 1
	if utf8.RuneCountInString(k) > 5 {
		limit = 2
	}
	best, bestDist := "", limit+1
	for _, c := range known {
		d := editDistance(k, norm(c))
		if d < bestDist {
			best, bestDist = c, d
		}
	}
	return best, best != ""
}

// editDistance is the optimal string alignment distance between a and b: the
// fewest insertions, deletions, substitutions and swaps of two neighbouring
// characters that turn one into the other ("puase" is one swap from "pause").
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	// Three rows of the table: d[i][j] is the distance of ra[:i] and rb[:j].
	prev2 := make([]int, len(rb)+1)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(rb)]
}
