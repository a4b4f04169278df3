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
// believed. It selects as Zuul's own filters do:
//
//   - project, job and branch equal q's, where a "*" in q's value stands for
//     any run of characters;
//   - the pipeline is one of q's, matched the same way (any, when q names none);
//   - the result is q's; a complete query's build has one;
//   - a final query's build is not reported non-final (a build that does not
//     say, from a Zuul older than the field, is taken as final).
//
// Zuul reports a project by its name (org/images); a query that names it by its
// canonical name (review.example.com/org/images) matches it too, as does the
// other way round. And b's uuid must be one Zuul makes: 32 hex digits, nothing
// a terminal or a file name would take for more.
func (q Query) Check(b Build) error {
	var why []string
	if !zuulUUID(b.UUID) {
		why = append(why, fmt.Sprintf("uuid %q is not 32 hex digits", b.UUID))
	}
	if q.Project != "" && !projectMatches(q.Project, b.Ref.Project) {
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

// nameMatches matches a value as Zuul's builds filters do: equal, or, when the
// filter holds a "*", a SQL LIKE where "*" is any run of characters and nothing
// else is special.
func nameMatches(filter, v string) bool {
	if !strings.Contains(filter, "*") {
		return filter == v
	}
	parts := strings.Split(filter, "*")
	for i, p := range parts {
		parts[i] = regexp.QuoteMeta(p)
	}
	return regexp.MustCompile(`^(?s:` + strings.Join(parts, ".*") + `)$`).MatchString(v)
}

// projectMatches matches a project filter against the project of a build: by
// name, or with one of them a canonical name, <host>/<name>, and the other
// its name. The host must hold a dot, so that org/images is never taken for
// the canonical name of a project called images.
func projectMatches(filter, project string) bool {
	if nameMatches(filter, project) {
		return true
	}
	if host, name, ok := strings.Cut(filter, "/"); ok && hostName(host) && nameMatches(name, project) {
		return true
	}
	host, name, ok := strings.Cut(project, "/")
	return ok && hostName(host) && nameMatches(filter, name)
}

func hostName(s string) bool {
	return strings.Contains(s, ".") && !strings.Contains(s, "*")
}
