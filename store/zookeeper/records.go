package zookeeper

import (
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/z-division/go-zookeeper/zk"

	"github.com/nodepool-builder/nodepool-builder/store"
)

// Paths of nodepool's image records.
func imagePath(image string) string   { return imageRoot + "/" + image }
func buildsPath(image string) string  { return imagePath(image) + "/builds" }
func requestPath(image string) string { return imagePath(image) + "/request-build" }
func pausePath(image string) string   { return imagePath(image) + "/pause" }
func buildPath(image, id string) string {
	return buildsPath(image) + "/" + id
}
func uploadsPath(image, build, provider string) string {
	return buildPath(image, build) + "/providers/" + provider + "/images"
}
func uploadPath(image, build, provider, id string) string {
	return uploadsPath(image, build, provider) + "/" + id
}
func cursorPath(image string) string { return ourRoot + "/cursors/" + image }
func leakPath(provider, id string) string {
	return ourRoot + "/leaks/" + provider + "/" + id
}

// lockPath is where nodepool takes the lock a key names.
func lockPath(k store.LockKey) string {
	switch {
	case k.UploadID != "":
		return uploadPath(k.Image, k.BuildID, k.Provider, k.UploadID) + "/" + lockNode
	case k.Provider != "":
		return uploadsPath(k.Image, k.BuildID, k.Provider) + "/" + lockNode
	case k.BuildID != "":
		return buildPath(k.Image, k.BuildID) + "/" + lockNode
	}
	return buildsPath(k.Image) + "/" + lockNode
}

// nodepool's defaults for what the launcher reads of a build and an upload.
const (
	defaultUsername   = "zuul"
	defaultPythonPath = "auto"
)

// buildJSON is a build znode as nodepool's ImageBuild writes it.
type buildJSON struct {
	State      string   `json:"state"`
	StateTime  *float64 `json:"state_time"`
	Builder    string   `json:"builder,omitempty"`
	BuilderID  string   `json:"builder_id,omitempty"`
	Formats    string   `json:"formats,omitempty"` // sorted, comma-joined
	Username   *string  `json:"username"`
	PythonPath *string  `json:"python_path"`
	ShellType  *string  `json:"shell_type"`
}

// buildExtra is what nodepool has no field for, in the build's extraNode.
type buildExtra struct {
	Source  string            `json:"source"`
	Created float64           `json:"created"`
	PID     int               `json:"pid,omitempty"`
	Reason  string            `json:"reason,omitempty"`
	Request string            `json:"request,omitempty"`
	Files   []fileJSON        `json:"files,omitempty"`
	Refused map[string]string `json:"refused,omitempty"`
	Zuul    *zuulJSON         `json:"zuul,omitempty"`
}

type fileJSON struct {
	Format  string `json:"format"`
	SHA256  string `json:"sha256,omitempty"`
	MD5     string `json:"md5,omitempty"`
	Size    int64  `json:"size,omitempty"`
	URL     string `json:"url,omitempty"`
	Present bool   `json:"present"`
}

type zuulJSON struct {
	UUID    string  `json:"uuid"`
	ID      int64   `json:"id"`
	EndTime float64 `json:"end_time,omitempty"`
	LogURL  string  `json:"log_url,omitempty"`
}

// uploadJSON is an upload znode as nodepool's ImageUpload writes it.
type uploadJSON struct {
	State        string   `json:"state"`
	StateTime    *float64 `json:"state_time"`
	ExternalID   *string  `json:"external_id"`
	ExternalName *string  `json:"external_name"`
	Format       *string  `json:"format"`
	Username     *string  `json:"username"`
	PythonPath   *string  `json:"python_path"`
	ShellType    *string  `json:"shell_type"`
}

// uploadExtra is what nodepool has no field for, in the upload's extraNode.
type uploadExtra struct {
	Attempts    int     `json:"attempts,omitempty"`
	LastError   string  `json:"last_error,omitempty"`
	NextAttempt float64 `json:"next_attempt,omitempty"`
}

