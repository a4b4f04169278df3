package zuulapi

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// DefaultPageSize is Zuul's own default limit for the builds API.
const DefaultPageSize = 50

// Query filters the builds API. Empty fields are left out; several
// pipelines are OR-ed by Zuul. Zuul's answers are what it says they are, not
// necessarily what was asked: Check each before using it.
type Query struct {
	Project   string
	Branch    string
	JobName   string
	Pipelines []string
	Result    string // e.g. "SUCCESS"
	Complete  bool   // only builds that have finished
	Limit     int    // 0: Zuul's default (50)
	Skip      int
	// Final asks for builds Zuul does not report as retried. The builds API
	// took final before it took complete, so a Zuul that answers complete
	// answers it too; the answers are checked for it all the same.
	Final bool
}

// Successful is the question a poll of a zuul-image asks: the successful,
// finished, final builds of job on project, on branch and in pipelines when
// they are set. The poller sends it; the MQTT listener checks reported builds
// against it.
func Successful(project, branch, job string, pipelines []string) Query {
	return Query{Project: project, Branch: branch, JobName: job, Pipelines: pipelines,
		Result: "SUCCESS", Complete: true, Final: true}
}

// Encode returns the query string, in the order Zuul's docs list the
// parameters: project, job_name, pipeline..., branch, result, final,
// complete, limit, skip.
func (q Query) Encode() string {
	var parts []string
	add := func(k, v string) {
		if v != "" {
			parts = append(parts, k+"="+url.QueryEscape(v))
		}
	}
	add("project", q.Project)
	add("job_name", q.JobName)
	for _, p := range q.Pipelines {
		add("pipeline", p)
	}
	add("branch", q.Branch)
	add("result", q.Result)
	if q.Final {
		add("final", "true")
	}
	if q.Complete {
		add("complete", "true")
	}
	if q.Limit > 0 {
		add("limit", strconv.Itoa(q.Limit))
	}
	if q.Skip > 0 {
		add("skip", strconv.Itoa(q.Skip))
	}
	return strings.Join(parts, "&")
}

// Builds returns one page of the builds Zuul answers to q, newest first, as it
// answers them (see Query.Check). The token file is read afresh for the call.
func (c *Client) Builds(ctx context.Context, q Query) ([]Build, error) {
	token, err := c.token()
	if err != nil {
		return nil, err
	}
	builds, err := c.builds(ctx, token, q)
	if err != nil {
		return nil, fmt.Errorf("list Zuul builds of job %q: %w", q.JobName, err)
	}
	return builds, nil
}

func (c *Client) builds(ctx context.Context, token string, q Query) ([]Build, error) {
	endpoint, tenant, err := c.buildsURL(ctx, token)
	if err != nil {
		return nil, err
	}
	body, err := c.getBuilds(ctx, endpoint, token, tenant, q)
	if errors.Is(err, ErrUnknownTenant) && tenant == c.tenant {
		// A root white-labelled for this very tenant has no
		// /api/tenant/... path; its /api/info says so.
		wl, infoErr := c.whiteLabelTenant(ctx, token)
		switch {
		case infoErr != nil || wl == "":
			return nil, err
		case wl != c.tenant:
			return nil, &Error{StatusCode: 404, URL: endpoint, kind: ErrUnknownTenant,
				msg: fmt.Sprintf("Zuul at %s is white-labelled for tenant %q, not %q (fix tenant or leave it empty)", c.root, wl, c.tenant)}
		}
		c.setWhiteLabel(wl)
		endpoint = c.root + "api/builds"
		body, err = c.getBuilds(ctx, endpoint, token, tenant, q)
	}
	if err != nil {
		return nil, err
	}
	builds, err := decodeBuilds(body)
	if err != nil {
		return nil, &Error{StatusCode: 200, URL: endpoint, kind: ErrUnexpected,
			msg: fmt.Sprintf("read builds from %s: %v (is api-url the Zuul web root?)", endpoint, err)}
	}
	return builds, nil
}

func (c *Client) getBuilds(ctx context.Context, endpoint, token, tenant string, q Query) ([]byte, error) {
	u := endpoint
	if qs := q.Encode(); qs != "" {
		u += "?" + qs
	}
	c.log.Debug("query zuul builds", "url", u)
	return c.get(ctx, u, token, tenant)
}
