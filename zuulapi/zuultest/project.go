package zuultest

import (
	"net/http"
	"strings"
)

// canonicalHostname is the stand-in Gerrit's canonical hostname: a project's
// canonical name is it, "/", and the project's name.
const canonicalHostname = "review.example.com"

func (s *Server) handleTenantProject(w http.ResponseWriter, r *http.Request) {
	s.serveProject(w, r, r.PathValue("tenant"), false)
}

func (s *Server) handleRootProject(w http.ResponseWriter, r *http.Request) {
	s.serveProject(w, r, "", true)
}

// serveProject answers zuul-web's project endpoint (zuul/web/__init__.py,
// project, 1915-1940, routed at 2844-2846): a project the tenant knows, asked
// by its name or by its canonical name, with their case (zuul/model.py,
// Tenant.getProject, 9809-9835: the first path segment is taken for a
// canonical hostname when it is one, and each is a key of a dict), as
// Project.toDict shows it (model.py 1433-1438: canonical_name is the
// canonical hostname, "/" and the name), with no configs and the metadata of
// a project a Gerrit project stanza names (ProjectMetadata.toDict, 8601-8607,
// its merge mode by name through get_merge_mode_name, 135-139; the Gerrit
// driver's default merge mode, zuul/driver/gerrit/gerritsource.py 211-215);
// any other name is "Unknown project", a 404 (_getProjectOrRaise,
// 1745-1749). The tenant knows the projects of the builds added, as they are
// the projects of its config. With ProjectAnswer set, a hostile Zuul answers
// any name asked, its fields in place of Zuul's.
func (s *Server) serveProject(w http.ResponseWriter, r *http.Request, tenant string, root bool) {
	s.mu.Lock()
	opts := s.opts
	known := map[string]bool{}
	for _, b := range s.builds {
		known[b.spec.Project] = true
	}
	s.mu.Unlock()
	if !s.tenantAnswers(w, r, tenant, root, opts) {
		return
	}
	name := r.PathValue("project")
	if host, rest, ok := strings.Cut(name, "/"); ok && host == canonicalHostname {
		name = rest
	}
	if !known[name] && opts.ProjectAnswer == nil {
		errorPage(w, http.StatusNotFound, "Unknown project")
		return
	}
	answer := map[string]any{
		"name":            name,
		"connection_name": "gerrit",
		"canonical_name":  canonicalHostname + "/" + name,
		"configs":         []any{},
		"metadata": map[string]any{
			"merge_mode":     "merge-resolve",
			"default_branch": "master",
			"is_template":    false,
			"queue_name":     nil,
		},
	}
	for k, v := range opts.ProjectAnswer {
		answer[k] = v
	}
	writeJSON(w, http.StatusOK, answer)
}
