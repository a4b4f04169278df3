package store

import (
	"context"
	"errors"
	"testing"
)

func TestReleaseBuild(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name        string
		build       State   // the build's state before the release
		uploads     []State // its uploads' states, to cloud-a
		wantErr     error
		wantUploads State // every upload's state afterwards
	}{
		{name: "ready build and its uploads", build: Ready, uploads: []State{Ready, Failed, Deleting}, wantUploads: Deleting},
		{name: "failed build", build: Failed, wantUploads: Deleting},
		{name: "already deleting", build: Deleting, uploads: []State{Deleting}, wantUploads: Deleting},
		{name: "refused while building", build: Building, wantErr: ErrInProgress},
		{name: "refused while an upload runs", build: Ready, uploads: []State{Ready, Uploading}, wantErr: ErrInProgress},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := openTest(t, t.TempDir())
			b, err := s.CreateBuild(ctx, Build{Image: "debian", Source: SourceDIB})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.SetBuildState(ctx, b.ID, c.build, ""); err != nil {
				t.Fatal(err)
			}
			before := map[string]State{}
			for _, st := range c.uploads {
				u, err := s.CreateUpload(ctx, b.ID, "cloud-a", "qcow2")
				if err != nil {
					t.Fatal(err)
				}
				u.State = st
				if err := s.UpdateUpload(ctx, u); err != nil {
					t.Fatal(err)
				}
				before[u.ID] = st
			}

			got, err := s.ReleaseBuild(ctx, b.ID, "operator asked")
			if !errors.Is(err, c.wantErr) {
				t.Fatalf("ReleaseBuild error = %v, want %v", err, c.wantErr)
			}
			after, lerr := s.Build(ctx, b.ID)
			if lerr != nil {
				t.Fatal(lerr)
			}
			ups, lerr := s.Uploads(ctx, UploadFilter{BuildID: b.ID})
			if lerr != nil {
				t.Fatal(lerr)
			}
			if c.wantErr != nil {
				if after.State != c.build {
					t.Errorf("a refused release changed the build to %s", after.State)
				}
				for _, u := range ups {
					if u.State != before[u.ID] {
						t.Errorf("a refused release changed upload %s from %s to %s", u.ID, before[u.ID], u.State)
					}
				}
				return
			}
			if got.State != Deleting || after.State != Deleting || got.Name() != b.Name() {
				t.Errorf("release returned %s %s, store holds %s; want deleting", got.Name(), got.State, after.State)
			}
			for _, u := range ups {
				if u.State != c.wantUploads {
					t.Errorf("upload %s is %s, want %s", u.ID, u.State, c.wantUploads)
				}
			}
		})
	}

	t.Run("unknown build", func(t *testing.T) {
		s := openTest(t, t.TempDir())
		if _, err := s.ReleaseBuild(ctx, "0123456789abcdef", ""); !errors.Is(err, ErrNotFound) {
			t.Fatalf("error = %v, want ErrNotFound", err)
		}
	})
}

func TestReleaseUpload(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name    string
		state   State
		wantErr error
	}{
		{name: "ready", state: Ready},
		{name: "failed", state: Failed},
		{name: "already deleting", state: Deleting},
		{name: "refused while uploading", state: Uploading, wantErr: ErrInProgress},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := openTest(t, t.TempDir())
			b, err := s.CreateBuild(ctx, Build{Image: "debian", Source: SourceZuul})
			if err != nil {
				t.Fatal(err)
			}
			target, err := s.CreateUpload(ctx, b.ID, "cloud-a", "raw")
			if err != nil {
				t.Fatal(err)
			}
			target.State, target.ExternalID = c.state, "ext-1"
			if err := s.UpdateUpload(ctx, target); err != nil {
				t.Fatal(err)
			}
			// A sibling upload in the same build and provider must be left alone.
			sibling, err := s.CreateUpload(ctx, b.ID, "cloud-a", "raw")
			if err != nil {
				t.Fatal(err)
			}
			sibling.State = Ready
			if err := s.UpdateUpload(ctx, sibling); err != nil {
				t.Fatal(err)
			}

			got, err := s.ReleaseUpload(ctx, b.ID, "cloud-a", target.ID)
			if !errors.Is(err, c.wantErr) {
				t.Fatalf("ReleaseUpload error = %v, want %v", err, c.wantErr)
			}
			ups, err := s.Uploads(ctx, UploadFilter{BuildID: b.ID})
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]State{target.ID: Deleting, sibling.ID: Ready}
			if c.wantErr != nil {
				want[target.ID] = c.state
			} else if got.State != Deleting || got.Image != "debian" || got.ExternalID != "ext-1" {
				t.Errorf("release returned %+v", got)
			}
			for _, u := range ups {
				if u.State != want[u.ID] {
					t.Errorf("upload %s is %s, want %s", u.ID, u.State, want[u.ID])
				}
			}
		})
	}

	t.Run("unknown upload", func(t *testing.T) {
		s := openTest(t, t.TempDir())
		if _, err := s.ReleaseUpload(ctx, "nope", "cloud-a", "0000000001"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("error = %v, want ErrNotFound", err)
		}
	})
}
