package zuulapi

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestDecodeBuilds(t *testing.T) {
	end := time.Date(2024, 3, 4, 5, 6, 7, 0, time.UTC)
	tests := []struct {
		name    string
		json    string
		want    Build
		wantErr string
	}{
		{
			name: "zuul 10 nested ref",
			json: `[{"_id": 42, "uuid": "u1", "job_name": "build-img", "result": "SUCCESS",
				"held": false, "start_time": "2024-03-04T05:00:07", "end_time": "2024-03-04T05:06:07",
				"duration": 360.0, "voting": true, "log_url": "https://logs.example.com/u1/",
				"final": true, "pipeline": "periodic", "buildset": {"uuid": "bs1"},
				"ref": {"project": "org/images", "branch": "master", "change": null, "patchset": null,
					"ref": "refs/heads/master", "oldrev": null, "newrev": "abc", "ref_url": "https://git/abc"},
				"artifacts": [{"name": "qcow2", "url": "https://logs.example.com/u1/img.qcow2",
					"metadata": {"type": "zuul_image", "format": "qcow2", "size": 12345678901234567}}]}]`,
			want: Build{
				ID: 42, UUID: "u1", JobName: "build-img", Result: "SUCCESS", Pipeline: "periodic",
				LogURL: "https://logs.example.com/u1/", StartTime: end.Add(-6 * time.Minute), EndTime: end,
				Duration: 360, Final: true, Voting: true, BuildsetUUID: "bs1",
				Ref: Ref{Project: "org/images", Branch: "master", Ref: "refs/heads/master", Newrev: "abc", RefURL: "https://git/abc"},
				Artifacts: []Artifact{{Name: "qcow2", URL: "https://logs.example.com/u1/img.qcow2",
					Metadata: map[string]any{"type": "zuul_image", "format": "qcow2", "size": json.Number("12345678901234567")}}},
			},
		},
		{
			name: "zuul 9 flat ref with an integer change",
			json: `[{"_id": "7", "uuid": "u2", "job_name": "j", "result": "FAILURE", "pipeline": "check",
				"project": "org/images", "branch": "main", "change": 1234, "patchset": "3",
				"ref": "refs/changes/34/1234/3", "oldrev": null, "newrev": null, "ref_url": "https://review/1234",
				"start_time": null, "end_time": "2024-03-04T05:06:07Z", "duration": null,
				"log_url": null, "final": true, "voting": false, "held": true, "artifacts": []}]`,
			want: Build{
				ID: 7, UUID: "u2", JobName: "j", Result: "FAILURE", Pipeline: "check", EndTime: end,
				Final: true, Held: true,
				Ref: Ref{Project: "org/images", Branch: "main", Change: "1234", Patchset: "3",
					Ref: "refs/changes/34/1234/3", RefURL: "https://review/1234"},
			},
		},
		{
			name: "string change, RFC 3339 time with zone, no buildset, no final",
			json: `[{"uuid": "u3", "change": "99", "patchset": 2, "start_time": "2024-03-04T07:06:07+02:00"}]`,
			want: Build{UUID: "u3", StartTime: end, Final: true, Ref: Ref{Change: "99", Patchset: "2"}},
		},
		{
			name: "relative artifact URLs join onto log_url",
			json: `[{"uuid": "u4", "log_url": "https://logs.example.com/a/b/u4/", "artifacts": [
				{"name": "raw", "url": "image.raw.zst"},
				{"name": "vhd", "url": "sub/image.vhd"},
				{"name": "abs", "url": "https://cdn.example.com/x.qcow2"},
				{"name": "root", "url": "/top.raw"}]}]`,
			want: Build{UUID: "u4", LogURL: "https://logs.example.com/a/b/u4/", Final: true, Artifacts: []Artifact{
				{Name: "raw", URL: "https://logs.example.com/a/b/u4/image.raw.zst"},
				{Name: "vhd", URL: "https://logs.example.com/a/b/u4/sub/image.vhd"},
				{Name: "abs", URL: "https://cdn.example.com/x.qcow2"},
				{Name: "root", URL: "https://logs.example.com/top.raw"},
			}},
		},
		{
			name:    "bad timestamp",
			json:    `[{"uuid": "u5", "end_time": "yesterday"}]`,
			wantErr: "yesterday",
		},
		{
			name:    "not a list",
			json:    `{"builds": []}`,
			wantErr: "decode builds list",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := decodeBuilds([]byte(tt.json))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one mentioning %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 {
				t.Fatalf("got %d builds", len(got))
			}
			if !reflect.DeepEqual(got[0], tt.want) {
				t.Errorf("got  %+v\nwant %+v", got[0], tt.want)
			}
		})
	}
}

func TestQueryEncode(t *testing.T) {
	tests := []struct {
		q    Query
		want string
	}{
		{Query{}, ""},
		{Query{JobName: "build image"}, "job_name=build+image"},
		{
			Query{Project: "org/images", Branch: "master", JobName: "j", Pipelines: []string{"periodic", "post"},
				Result: "SUCCESS", Complete: true, Limit: 10, Skip: 20},
			"project=org%2Fimages&job_name=j&pipeline=periodic&pipeline=post&branch=master&result=SUCCESS&complete=true&limit=10&skip=20",
		},
		{Successful("org/images", "", "j", nil), "project=org%2Fimages&job_name=j&result=SUCCESS&final=true&complete=true"},
	}
	for _, tt := range tests {
		if got := tt.q.Encode(); got != tt.want {
			t.Errorf("%+v.Encode() = %q, want %q", tt.q, got, tt.want)
		}
	}
}

func TestDescribe(t *testing.T) {
	tests := map[string]string{
		`{"description": "Token has expired", "error": "TokenExpiredError", "realm": "x"}`: "Token has expired",
		`{"error": "MissingAuthError"}`: "MissingAuthError",
		"<html><body><h2>404 Not Found</h2>\n<p>Unknown   <b>tenant</b></p></body></html>": "Unknown tenant",
		"plain text\nanswer": "plain text answer",
		"":                   "",
	}
	for body, want := range tests {
		if got := describe([]byte(body)); got != want {
			t.Errorf("describe(%q) = %q, want %q", body, got, want)
		}
	}
}

func TestUnmerged(t *testing.T) {
	for change, want := range map[string]bool{"": false, "0": false, "123": true, "1": true} {
		if got := (Build{Ref: Ref{Change: change}}).Unmerged(); got != want {
			t.Errorf("a build on change %q: Unmerged() = %v, want %v", change, got, want)
		}
	}
}
