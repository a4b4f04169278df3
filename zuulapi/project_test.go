package zuulapi_test

import (
	"context"
	"errors"
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
