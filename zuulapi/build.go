package zuulapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"time"
)

// Build is one Zuul build as the builds API reports it.
type Build struct {
	// ID is Zuul's database id (`_id`); newer builds have larger ids.
	ID       int64
	UUID     string
	JobName  string
	Result   string // empty while the build runs
	Pipeline string
	LogURL   string
	// StartTime and EndTime are UTC; zero when Zuul reports none.
	StartTime time.Time
	EndTime   time.Time
	Duration  float64 // seconds
	Final     bool    // false only when Zuul says so (a retried build); Zuul older than the field says nothing
	Held      bool
	Voting    bool
	Ref       Ref
	// BuildsetUUID is the uuid of the buildset the build belongs to.
	BuildsetUUID string
	Artifacts    []Artifact
}

// Ref is what a build ran on: a change, or a branch/tag for post and
// periodic pipelines.
type Ref struct {
	Project  string
	Branch   string
	Change   string // empty for refs that are not changes
	Patchset string
	Ref      string
	Oldrev   string
	Newrev   string
	RefURL   string
}

// Unmerged tells whether the build ran on a change (a ref with a change
// number, as in a check pipeline) rather than on a branch or a tag: code that
// anyone may propose and nobody may have reviewed. A zuul-image fetches such a
// build only with allow-unmerged-changes; the poller and the MQTT listener
// both ask this.
func (b Build) Unmerged() bool {
	return b.Ref.Change != "" && b.Ref.Change != "0"
}

// Artifact is a file a build published. URL is absolute whenever the build
// has a log URL to resolve it against.
type Artifact struct {
	Name     string
	URL      string
	Metadata map[string]any
}

// wireBuild accepts both shapes of the API: Zuul >= 10 nests the ref
// fields under "ref", Zuul <= 9 puts them on the build with "ref" a string.
type wireBuild struct {
	ID        flexInt         `json:"_id"`
	UUID      string          `json:"uuid"`
	JobName   string          `json:"job_name"`
	Result    string          `json:"result"`
	Pipeline  string          `json:"pipeline"`
	LogURL    string          `json:"log_url"`
	StartTime zuulTime        `json:"start_time"`
	EndTime   zuulTime        `json:"end_time"`
	Duration  float64         `json:"duration"`
	Final     *bool           `json:"final"`
	Held      bool            `json:"held"`
	Voting    bool            `json:"voting"`
	Ref       json.RawMessage `json:"ref"`
	wireRef
	Buildset *struct {
		UUID string `json:"uuid"`
	} `json:"buildset"`
	Artifacts []struct {
		Name     string         `json:"name"`
		URL      string         `json:"url"`
		Metadata map[string]any `json:"metadata"`
	} `json:"artifacts"`
}

// wireRef is the ref without its "ref" member, which differs in type
// between the two shapes and is handled by the caller.
type wireRef struct {
	Project  string     `json:"project"`
	Branch   string     `json:"branch"`
	Change   FlexString `json:"change"`
	Patchset FlexString `json:"patchset"`
	Oldrev   string     `json:"oldrev"`
	Newrev   string     `json:"newrev"`
	RefURL   string     `json:"ref_url"`
}

func (w wireRef) ref(name string) Ref {
	return Ref{
		Project:  w.Project,
		Branch:   w.Branch,
		Change:   string(w.Change),
		Patchset: string(w.Patchset),
		Ref:      name,
		Oldrev:   w.Oldrev,
		Newrev:   w.Newrev,
		RefURL:   w.RefURL,
	}
}

// decodeBuilds parses a builds API answer. Numbers inside artifact
// metadata stay json.Number so that sizes keep every digit.
func decodeBuilds(body []byte) ([]Build, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var wire []wireBuild
	if err := dec.Decode(&wire); err != nil {
		return nil, fmt.Errorf("decode builds list: %w", err)
	}
	builds := make([]Build, 0, len(wire))
	for i, w := range wire {
		b, err := w.build()
		if err != nil {
			return nil, fmt.Errorf("decode build %d (%s): %w", i, w.UUID, err)
		}
		builds = append(builds, b)
	}
	return builds, nil
}

