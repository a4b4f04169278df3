package artifacts

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"path/filepath"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/internal/follow"
)

// TestFetchFollowed: a reader that follows a download (Request.Follow) reads
// exactly the image, holes included as zeros, however it is fetched: plain or
// compressed, in one stream cut off and resumed, or in ranges.
func TestFetchFollowed(t *testing.T) {
	// Data, a run of zeros the writers leave as holes, data, and zeros at the
	// end, which leave the file short until it is whole.
	image := append(append(append(testImage(3<<19), make([]byte, 1<<20)...), testImage(1<<19)...), make([]byte, 1<<19)...)
	sha, md5 := digests(image)
	for _, comp := range []string{"", "zst", "gz"} {
		for _, how := range []string{"stream", "ranges"} {
			t.Run(fmt.Sprintf("comp=%s %s", comp, how), func(t *testing.T) {
				served := compress(t, comp, image)
				var url string
				var f *Fetcher
				if how == "ranges" {
					rs := &rangeServer{versions: [][]byte{served}, etags: []string{`"v1"`}}
					url, f = newRangeServer(t, rs).URL, rangedFetcher(t)
				} else {
					// The first GET breaks off half-way: the second resumes or starts over.
					url, f = newFileServer(t, &fileServer{content: served, dropAfter: int64(len(served) / 2)}).URL, testFetcher(t)
				}
				src := follow.New()
				defer src.Close()
				read := make(chan []byte, 1)
				go func() {
					b, err := io.ReadAll(src.NewReader(context.Background()))
					if err != nil {
						t.Errorf("the follower: %v", err)
					}
					read <- b
				}()
				dest := filepath.Join(t.TempDir(), "img.raw")
				res, err := f.Fetch(context.Background(), Request{URL: url + "/img.raw" + suffix(comp),
					Files: files(f, "img.raw", dest), SHA256: sha, MD5: md5, Follow: src})
				if err != nil {
					t.Fatalf("Fetch: %v", err)
				}
				checkFetched(t, f, res, dest, image)
				if err := src.Release(res.Size); err != nil {
					t.Fatal(err)
				}
				if got := <-read; !bytes.Equal(got, image) {
					t.Fatalf("the follower read %d bytes that are not the image's %d", len(got), len(image))
				}
			})
		}
	}
}