// seconds is a time as nodepool writes it: float seconds since the epoch.
func seconds(t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return float64(t.UnixNano()) / 1e9
}

func fromSeconds(f float64) time.Time {
	if f == 0 || math.IsNaN(f) || math.IsInf(f, 0) {
		return time.Time{}
	}
	sec, frac := math.Modf(f)
	return time.Unix(int64(sec), int64(frac*1e9)).UTC()
}

func strPtr(s string) *string {
	return &s
}

// orNull is a JSON null for an empty string, as Python's None.
func orNull(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// orDefault is s, or nodepool's default for an unset field.
func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// unlessDefault is s, or unset when it is nodepool's default: the store keeps
// what the config set.
func unlessDefault(s, def string) string {
	if s == def {
		return ""
	}
	return s
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// encodeBuild returns a build's znode data and its extra node's.
func encodeBuild(b store.Build) (data, extra []byte, err error) {
	st := seconds(b.StateTime)
	formats := make([]string, 0, len(b.Files))
	for _, f := range b.Files {
		formats = append(formats, f.Format)
	}
	sort.Strings(formats)
	username, python := orDefault(b.Username, defaultUsername), orDefault(b.PythonPath, defaultPythonPath)
	j := buildJSON{State: string(b.State), StateTime: &st, Builder: b.Hostname, BuilderID: b.BuilderID,
		Formats: strings.Join(formats, ","), Username: strPtr(username), PythonPath: strPtr(python),
		ShellType: orNull(b.ShellType)}
	x := buildExtra{Source: string(b.Source), Created: seconds(b.Created), PID: b.PID, Reason: b.Reason, Refused: b.Refused,
		Request: b.Request}
	for _, f := range b.Files {
		x.Files = append(x.Files, fileJSON{f.Format, f.SHA256, f.MD5, f.Size, f.URL, f.Present})
	}
	if b.Zuul.UUID != "" {
		x.Zuul = &zuulJSON{UUID: b.Zuul.UUID, ID: b.Zuul.ID, EndTime: seconds(b.Zuul.EndTime), LogURL: b.Zuul.LogURL}
	}
	if data, err = json.Marshal(j); err != nil {
		return nil, nil, err
	}
	extra, err = json.Marshal(x)
	return data, extra, err
}

// decodeBuild makes a build of its znode's data and stat and, when it has one,
// its extra node's data. A build a Python builder made has no extra node: it is
// a DIB build whose files, on that builder's host, have the formats it lists.
// Anyone who may write the znodes writes these: a record that store.CheckBuild
// refuses is an error.
func decodeBuild(image, id string, data []byte, stat *zk.Stat, extra []byte) (store.Build, error) {
	var j buildJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return store.Build{}, fmt.Errorf("build %s-%s: %w", image, id, err)
	}
	b := store.Build{
		ID: id, Image: image, State: store.State(j.State), BuilderID: j.BuilderID, Hostname: j.Builder,
		Username: deref(j.Username), PythonPath: deref(j.PythonPath), ShellType: deref(j.ShellType),
		Source: store.SourceDIB, Version: int64(stat.Version) + 1,
		Created: time.UnixMilli(stat.Ctime).UTC(),
	}
	if j.StateTime != nil {
		b.StateTime = fromSeconds(*j.StateTime)
	}
	b.Username, b.PythonPath = unlessDefault(b.Username, defaultUsername), unlessDefault(b.PythonPath, defaultPythonPath)
	if extra != nil {
		var x buildExtra
		if err := json.Unmarshal(extra, &x); err != nil {
			return store.Build{}, fmt.Errorf("build %s-%s: our record: %w", image, id, err)
		}
		b.Source, b.PID, b.Reason, b.Refused, b.Request = store.SourceName(x.Source), x.PID, x.Reason, x.Refused, x.Request
		if x.Created != 0 {
			b.Created = fromSeconds(x.Created)
		}
		for _, f := range x.Files {
			b.Files = append(b.Files, store.File{Format: f.Format, SHA256: f.SHA256, MD5: f.MD5, Size: f.Size, URL: f.URL, Present: f.Present})
		}
		if x.Zuul != nil {
			b.Zuul = store.ZuulRef{UUID: x.Zuul.UUID, ID: x.Zuul.ID, EndTime: fromSeconds(x.Zuul.EndTime), LogURL: x.Zuul.LogURL}
		}
	}
	if len(b.Files) == 0 && j.Formats != "" {
		for _, f := range strings.Split(j.Formats, ",") {
			b.Files = append(b.Files, store.File{Format: f, Present: true})
		}
	}
	sort.Slice(b.Files, func(i, k int) bool { return b.Files[i].Format < b.Files[k].Format })
	if err := store.CheckBuild(b); err != nil {
		return store.Build{}, err
	}
	return b, nil
}

// encodeUpload returns an upload's znode data and its extra node's.
func encodeUpload(u store.Upload) (data, extra []byte, err error) {
	st := seconds(u.StateTime)
	username, python := orDefault(u.Username, defaultUsername), orDefault(u.PythonPath, defaultPythonPath)
	j := uploadJSON{State: string(u.State), StateTime: &st, ExternalID: orNull(u.ExternalID),
		ExternalName: orNull(u.ExternalName), Format: orNull(u.Format), Username: strPtr(username),
		PythonPath: strPtr(python), ShellType: orNull(u.ShellType)}
	x := uploadExtra{Attempts: u.Attempts, LastError: u.LastError, NextAttempt: seconds(u.NextAttempt)}
	if data, err = json.Marshal(j); err != nil {
		return nil, nil, err
	}
	extra, err = json.Marshal(x)
	return data, extra, err
}

// decodeUpload makes an upload of its znode's data and stat and, when it has
// one, its extra node's data; an error for one store.CheckUpload refuses.
func decodeUpload(image, build, provider, id string, data []byte, stat *zk.Stat, extra []byte) (store.Upload, error) {
	var j uploadJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return store.Upload{}, fmt.Errorf("upload %s-%s/%s/%s: %w", image, build, provider, id, err)
	}
	u := store.Upload{
		BuildID: build, Image: image, Provider: provider, ID: id, State: store.State(j.State),
		ExternalID: deref(j.ExternalID), ExternalName: deref(j.ExternalName), Format: deref(j.Format),
		Username: deref(j.Username), PythonPath: deref(j.PythonPath), ShellType: deref(j.ShellType),
		Version: int64(stat.Version) + 1,
	}
	if j.StateTime != nil {
		u.StateTime = fromSeconds(*j.StateTime)
	}
	u.Username, u.PythonPath = unlessDefault(u.Username, defaultUsername), unlessDefault(u.PythonPath, defaultPythonPath)
	if extra != nil {
		var x uploadExtra
		if err := json.Unmarshal(extra, &x); err != nil {
			return store.Upload{}, fmt.Errorf("upload %s: our record: %w", u, err)
		}
		u.Attempts, u.LastError, u.NextAttempt = x.Attempts, x.LastError, fromSeconds(x.NextAttempt)
	}
	if err := store.CheckUpload(u); err != nil {
		return store.Upload{}, err
	}
	return u, nil
}

// cursorJSON is a poll cursor in our own root.
type cursorJSON struct {
	ZuulID   int64   `json:"zuul_id"`
	ZuulUUID string  `json:"zuul_uuid"`
	Outcome  string  `json:"outcome"`
	Reason   string  `json:"reason,omitempty"`
	Time     float64 `json:"time"`
	// Added later: a cursor without them reads as one with none.
	ZuulEndTime float64 `json:"zuul_end_time,omitempty"`
	BehindID    int64   `json:"behind_id,omitempty"`
	Build       string  `json:"build_id,omitempty"`
	Waiting     string  `json:"waiting,omitempty"`
}

func encodeCursor(c store.Cursor) ([]byte, error) {
	return json.Marshal(cursorJSON{c.ZuulID, c.ZuulUUID, c.Outcome, c.Reason, seconds(c.Time), seconds(c.ZuulEndTime), c.BehindID, c.Build,
		c.Waiting})
}
