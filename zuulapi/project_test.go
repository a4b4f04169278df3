package zuulapi_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/zuulapi"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// TestProjectName: Zuul's project endpoint gives the short name its builds
// are stored and filtered under, for a project asked by that name or by its
// canonical name, on a tenant's path or a white-label root, with a token; a
// name the tenant does not know is ErrUnknownProject.
func TestProjectName(t *testing.T) {
	for _, whiteLabel := range []bool{false, true} {
		srv := zuultest.NewServer(zuultest.ServerOptions{Tenant: "example", WhiteLabel: whiteLabel, Token: "tok"})
		t.Cleanup(srv.Close)
		if _, err := srv.AddBuild(zuultest.BuildSpec{Job: "build-debian", Project: "org/images"}); err != nil {
			t.Fatal(err)
		}
		tenant := "example"
		if whiteLabel {
			tenant = ""
		}
		c := newClient(t, zuulapi.Options{APIURL: srv.URL(), Tenant: tenant, TokenFile: writeToken(t, t.TempDir(), "tok\n")})
		ctx := context.Background()
		for _, asked := range []string{"org/images", "review.example.com/org/images"} {
			got, err := c.ProjectName(ctx, asked)
			if err != nil || got != "org/images" {
				t.Errorf("white-label %v: ProjectName(%q) = %q, %v; want org/images", whiteLabel, asked, got, err)
			}
		}
		for _, unknown := range []string{"org/other", "git.example.org/org/images"} {
			if got, err := c.ProjectName(ctx, unknown); !errors.Is(err, zuulapi.ErrUnknownProject) {
				t.Errorf("white-label %v: ProjectName(%q) = %q, %v; want ErrUnknownProject", whiteLabel, unknown, got, err)
			}
		}
	}
}

// TestProjectNameDotted: a project whose first part holds a dot but is no
// canonical hostname is Zuul's name as it is; its canonical name is the
// hostname before it.
func TestProjectNameDotted(t *testing.T) {
	srv := zuultest.NewServer(zuultest.ServerOptions{Tenant: "example"})
	t.Cleanup(srv.Close)
	if _, err := srv.AddBuild(zuultest.BuildSpec{Job: "build-debian", Project: "images.d/debian"}); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, zuulapi.Options{APIURL: srv.URL(), Tenant: "example"})
	for _, asked := range []string{"images.d/debian", "review.example.com/images.d/debian"} {
		if got, err := c.ProjectName(context.Background(), asked); err != nil || got != "images.d/debian" {
			t.Errorf("ProjectName(%q) = %q, %v; want images.d/debian", asked, got, err)
		}
	}
}

// TestProjectNameAnswerChecked: the name Zuul's project API answers becomes
// the filter of every poll, so an answer that is not of the project asked is
// refused: a wildcard, another project, a canonical name of another host, a
// name that is not the canonical name's tail. Zuul knows names with their
// case: another case is a project it does not know.
func TestProjectNameAnswerChecked(t *testing.T) {
	const asked = "review.example.com/org/images"
	for what, answer := range map[string]map[string]string{
		"a wildcard":                    {"name": "*", "canonical_name": "review.example.com/*"},
		"a wildcard in a name":          {"name": "org/*"},
		"a wildcard alone":              {"name": "*"},
		"another project":               {"name": "evil/other", "canonical_name": "review.example.com/evil/other"},
		"another host":                  {"canonical_name": "git.evil.example/org/images"},
		"a name not the tail":           {"name": "images"},
		"a canonical name with no host": {"canonical_name": "/org/images"},
		"no canonical name":             {"canonical_name": ""},
		"another case":                  {"name": "Org/Images", "canonical_name": "review.example.com/Org/Images"},
		"no name":                       {"name": ""},
		"a control character":           {"name": "org/images\n", "canonical_name": "review.example.com/org/images\n"},
	} {
		srv := zuultest.NewServer(zuultest.ServerOptions{Tenant: "example", ProjectAnswer: answer})
		t.Cleanup(srv.Close)
		c := newClient(t, zuulapi.Options{APIURL: srv.URL(), Tenant: "example"})
		got, err := c.ProjectName(context.Background(), asked)
		if !errors.Is(err, zuulapi.ErrUnexpected) || !strings.Contains(err.Error(), "check api-url and project") {
			t.Errorf("%s: ProjectName(%q) = %q, %v; want it refused", what, asked, got, err)
		}
	}

	srv := zuultest.NewServer(zuultest.ServerOptions{Tenant: "example"})
	t.Cleanup(srv.Close)
	if _, err := srv.AddBuild(zuultest.BuildSpec{Job: "build-debian", Project: "Org/Images"}); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, zuulapi.Options{APIURL: srv.URL(), Tenant: "example"})
	if got, err := c.ProjectName(context.Background(), asked); !errors.Is(err, zuulapi.ErrUnknownProject) {
		t.Errorf("ProjectName(%q) of a Zuul that knows Org/Images = %q, %v; want ErrUnknownProject", asked, got, err)
	}
}
