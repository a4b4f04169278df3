package zuulapi

import (
	"regexp"
	"strings"
	"testing"
)

// TestQueryCheck: an answer is taken when it is what the query asked for, as
// Zuul's own filters select builds, and refused, saying why, for each field
// that differs.
func TestQueryCheck(t *testing.T) {
	q := Query{Project: "org/images", JobName: "build-debian", Pipelines: []string{"periodic", "post"},
		Branch: "master", Result: "SUCCESS", Complete: true, Final: true}
	good := Build{UUID: "0123456789abcdef0123456789ABCDEF", JobName: "build-debian", Result: "SUCCESS",
		Pipeline: "post", Final: true, Ref: Ref{Project: "org/images", Branch: "master"}}
	tests := []struct {
		name   string
		q      func(*Query)
		b      func(*Build)
		refuse string // "" when b answers q
	}{
		{name: "the build asked for"},
		{name: "another project", b: func(b *Build) { b.Ref.Project = "org/other" }, refuse: `project "org/other" is not "org/images"`},
		{name: "another job", b: func(b *Build) { b.JobName = "build-evil" }, refuse: `job "build-evil" is not "build-debian"`},
		{name: "FAILURE", b: func(b *Build) { b.Result = "FAILURE" }, refuse: `result "FAILURE" is not "SUCCESS"`},
		{name: "final false", b: func(b *Build) { b.Final = false }, refuse: "not final"},
		{name: "another pipeline", b: func(b *Build) { b.Pipeline = "check" }, refuse: `pipeline "check" is not one of ["periodic" "post"]`},
		{name: "another branch", b: func(b *Build) { b.Ref.Branch = "stable" }, refuse: `branch "stable" is not "master"`},
		{name: "a uuid with control characters", b: func(b *Build) { b.UUID = "0123456789abcdef0123456789abcde\x1b[2J\n" },
			refuse: `uuid "0123456789abcdef0123456789abcde\x1b[2J\n" is not 32 hex digits`},
		{name: "a uuid too short", b: func(b *Build) { b.UUID = "0123456789abcdef" }, refuse: "not 32 hex digits"},
		{name: "a uuid with a path", b: func(b *Build) { b.UUID = "../../../../etc/passwd0123456789a" }, refuse: "not 32 hex digits"},
		{name: "unfinished, no result asked", q: func(q *Query) { q.Result = "" }, b: func(b *Build) { b.Result = "" },
			refuse: "not finished"},
		{name: "several mismatches at once", b: func(b *Build) { b.Ref.Project, b.Result = "org/other", "FAILURE" },
			refuse: `project "org/other" is not "org/images"; result "FAILURE" is not "SUCCESS"`},

		{name: "any pipeline when the query names none", q: func(q *Query) { q.Pipelines = nil }, b: func(b *Build) { b.Pipeline = "gate" }},
		{name: "any branch when the query names none", q: func(q *Query) { q.Branch = "" }, b: func(b *Build) { b.Ref.Branch = "stable" }},
		{name: "non-final builds when the query does not ask", q: func(q *Query) { q.Final = false }, b: func(b *Build) { b.Final = false }},
		// Zuul's SQL reporter stores a project by its name, and filters on it:
		// a canonical name finds nothing there, and is not taken here either.
		{name: "a canonical name in the query", q: func(q *Query) { q.Project = "review.example.com/org/images" },
			refuse: `project "org/images" is not "review.example.com/org/images"`},
		{name: "a canonical name in the answer", b: func(b *Build) { b.Ref.Project = "review.example.com/org/images" },
			refuse: `project "review.example.com/org/images" is not "org/images"`},
		{name: "org is no host", q: func(q *Query) { q.Project = "org/images" }, b: func(b *Build) { b.Ref.Project = "images" },
			refuse: `project "images" is not "org/images"`},
		{name: "wildcards as Zuul's", q: func(q *Query) { q.Project, q.JobName, q.Pipelines = "org/*", "build-*", []string{"peri*"} },
			b: func(b *Build) { b.Pipeline = "periodic" }},
		{name: "a wildcard matches no other", q: func(q *Query) { q.JobName = "build-*-image" },
			refuse: `job "build-debian" is not "build-*-image"`},
		{name: "only * is special", q: func(q *Query) { q.JobName = "build-deb.an" }, refuse: `job "build-debian" is not "build-deb.an"`},
		{name: "% and _ are no wildcards", q: func(q *Query) { q.JobName, q.Branch = "build-%", "mast_r" },
			refuse: `job "build-debian" is not "build-%"; branch "master" is not "mast_r"`},
		{name: "a wildcard at the start", q: func(q *Query) { q.JobName, q.Project = "*-debian", "*/images" }},
		{name: "a wildcard in the middle", q: func(q *Query) { q.JobName = "build*ian" }},
		{name: "wildcards alone", q: func(q *Query) { q.JobName, q.Branch, q.Pipelines = "*", "**", []string{"*"} }},

		// Zuul's names are case-sensitive: MASTER is another branch, which
		// whoever may push can make, and MySQL, which answers it for master,
		// is not followed.
		{name: "a branch in other case", b: func(b *Build) { b.Ref.Branch = "MASTER" },
			refuse: `branch "MASTER" is not "master" (only case differs: to Zuul another branch)`},
		{name: "a job in other case", b: func(b *Build) { b.JobName = "Build-Debian" },
			refuse: `job "Build-Debian" is not "build-debian" (only case differs: to Zuul another job)`},
		{name: "a project in other case", b: func(b *Build) { b.Ref.Project = "Org/Images" },
			refuse: `project "Org/Images" is not "org/images" (only case differs: to Zuul another project; ` +
				`if it is the one meant, write project as Zuul spells it)`},
		{name: "a pipeline in other case", b: func(b *Build) { b.Pipeline = "Post" },
			refuse: `pipeline "Post" is not one of ["periodic" "post"] (only case differs: to Zuul another pipeline)`},
		{name: "the query in other case", q: func(q *Query) { q.Project, q.JobName = "ORG/IMAGES", "BUILD-DEBIAN" },
			refuse: `project "org/images" is not "ORG/IMAGES" (only case differs`},
		{name: "a wildcard in other case", q: func(q *Query) { q.JobName = "BUILD-*" },
			refuse: `job "build-debian" is not "BUILD-*" (only case differs: to Zuul another job)`},
		{name: "a wildcard keeps case", q: func(q *Query) { q.Project, q.JobName = "org/*", "build-*" },
			b: func(b *Build) { b.Ref.Project = "Org/Images" }, refuse: `project "Org/Images" is not "org/*" (only case differs`},
		{name: "another branch says nothing of case", b: func(b *Build) { b.Ref.Branch = "Stable" },
			refuse: `branch "Stable" is not "master"; `},
		{name: "the result is exact", b: func(b *Build) { b.Result = "success" }, refuse: `result "success" is not "SUCCESS"`},
		{name: "a long field is clipped", b: func(b *Build) { b.Ref.Project = strings.Repeat("é", 1<<20) },
			refuse: `project "` + strings.Repeat("é", 50) + `"... (2097152 bytes) is not "org/images"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, b := q, good
			q.Pipelines = append([]string(nil), q.Pipelines...)
			if tt.q != nil {
				tt.q(&q)
			}
			if tt.b != nil {
				tt.b(&b)
			}
			err := q.Check(b)
			if q.Matches(b) != (err == nil) {
				t.Errorf("Matches = %v while Check = %v", q.Matches(b), err)
			}
			switch {
			case tt.refuse == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.refuse != "" && err == nil:
				t.Fatalf("taken; want it refused for %s", tt.refuse)
			case tt.refuse != "" && !strings.Contains(err.Error()+"; ", tt.refuse):
				t.Fatalf("refused for %q; want %q", err, tt.refuse)
			}
		})
	}
}

// TestDecodeFinal: final is false only when Zuul says so; a Zuul older than
// the field, which sends none, or null, is taken at its word.
func TestDecodeFinal(t *testing.T) {
	for body, want := range map[string]bool{
		`[{"uuid": "u", "final": true}]`:  true,
		`[{"uuid": "u", "final": false}]`: false,
		`[{"uuid": "u", "final": null}]`:  true,
		`[{"uuid": "u"}]`:                 true,
	} {
		bs, err := decodeBuilds([]byte(body))
		if err != nil || len(bs) != 1 || bs[0].Final != want {
			t.Errorf("%s: %+v, %v; want final %v", body, bs, err, want)
		}
	}
}

// TestNameMatchesAsLike: a filter with wildcards matches as the regular
// expression of Zuul's LIKE would, with the case of names kept, without
// compiling one.
func TestNameMatchesAsLike(t *testing.T) {
	like := func(filter, v string) bool {
		parts := strings.Split(filter, "*")
		for i, p := range parts {
			parts[i] = regexp.QuoteMeta(p)
		}
		return regexp.MustCompile(`^(?s:` + strings.Join(parts, ".*") + `)$`).MatchString(v)
	}
	filters := []string{"*", "**", "a*", "*a", "a*b", "ab*ba", "*ab*", "a*b*a", "*-debian*", "K*", "*ſ", "σ*ς", "a**b", "*.*", "x\n*"}
	values := []string{"", "a", "ab", "aba", "abba", "ba", "AB", "bab", "build-debian-image", "-DEBIAN", "\u212a", "k", "ſ", "S",
		"s", "ΣΑΣ", "σας", "a.b", "a\nb", "x\nyz", "ab\xffba", "\xff"}
	for _, f := range filters {
		for _, v := range values {
			if got, want := nameMatches(f, v), like(f, v); got != want {
				t.Errorf("nameMatches(%q, %q) = %v, want %v", f, v, got, want)
			}
		}
	}
}
