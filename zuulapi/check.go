package zuulapi

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Check returns why b is not an answer to q, or nil when it is. Zuul filters
// builds on its side; Check is there so that what it answers is not simply
// believed. It selects as Zuul's own filters do where the database keeps the
// case of names, as PostgreSQL does (zuul/driver/sql/sqlconnection.py,
// getBuilds and _getFuzzyFilterOp):
//
//   - project, job and branch equal q's, where a "*" anywhere in q's value
//     stands for any run of characters (Zuul's LIKE, with "*" made "%" and
//     nothing else special);
//   - the pipeline is one of q's, matched the same way (any, when q names none);
//   - the result is q's; a complete query's build has one;
//   - a final query's build is not reported non-final (a build that does not
//     say, from a Zuul older than the field, is taken as final).
//
// Names compare with their case, as Zuul stores them: git refs, and Zuul's
// projects, jobs and pipelines, are case-sensitive, so MASTER is another
// branch and Build-Debian another job, which whoever may push a branch or
// change a job can make. Zuul's database usually lives on MySQL or MariaDB,
// whose default collations ignore case in = and LIKE alike: such builds are
// in its answers, and are refused here, the reason saying that only case
// differs. The result is exact too: Zuul writes its results in capitals. And
// b's uuid must be one Zuul makes: 32 hex digits, nothing a terminal or a
// file name would take for more.
//
// The reason quotes b's fields clipped to a hundred bytes or so each, so that
// it stays short whatever Zuul answered. Matches tells the same without the
// reason, at no cost.
func (q Query) Check(b Build) error {
	var why []string
	q.eachMismatch(b, func(m mismatch) bool {
		why = append(why, q.reason(m, b))
		return true
	})
	if len(why) == 0 {
		return nil
	}
	return errors.New(strings.Join(why, "; "))
}

// Matches tells whether b is an answer to q, as Check does, without saying
// why not: it allocates nothing and compiles nothing, so that a flood of
// reported builds costs comparisons only.
func (q Query) Matches(b Build) bool {
	ok := true
	q.eachMismatch(b, func(mismatch) bool {
		ok = false
		return false
	})
	return ok
}

// mismatch is one way a build is not an answer to a query.
type mismatch int

const (
	badUUID mismatch = iota
	otherProject
	otherJob
	otherPipeline
	otherBranch
	otherResult
	unfinished
	notFinal
)

// eachMismatch calls f with each way b is not an answer to q, in the order
// Check gives them, until f returns false.
func (q Query) eachMismatch(b Build, f func(mismatch) bool) {
	if !ValidUUID(b.UUID) && !f(badUUID) {
		return
	}
	if q.Project != "" && !nameMatches(q.Project, b.Ref.Project) && !f(otherProject) {
		return
	}
	if q.JobName != "" && !nameMatches(q.JobName, b.JobName) && !f(otherJob) {
		return
	}
	if len(q.Pipelines) > 0 && !q.pipelineMatches(b.Pipeline) && !f(otherPipeline) {
		return
	}
	if q.Branch != "" && !nameMatches(q.Branch, b.Ref.Branch) && !f(otherBranch) {
		return
	}
	switch {
	case q.Result != "" && b.Result != q.Result:
		if !f(otherResult) {
			return
		}
	case q.Complete && b.Result == "":
		if !f(unfinished) {
			return
		}
	}
	if q.Final && !b.Final {
		f(notFinal)
	}
}

func (q Query) pipelineMatches(pipeline string) bool {
	for _, p := range q.Pipelines {
		if nameMatches(p, pipeline) {
			return true
		}
	}
	return false
}

// reason says what m is of b, for Check.
func (q Query) reason(m mismatch, b Build) string {
	switch m {
	case badUUID:
		return fmt.Sprintf("uuid %s is not 32 hex digits", quoteClipped(b.UUID))
	case otherProject:
		why := fmt.Sprintf("project %s is not %q", quoteClipped(b.Ref.Project), q.Project)
		if onlyCaseDiffers(q.Project, b.Ref.Project) {
			why += " (only case differs: to Zuul another project; if it is the one meant, write project as Zuul spells it)"
		}
		return why
	case otherJob:
		return fmt.Sprintf("job %s is not %q", quoteClipped(b.JobName), q.JobName) + caseNote(q.JobName, b.JobName, "job")
	case otherPipeline:
		why := fmt.Sprintf("pipeline %s is not one of %q", quoteClipped(b.Pipeline), q.Pipelines)
		for _, p := range q.Pipelines {
			if onlyCaseDiffers(p, b.Pipeline) {
				return why + caseNote(p, b.Pipeline, "pipeline")
			}
		}
		return why
	case otherBranch:
		return fmt.Sprintf("branch %s is not %q", quoteClipped(b.Ref.Branch), q.Branch) + caseNote(q.Branch, b.Ref.Branch, "branch")
	case otherResult:
		return fmt.Sprintf("result %s is not %q", quoteClipped(b.Result), q.Result)
	case unfinished:
		return "it has not finished"
	default:
		return "Zuul reports it not final (it was retried)"
	}
}

// caseNote says, when v is refused by filter only for its case, that it is
// another thing of its kind all the same.
func caseNote(filter, v, kind string) string {
	if !onlyCaseDiffers(filter, v) {
		return ""
	}
	return " (only case differs: to Zuul another " + kind + ")"
}

// onlyCaseDiffers tells whether v, which filter does not match, would match
// it regardless of case, as MySQL's collations match.
func onlyCaseDiffers(filter, v string) bool {
	return nameMatches(strings.ToLower(filter), strings.ToLower(v))
}

// reasonClip is how much of a field a reason quotes.
const reasonClip = 100

// quoteClipped quotes s as %q does, its first reasonClip bytes or so only,
// saying how long it was when it was longer.
func quoteClipped(s string) string {
	if len(s) <= reasonClip {
		return fmt.Sprintf("%q", s)
	}
	cut := reasonClip
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%q... (%d bytes)", s[:cut], len(s))
}

// ValidUUID tells whether s is a uuid as Zuul writes them: uuid4().hex.
func ValidUUID(s string) bool {
	if len(s) != 32 {
		return false
	}
	for i := range len(s) {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// nameMatches matches a value as Zuul's builds filters select it, with the
// case Zuul stores: equal, or, when the filter holds a "*", a LIKE where "*"
// is any run of characters, anywhere in the filter, and nothing else is
// special (Zuul escapes "%" and "_").
//
// With wildcards, the text before the first "*" must begin v and the text
// after the last end it; each piece between must follow in order, and is
// taken where it first appears, which leaves the most room for the next.
func nameMatches(filter, v string) bool {
	head, rest, wild := strings.Cut(filter, "*")
	if !wild {
		return filter == v
	}
	if !strings.HasPrefix(v, head) {
		return false
	}
	v = v[len(head):]
	middle, tail := "", rest
	if i := strings.LastIndexByte(rest, '*'); i >= 0 {
		middle, tail = rest[:i], rest[i+1:]
	}
	if !strings.HasSuffix(v, tail) {
		return false
	}
	v = v[:len(v)-len(tail)]
	for middle != "" {
		var piece string
		piece, middle, _ = strings.Cut(middle, "*")
		i := strings.Index(v, piece)
		if i < 0 {
			return false
		}
		v = v[i+len(piece):]
	}
	return true
}
