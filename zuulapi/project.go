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
// its canonical name, review.example.com/org/images, and answers the short
// one either way (zuul/web/__init__.py, project; zuul/model.py,
// Project.toDict and Tenant.getProject). A name Zuul does not know is
// ErrUnknownProject.
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
	if err := json.Unmarshal(body, &doc); err != nil || doc.Name == "" || len(doc.Name) > maxNameLen ||
		strings.ContainsFunc(doc.Name, unicode.IsControl) {
		return "", &Error{StatusCode: http.StatusOK, URL: u, kind: ErrUnexpected,
			msg: fmt.Sprintf("read Zuul project %q from %s: not a project's name (%v)", project, u, err)}
	}
	return doc.Name, nil
}

// maxNameLen bounds a project name from Zuul's answer: it becomes the filter
// of every later query.
const maxNameLen = 512
