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
// project, 1915-1940): a project the tenant knows, asked by its name or by
// its canonical name (zuul/model.py, Tenant.getProject, 9809-9835: the first
// path segment is taken for a canonical hostname when it is one), as
// Project.toDict shows it (model.py 1433-1438), with no configs; any other
// name is "Unknown project", a 404 (_getProjectOrRaise, 1745-1749). The
// tenant knows the projects of the builds added, as they are the projects of
// its config.
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
	if !known[name] {
		errorPage(w, http.StatusNotFound, "Unknown project")
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"name":            name,
		"connection_name": "gerrit",
		"canonical_name":  canonicalHostname + "/" + name,
		"configs":         []any{},
		"metadata":        map[string]any{},
	})
}
