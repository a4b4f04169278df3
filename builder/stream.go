package builder

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/nodepool-builder/nodepool-builder/internal/follow"
	"github.com/nodepool-builder/nodepool-builder/poller"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/uploader"
)

// streams runs the uploads that follow downloads (uploader.Stream). They
// outlive the build step that starts them, under the context of Run or Once
// rather than the build's, which ends with the image's build lock; Run and
// Once wait for them.
type streams struct {
	ctx atomic.Pointer[context.Context]
	wg  sync.WaitGroup
}

// begin sets the context the uploads run under: Run's or Once's.
func (s *streams) begin(ctx context.Context) { s.ctx.Store(&ctx) }

// wait waits for every upload under way.
func (s *streams) wait() { s.wg.Wait() }

// streamer is the poller's Streamer: it starts the uploads with the uploader
// of the parts the poller belongs to.
type streamer struct {
	b  *Builder
	up *uploader.Uploader
}

func (s streamer) Stream(b store.Build, a poller.Artifact, src *follow.File) (poller.Streaming, bool) {
	ctx := s.b.streams.ctx.Load()
	if ctx == nil || (*ctx).Err() != nil {
		return nil, true
	}
	st, download := s.up.Stream(*ctx, b, uploader.Artifact(a), src)
	if st == nil {
		return nil, download // no upload begun: an untyped nil, which the poller tells
	}
	s.b.streams.wg.Go(func() {
		st.Wait()
		if err := st.Err(); err != nil {
			if f := s.b.onUploadError.Load(); f != nil {
				(*f)(err)
			}
		}
		// Retention may now release older uploads.
		select {
		case s.b.retain <- struct{}{}:
		default:
		}
	})
	return st, download
}
