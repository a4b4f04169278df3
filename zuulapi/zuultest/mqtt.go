package zuultest

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// MQTTReport is the message Zuul's MQTT reporter publishes when a pipeline
// reports the buildset of the build uuid (the only build in it), shaped as
// MQTTReporter.report in zuul/driver/mqtt/mqttreporter.py builds it:
//
//   - action is the pipeline's reporter list the reporter is under: "success"
//     for a successful build, "failure" otherwise, and "start" for a build
//     still running (whose job has no build yet in the report);
//   - zuul_ref is "Z" and the buildset's uuid (BuildSet.ref in zuul/model.py),
//     uuid the queue item's, job_uuid the frozen job's: each 32 hex digits;
//   - the item's and each build's change: a branch's number, patchset, commit
//     id and owner are "" (getattr defaults: a Branch has none), a Gerrit
//     change's number and patchset are strings, as the Gerrit driver keeps
//     them;
//   - a build's result is its job's SuccessMessage or FailureMessage when it
//     has one (formatJobResult in zuul/model.py), times are float seconds of
//     the epoch, artifacts are the API's (see artifactsJSON);
//   - message is the pipeline's success-message or failure-message, at
//     Zuul's defaults (zuul/configloader.py).
//
// topic is what the topic template zuul/{tenant}/{pipeline}/{project} makes of
// it. It fails for a build the server does not have.
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
	change := map[string]any{"project": sp.Project, "branch": sp.Branch, "change_url": gitwebURL(sp.Project, sp.Newrev),
		"change": "", "patchset": "", "commit_id": "", "owner": "", "ref": "refs/heads/" + sp.Branch}
	if sp.Change > 0 {
		change["change"] = strconv.Itoa(sp.Change)
		change["patchset"] = sp.Patchset
		change["change_url"] = fmt.Sprintf("%s/%d", reviewURL, sp.Change)
		change["commit_id"] = sha1Hex(sp.UUID)
		change["owner"] = "developer"
		change["ref"] = changeRef(sp.Change, sp.Patchset)
	}
	unix := func(t time.Time) any {
		if t.IsZero() {
			return nil
		}
		return float64(t.UnixNano()) / 1e9
	}
	job := map[string]any{"job_name": sp.Job, "job_uuid": b.jobUUID, "voting": true}
	action, message := "start", "Starting "+sp.Pipeline+" jobs."
	var buildsetResult any
	if !sp.InProgress {
		action, message, buildsetResult = "success", "Build succeeded.", "SUCCESS"
		result := sp.Result
		if result == "SUCCESS" && sp.SuccessMessage != "" {
			result = sp.SuccessMessage
		}
		if sp.Result != "SUCCESS" {
			action, message, buildsetResult = "failure", "Build failed.", "FAILURE"
			if sp.FailureMessage != "" {
				result = sp.FailureMessage
			}
		}
		built := map[string]any{
			"change":           copyMap(change),
			"uuid":             sp.UUID,
			"start_time":       unix(sp.StartTime),
			"end_time":         unix(sp.EndTime),
			"execute_time":     unix(sp.StartTime),
			"log_url":          b.logURL,
			"web_url":          s.url + "/t/" + tenant + "/build/" + sp.UUID,
			"result":           result,
			"dependencies":     []any{},
			"job_dependencies": map[string]any{},
			"artifacts":        b.artifactsJSON(),
			"events":           []any{},
		}
		for k, v := range built {
			job[k] = v
		}
	}
	msg := map[string]any{
		"timestamp":     float64(time.Now().UnixNano()) / 1e9,
		"action":        action,
		"tenant":        tenant,
		"zuul_ref":      "Z" + b.buildset,
		"pipeline":      sp.Pipeline,
		"changes":       []any{copyMap(change)},
		"project":       change["project"],
		"branch":        change["branch"],
		"change_url":    change["change_url"],
		"change":        change["change"],
		"patchset":      change["patchset"],
		"commit_id":     change["commit_id"],
		"owner":         change["owner"],
		"ref":           change["ref"],
		"message":       message,
		"trigger_time":  unix(b.triggered),
		"enqueue_time":  unix(b.enqueued),
		"uuid":          b.itemUUID,
		"zuul_event_id": b.eventID,
		"buildset": map[string]any{
			"uuid":         b.buildset,
			"result":       buildsetResult,
			"builds":       []any{job},
			"retry_builds": []any{},
		},
	}
	payload, err = json.Marshal(msg)
	if err != nil {
		return "", nil, fmt.Errorf("zuultest: encode the report of %s: %w", uuid, err)
	}
	return "zuul/" + tenant + "/" + sp.Pipeline + "/" + sp.Project, payload, nil
}

func copyMap(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
