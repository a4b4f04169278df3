package zuulmqtt

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/zuulapi"
)

// report is what the listener reads of a report of Zuul's MQTT reporter: the
// item's tenant, pipeline and ref, and its builds. Everything else (log and
// artifact URLs, times, returned data) is never read: the poll a report leads
// to asks the builds API for all of it.
type report struct {
	Action   string `json:"action"`
	Tenant   string `json:"tenant"`
	Pipeline string `json:"pipeline"`
	// Project, Branch and Change are the item's (its first change's, when it
	// holds several); Change is empty for a branch or a tag.
	Project  string             `json:"project"`
	Branch   string             `json:"branch"`
	Change   zuulapi.FlexString `json:"change"`
	Buildset struct {
		// Result is the item's result as Zuul reports it (SUCCESS, FAILURE,
		// ...), never rewritten by a message.
		Result string `json:"result"`
		// Builds is a list of reportBuild, read by builds: no further
		// than maxReportBuilds.
		Builds json.RawMessage `json:"builds"`
	} `json:"buildset"`
}

// reportBuild is one of the buildset's builds; a job that did not run has no
// uuid and no result.
type reportBuild struct {
	JobName string `json:"job_name"`
	UUID    string `json:"uuid"`
	// Result is the build's result, or its job's success-message or
	// failure-message in its place (see succeeded).
	Result string `json:"result"`
	// Change is, from recent Zuul versions on, the change the build ran on:
	// an object whose project, branch and change win over the item's. Older
	// versions do not send it.
	Change json.RawMessage `json:"change"`
}

// reportChange is a build's change object.
type reportChange struct {
	Project string             `json:"project"`
	Branch  string             `json:"branch"`
	Change  zuulapi.FlexString `json:"change"`
}

// errMalformed is what parseReport wraps.
var errMalformed = errors.New("not a report of Zuul's MQTT reporter")

// parseReport decodes a message. A message that is not a JSON object, whose
// fields have the wrong types, or that lacks an action, tenant or pipeline is
// malformed.
func parseReport(payload []byte) (*report, error) {
	var r report
	if err := json.Unmarshal(payload, &r); err != nil {
		return nil, fmt.Errorf("%w: %w", errMalformed, err)
	}
	switch {
	case r.Action == "":
		return nil, fmt.Errorf("%w: no action", errMalformed)
	case r.Tenant == "":
		return nil, fmt.Errorf("%w: no tenant", errMalformed)
	case r.Pipeline == "":
		return nil, fmt.Errorf("%w: no pipeline", errMalformed)
	}
	if raw := bytes.TrimSpace(r.Buildset.Builds); len(raw) > 0 && raw[0] != '[' && !bytes.Equal(raw, []byte("null")) {
		return nil, fmt.Errorf("%w: buildset builds is not a list", errMalformed)
	}
	return &r, nil
}

// finished tells whether the report is of an item whose builds are done:
// Zuul reports "enqueue" and "start" before they run, and everything else
// (success, failure, dequeue, ...) after. A build of an unfinished item that
// claims a result is not believed.
func (r *report) finished() bool {
	return r.Action != "enqueue" && r.Action != "start"
}

// zuulResults are the results Zuul gives a build that did not succeed.
var zuulResults = map[string]bool{
	"FAILURE": true, "ERROR": true, "RETRY_LIMIT": true, "POST_FAILURE": true, "SKIPPED": true,
	"NODE_FAILURE": true, "TIMED_OUT": true, "ABORTED": true, "CANCELED": true, "DEQUEUED": true,
	"MERGE_CONFLICT": true, "MERGE_FAILURE": true, "CONFIG_ERROR": true, "DISK_FULL": true,
	"RETRY": true, "LOST": true, "EXCEPTION": true, "NO_JOBS": true,
}

// itemSucceeded tells whether Zuul reports the item as a success: the report
// of a reporter listed under the pipeline's success, or, whatever list it is
// under (a disabled pipeline's), one whose buildset result is SUCCESS.
func (r *report) itemSucceeded() bool {
	return r.Action == "success" || r.Buildset.Result == "SUCCESS"
}