func (w wireBuild) build() (Build, error) {
	b := Build{
		ID:        int64(w.ID),
		UUID:      w.UUID,
		JobName:   w.JobName,
		Result:    w.Result,
		Pipeline:  w.Pipeline,
		LogURL:    w.LogURL,
		StartTime: time.Time(w.StartTime),
		EndTime:   time.Time(w.EndTime),
		Duration:  w.Duration,
		Final:     w.Final == nil || *w.Final,
		Held:      w.Held,
		Voting:    w.Voting,
	}
	if w.Buildset != nil {
		b.BuildsetUUID = w.Buildset.UUID
	}
	raw := bytes.TrimSpace(w.Ref)
	switch {
	case len(raw) > 0 && raw[0] == '{':
		var nested struct {
			wireRef
			Ref string `json:"ref"`
		}
		if err := json.Unmarshal(raw, &nested); err != nil {
			return Build{}, fmt.Errorf("decode ref: %w", err)
		}
		b.Ref = nested.wireRef.ref(nested.Ref)
	case len(raw) > 0 && raw[0] == '"':
		var name string
		if err := json.Unmarshal(raw, &name); err != nil {
			return Build{}, fmt.Errorf("decode ref: %w", err)
		}
		b.Ref = w.wireRef.ref(name)
	default: // absent or null
		b.Ref = w.wireRef.ref("")
	}
	base, baseErr := url.Parse(w.LogURL)
	for _, a := range w.Artifacts {
		art := Artifact{Name: a.Name, URL: a.URL, Metadata: a.Metadata}
		// Zuul resolves relative artifact URLs against log_url with
		// urljoin; do the same for servers that did not.
		if u, err := url.Parse(a.URL); err == nil && !u.IsAbs() && w.LogURL != "" && baseErr == nil {
			art.URL = base.ResolveReference(u).String()
		}
		b.Artifacts = append(b.Artifacts, art)
	}
	return b, nil
}

// FlexString takes a JSON string, number or null: Zuul reports change
// numbers as integers in some versions and strings in others, in its API and
// in its MQTT reports alike.
type FlexString string

func (s *FlexString) UnmarshalJSON(data []byte) error {
	data = bytes.TrimSpace(data)
	switch {
	case bytes.Equal(data, []byte("null")):
		*s = ""
	case len(data) > 0 && data[0] == '"':
		var v string
		if err := json.Unmarshal(data, &v); err != nil {
			return err
		}
		*s = FlexString(v)
	default:
		var n json.Number
		if err := json.Unmarshal(data, &n); err != nil {
			return fmt.Errorf("want a string or number, got %s", data)
		}
		*s = FlexString(n.String())
	}
	return nil
}

// flexInt takes a JSON integer, a string holding one, or null.
type flexInt int64

func (n *flexInt) UnmarshalJSON(data []byte) error {
	data = bytes.TrimSpace(data)
	if bytes.Equal(data, []byte("null")) {
		*n = 0
		return nil
	}
	text := string(data)
	if len(data) > 0 && data[0] == '"' {
		if err := json.Unmarshal(data, &text); err != nil {
			return err
		}
	}
	v, err := strconv.ParseInt(text, 10, 64)
	if err != nil {
		return fmt.Errorf("want an integer, got %s", data)
	}
	*n = flexInt(v)
	return nil
}

// zuulTime parses Zuul's timestamps: "2006-01-02T15:04:05" in UTC without
// a zone, as Zuul writes them; RFC 3339 is accepted too, null is zero.
type zuulTime time.Time

var zoneless = []string{
	"2006-01-02T15:04:05.999999999",
	"2006-01-02 15:04:05.999999999",
}

func (t *zuulTime) UnmarshalJSON(data []byte) error {
	if bytes.Equal(bytes.TrimSpace(data), []byte("null")) {
		*t = zuulTime{}
		return nil
	}
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("want a timestamp string, got %s", data)
	}
	if s == "" {
		*t = zuulTime{}
		return nil
	}
	if v, err := time.Parse(time.RFC3339Nano, s); err == nil {
		*t = zuulTime(v.UTC())
		return nil
	}
	for _, layout := range zoneless {
		if v, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			*t = zuulTime(v)
			return nil
		}
	}
	return fmt.Errorf("unrecognised timestamp %q", s)
}
