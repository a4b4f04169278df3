package zuulapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"unicode"
)

// ErrUnknownProject: Zuul's tenant has no project of the name asked.
var ErrUnknownProject = errors.New("unknown Zuul project")

// ProjectName is the name Zuul stores a project's builds under and filters
// them by (its SQL reporter records change.project.name): the short name,
// org/images. zuul-web's project endpoint knows a project by that name or by
// its canonical name, review.example.com/org/images, with their case, and
// answers the short one either way (zuul/web/__init__.py, project;
// zuul/model.py, Project.toDict and Tenant.getProject). A name Zuul does not
// know is ErrUnknownProject. An answer that is not of the project asked (a
// wildcard, another project, a name that is not its canonical name's tail) is
// ErrUnexpected.
func (c *Client) ProjectName(ctx context.Context, project string) (string, error) {
	token, err := c.token()
	if err != nil {
		return "", err
	}
	endpoint, tenant, err := c.buildsURL(ctx, token)
	if err != nil {
		return "", fmt.Errorf("look up Zuul project %q: %w", project, err)
	}
	segments := strings.Split(project, "/")
	for i, s := range segments {
		segments[i] = url.PathEscape(s)
	}
	u := strings.TrimSuffix(endpoint, "builds") + "project/" + strings.Join(segments, "/")
	body, err := c.get(ctx, u, token, tenant)
	var zerr *Error
	if errors.As(err, &zerr) && zerr.StatusCode == http.StatusNotFound {
		return "", &Error{StatusCode: http.StatusNotFound, URL: u, Description: zerr.Description, kind: ErrUnknownProject,
			msg: fmt.Sprintf("Zuul tenant %s knows no project %q (%s); check project", tenant, project, zerr.Description)}
	}
	if err != nil {
		return "", fmt.Errorf("look up Zuul project %q: %w", project, err)
	}
	var doc struct {
		Name          string `json:"name"`
		CanonicalName string `json:"canonical_name"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return "", &Error{StatusCode: http.StatusOK, URL: u, kind: ErrUnexpected,
			msg: fmt.Sprintf("read Zuul project %q from %s: not a project (%v)", project, u, err)}
	}
	if why := notProject(project, doc.Name, doc.CanonicalName); why != "" {
		return "", &Error{StatusCode: http.StatusOK, URL: u, kind: ErrUnexpected,
			msg: fmt.Sprintf("Zuul's project API at %s answered name %s, canonical name %s for project %q: %s; "+
				"nothing is polled by it: check api-url and project",
				u, quoteClipped(doc.Name), quoteClipped(doc.CanonicalName), project, why)}
	}
	return doc.Name, nil
}

// notProject says why name and canonical, as Zuul's project API answered
// them, are not those of project, the name asked; "" when they are. The name
// becomes the filter of every later query, so it must be what zuul-web
// answers for that project (Project.toDict: canonical_name is the canonical
// hostname, "/" and the name): no wildcard, which would match any project;
// the tail of the canonical name; and either the name asked or, when a
// canonical name was asked, its tail.
func notProject(project, name, canonical string) string {
	switch {
	case name == "" || len(name) > maxNameLen || strings.ContainsFunc(name, unicode.IsControl):
		return "not a project's name"
	case strings.Contains(name, "*"):
		return "a wildcard, which would make the polls take builds of any project it matches"
	}
	host, tail, ok := strings.Cut(canonical, "/")
	switch {
	case !ok || host == "" || tail != name:
		return "the name is not the canonical name's tail"
	case canonical != project && name != project:
		return "another project than the one asked"
	}
	return ""
}

// maxNameLen bounds a project name from Zuul's answer: it becomes the filter
// of every later query.
const maxNameLen = 512
