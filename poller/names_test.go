package poller

import (
	"strings"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// TestPollTakesNamesWithTheirCase: Zuul's names are case-sensitive, yet its
// database on MySQL answers a build of branch MASTER, of job Build-Debian or
// of project Org/Images to a poll of master, build-debian and org/images.
// Those are another branch, which whoever may push can make, another job and
// another project: none is fetched, and the log says that only case differs.
// The build asked for, behind them, is fetched.
func TestPollTakesNamesWithTheirCase(t *testing.T) {
	f := newFixture(t, "qcow2")
	f.cfg.ZuulImages[0].Branch = "master"
	good := f.publish(zuultest.ArtifactSpec{Name: "qcow2", Data: f.image("qcow2", "good"), Metadata: meta("qcow2")})
	var others []zuultest.Build
	for _, spec := range []zuultest.BuildSpec{
		{Job: "build-debian", Branch: "MASTER"},
		{Job: "Build-Debian"},
		{Job: "build-debian", Project: "Org/Images"},
	} {
		spec.Artifacts = []zuultest.ArtifactSpec{{Name: "qcow2", Data: f.image("qcow2", spec.Job+spec.Branch+spec.Project), Metadata: meta("qcow2")}}
		zb, err := f.zuul.AddBuild(spec)
		if err != nil {
			t.Fatal(err)
		}
		others = append(others, zb)
	}
	f.pollIngests("the build asked for, behind builds of names in other case", good)
	logs := f.logs.String()
	for i, zb := range others {
		if n := f.zuul.BytesServed(zb.Artifacts[0].Path); n != 0 {
			t.Errorf("build %d, of a name in other case: %d bytes fetched", i, n)
		}
		if !strings.Contains(logs, zb.UUID) {
			t.Errorf("build %d, of a name in other case, was not answered and skipped:\n%s", i, logs)
		}
	}
	for _, says := range []string{
		`branch \"MASTER\" is not \"master\" (only case differs: to Zuul another branch)`,
		`job \"Build-Debian\" is not \"build-debian\" (only case differs: to Zuul another job)`,
		`project \"Org/Images\" is not \"org/images\" (only case differs: to Zuul another project; if it is the one meant, write project as Zuul spells it)`,
	} {
		if !strings.Contains(logs, says) {
			t.Errorf("the log does not say %s:\n%s", says, logs)
		}
	}
}
