package zuultest

import (
	"encoding/json"
	"fmt"
	"time"
)

// MQTTReport is the message Zuul's MQTT reporter publishes when a pipeline
// reports the buildset of the build uuid (the only build in it), in Zuul's
// schema: the item's tenant, pipeline, project, branch, change and ref, and
// the buildset's builds with their job, uuid, result, times, log URL,
// artifacts and change. The action is "success" for a successful build,
// "failure" otherwise. topic is what Zuul's documented topic template,
// zuul/{tenant}/{pipeline}/{project}, makes of it. It fails for a build the
// server does not have.
func (s *Server) MQTTReport(uuid string) (topic string, payload []byte, err error) {
	s.mu.Lock()
	var b *build
	for _, c := range s.builds {
		if c.spec.UUID == uuid {
			b = c
		}
	}
	tenant := s.opts.Tenant
	s.mu.Unlock()
	if b == nil {
		return "", nil, fmt.Errorf("zuultest: no build %s to report", uuid)
	}
	sp := b.spec
	// A branch has no change number: Zuul sends "" for it.
	change := map[string]any{"project": sp.Project, "branch": sp.Branch, "change_url": "https://git.example.com/" + sp.Project,
		"change": "", "patchset": "", "commit_id": sp.Newrev, "owner": nil, "ref": "refs/heads/" + sp.Branch}
	if sp.Change > 0 {
		change["change"] = sp.Change
		change["patchset"] = sp.Patchset
		change["change_url"] = fmt.Sprintf("https://review.example.com/%d", sp.Change)
		change["ref"] = fmt.Sprintf("refs/changes/%02d/%d/%s", sp.Change%100, sp.Change, sp.Patchset)
	}
	unix := func(t time.Time) any {
		if t.IsZero() {
			return nil
		}
		return float64(t.UnixNano()) / 1e9
	}
	arts := b.artifactsJSON()
	action, result := "success", sp.Result
	if result != "SUCCESS" {
		action = "failure"
	}
	msg := map[string]any{
		"timestamp":     float64(time.Now().UnixNano()) / 1e9,
		"action":        action,
		"tenant":        tenant,
		"zuul_ref":      "Z" + b.buildset[:8],
		"pipeline":      sp.Pipeline,
		"changes":       []any{change},
		"project":       change["project"],
		"branch":        change["branch"],
		"change_url":    change["change_url"],
		"change":        change["change"],
		"patchset":      change["patchset"],
		"commit_id":     change["commit_id"],
		"owner":         nil,
		"ref":           change["ref"],
		"message":       "Build " + map[bool]string{true: "succeeded", false: "failed"}[action == "success"] + ".",
		"trigger_time":  unix(sp.StartTime),
		"enqueue_time":  unix(sp.StartTime),
		"uuid":          b.eventID,
		"zuul_event_id": b.eventID,
		"buildset": map[string]any{
			"uuid":   b.buildset,
			"result": result,
			"builds": []any{map[string]any{
				"job_name":     sp.Job,
				"job_uuid":     b.eventID[:16],
				"voting":       true,
				"uuid":         sp.UUID,
				"start_time":   unix(sp.StartTime),
				"end_time":     unix(sp.EndTime),
				"execute_time": unix(sp.StartTime),
				"log_url":      b.logURL,
				"web_url":      s.url + "/t/" + tenant + "/build/" + sp.UUID,
				"result":       result,
				"dependencies": []any{},
				"artifacts":    arts,
				"change": map[string]any{"project": change["project"], "branch": change["branch"],
					"change_url": change["change_url"], "change": change["change"], "patchset": change["patchset"],
					"ref": change["ref"]},
			}},
			"retry_builds": []any{},
		},
	}
	payload, err = json.Marshal(msg)
	if err != nil {
		return "", nil, fmt.Errorf("zuultest: encode the report of %s: %w", uuid, err)
	}
	return "zuul/" + tenant + "/" + sp.Pipeline + "/" + sp.Project, payload, nil
}
