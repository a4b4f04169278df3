package uploader

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/progress"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// resendingCloud reads half of every upload's data and then sends all of it
// again from where the reader stood, as a cloud does whose first PUT was refused
// for a token that expired just then.
type resendingCloud struct{ *fakeCloud }

func (c resendingCloud) Upload(ctx context.Context, id string, r io.Reader, size int64) error {
	s, ok := r.(io.Seeker)
	if !ok {
		return errors.New("Glance refused the token after the data had started, and this data cannot be sent again")
	}
	from, err := s.Seek(0, io.SeekCurrent)
	if err != nil {
		return err
	}
	if _, err := io.CopyN(io.Discard, r, size/2); err != nil {
		return err
	}
	if _, err := s.Seek(from, io.SeekStart); err != nil {
		return err
	}
	return c.fakeCloud.Upload(ctx, id, r, size)
}

// TestUploadSendsDataAgain: a cloud that must send the data a second time can
// rewind it, and the upload's task counts the bytes once.
func TestUploadSendsDataAgain(t *testing.T) {
	f := newFixture(t)
	f.cfg.Providers = f.cfg.Providers[:1]
	tr := progress.NewTracker()
	f.up = New(Options{Store: f.st, Config: f.cfg, Clouds: map[string]Cloud{"a": resendingCloud{f.clouds["a"]}},
		RetryBase: time.Hour, Logger: slog.New(slog.NewTextHandler(t.Output(), nil)),
		PollInterval: time.Millisecond, Now: f.clock.Now, Progress: tr})
	var during []progress.Status
	f.clouds["a"].sent = func() { during = tr.Running() }
	b := f.addBuild("debian", "qcow2")
	if err := f.step(context.Background()); err != nil {
		t.Fatalf("upload sent again: %v", err)
	}
	file, _ := b.File("qcow2")
	ups := f.uploads(store.UploadFilter{Provider: "a"})
	if len(ups) != 1 || string(f.clouds["a"].data[ups[0].ExternalID]) != b.ID+"/qcow2" {
		t.Fatalf("uploads = %+v; want one with the file's data", ups)
	}
	if len(during) != 1 || during[0].Done != file.Size {
		t.Errorf("tasks while the data was sent: %+v, want one with %d bytes done", during, file.Size)
	}
}
