package zuulapi

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// Check returns why b is not an answer to q, or nil when it is. Zuul filters
// builds on its side; Check is there so that what it answers is not simply
// believed. It selects as Zuul's own filters do (zuul/driver/sql/sqlconnection.py,
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
// Names compare regardless of case: on MySQL and MariaDB, where Zuul's
// database usually lives, both = and LIKE ignore it under the default
// collations, so org/images finds Org/Images there. The result is exact: Zuul
// writes its results in capitals. And b's uuid must be one Zuul makes: 32 hex
// digits, nothing a terminal or a file name would take for more.
func (q Query) Check(b Build) error {
	var why []string
	if !zuulUUID(b.UUID) {
		why = append(why, fmt.Sprintf("uuid %q is not 32 hex digits", b.UUID))
	}
	if q.Project != "" && !nameMatches(q.Project, b.Ref.Project) {
		why = append(why, fmt.Sprintf("project %q is not %q", b.Ref.Project, q.Project))
	}
	if q.JobName != "" && !nameMatches(q.JobName, b.JobName) {
		why = append(why, fmt.Sprintf("job %q is not %q", b.JobName, q.JobName))
	}
	if len(q.Pipelines) > 0 && !slices.ContainsFunc(q.Pipelines, func(p string) bool { return nameMatches(p, b.Pipeline) }) {
		why = append(why, fmt.Sprintf("pipeline %q is not one of %q", b.Pipeline, q.Pipelines))
	}
	if q.Branch != "" && !nameMatches(q.Branch, b.Ref.Branch) {
		why = append(why, fmt.Sprintf("branch %q is not %q", b.Ref.Branch, q.Branch))
	}
	switch {
	case q.Result != "" && b.Result != q.Result:
		why = append(why, fmt.Sprintf("result %q is not %q", b.Result, q.Result))
	case q.Complete && b.Result == "":
		why = append(why, "it has not finished")
	}
	if q.Final && !b.Final {
		why = append(why, "Zuul reports it not final (it was retried)")
	}
	if len(why) == 0 {
		return nil
	}
	return errors.New(strings.Join(why, "; "))
}

// zuulUUID tells whether s is a uuid as Zuul writes them: uuid4().hex.
func zuulUUID(s string) bool {
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

// nameMatches matches a value as Zuul's builds filters do on MySQL and
// MariaDB: equal regardless of case, or, when the filter holds a "*", a LIKE
// where "*" is any run of characters, anywhere in the filter, and nothing else
// is special (Zuul escapes "%" and "_").
func nameMatches(filter, v string) bool {
	if !strings.Contains(filter, "*") {
		return strings.EqualFold(filter, v)
	}
	parts := strings.Split(filter, "*")
	for i, p := range parts {
		parts[i] = regexp.QuoteMeta(p)
	}
	return regexp.MustCompile(`^(?is:` + strings.Join(parts, ".*") + `)$`).MatchString(v)
}