// succeeded tells whether a build reported with result may have succeeded.
// The reporter passes a build's result through formatJobResult
// (zuul/model.py): the job's success-message replaces SUCCESS, its
// failure-message any other result, so the text alone may not tell. SUCCESS is
// a success in any report. Another text is taken for a success-message only in
// the report of an item that succeeded, unless it is one of Zuul's own
// results: a failure-message there can only be a non-voting job's, and the
// poll that follows finds that build is no SUCCESS. In other reports it is
// taken for a failure-message; a success-message there waits for the next poll.
func (r *report) succeeded(result string) bool {
	switch {
	case result == "SUCCESS":
		return true
	case result == "" || zuulResults[result]:
		return false
	}
	return r.itemSucceeded()
}

// What one report may hold that is read: a report is a hint, and a forged
// one must cost no more than a real one. Zuul's buildsets hold tens of builds,
// a few hundred in the largest; its names are far shorter than a KiB.
const (
	maxReportBuilds = 1000
	maxNameLen      = 1 << 10
)

// builds returns the report's builds that may be successful builds a poll
// fetches, as the builds API would show them: with their job, uuid, result,
// pipeline and ref, where a result that may be a success-message is given as
// SUCCESS (see succeeded). Left out before any zuul-image is looked at: a
// build that did not run (it has no uuid) or did not succeed, one whose uuid
// is not Zuul's 32 hex digits or was given already, one with a name longer
// than maxNameLen, and every build after the first maxReportBuilds.
func (r *report) builds() ([]zuulapi.Build, error) {
	if len(r.Tenant) > maxNameLen || len(r.Pipeline) > maxNameLen {
		return nil, nil
	}
	var out []zuulapi.Build
	seen := map[string]bool{}
	dec := json.NewDecoder(bytes.NewReader(r.Buildset.Builds))
	if _, err := dec.Token(); err != nil { // the list's "[", or null
		return nil, nil
	}
	for i := 0; i < maxReportBuilds && dec.More(); i++ {
		var b reportBuild
		if err := dec.Decode(&b); err != nil {
			return nil, fmt.Errorf("%w: build %d: %w", errMalformed, i, err)
		}
		if !zuulapi.ValidUUID(b.UUID) || seen[b.UUID] || !r.succeeded(b.Result) || len(b.JobName) > maxNameLen {
			continue
		}
		ref := zuulapi.Ref{Project: r.Project, Branch: r.Branch, Change: string(r.Change)}
		if raw := bytes.TrimSpace(b.Change); len(raw) > 0 && raw[0] == '{' {
			var c reportChange
			if err := json.Unmarshal(raw, &c); err != nil {
				return nil, fmt.Errorf("%w: build %d: change: %w", errMalformed, i, err)
			}
			ref = zuulapi.Ref{Project: c.Project, Branch: c.Branch, Change: string(c.Change)}
		}
		if len(ref.Project) > maxNameLen || len(ref.Branch) > maxNameLen || len(ref.Change) > maxNameLen {
			continue
		}
		seen[b.UUID] = true
		out = append(out, zuulapi.Build{
			UUID:     b.UUID,
			JobName:  b.JobName,
			Result:   "SUCCESS",
			Pipeline: r.Pipeline,
			Ref:      ref,
			// Zuul reports the builds that stand in the buildset: a retried
			// one is in retry_builds, which is not read.
			Final: true,
		})
	}
	return out, nil
}

// couldBe tells whether zb, a build of a report from tenant, could be one a
// poll of zi fetches: it asks the builds API the same question (project, job,
// branch, pipelines, a successful result) and passes over builds of unmerged
// changes by the same rule (zuulapi.Build.Unmerged). A zuul-image with no
// tenant (a white-label api-url) takes reports from any tenant: the poll asks
// its own.
func couldBe(zi *config.ZuulImage, tenant string, zb zuulapi.Build) bool {
	if zi.Tenant != "" && zi.Tenant != tenant {
		return false
	}
	// Matches, not Check: a report's builds need a yes or a no, not reasons.
	if !zuulapi.Successful(zi.Project, zi.Branch, zi.JobName, zi.Pipelines).Matches(zb) {
		return false
	}
	return zi.AllowUnmergedChanges || !zb.Unmerged()
}
