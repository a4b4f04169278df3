package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/store/storetest"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// BenchmarkOnceNoOp is a --once with nothing to do over 500 zuul-images, each
// listed by two providers on a real Glance: every image is polled and planned,
// and both providers are swept.
func BenchmarkOnceNoOp(b *testing.B) {
	const images = 500
	glance := testenv.NewGlance(b)
	b.Setenv("OS_CLIENT_CONFIG_FILE", glance.CloudsFile)
	zuul := zuultest.NewServer(zuultest.ServerOptions{Tenant: "example"})
	b.Cleanup(zuul.Close)
	dir := b.TempDir()
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "images-dir: %s\nzuul-images:\n", filepath.Join(dir, "images"))
	for i := range images {
		fmt.Fprintf(&cfg, "  - name: img-%d\n    api-url: %s\n    tenant: example\n    project: org/images\n    job: build-img-%d\n", i, zuul.URL(), i)
	}
	cfg.WriteString("providers:\n")
	for _, p := range []string{"cloud-a", "cloud-b"} {
		fmt.Fprintf(&cfg, "  - name: %s\n    cloud: %s\n    image-format: qcow2\n    diskimages:\n", p, glance.Cloud)
		for i := range images {
			fmt.Fprintf(&cfg, "      - name: img-%d\n", i)
		}
	}
	path := filepath.Join(dir, "nodepool.yaml")
	if err := os.WriteFile(path, []byte(cfg.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	once := func() {
		var out, errb bytes.Buffer
		if code := run(context.Background(), []string{"nodepool-builder", "-c", path, "--once"}, &out, &errb); code != 0 {
			b.Fatalf("--once exited %d:\n%s", code, errb.String())
		}
	}
	once() // creates the state
	// Each image has a ready build of Zuul's newest build, uploaded to both
	// providers: what a steady fleet looks like.
	ctx := context.Background()
	st, raw := storetest.Open(b, store.Options{ImagesDir: filepath.Join(dir, "images")})
	for i := range images {
		image := fmt.Sprintf("img-%d", i)
		zb, err := zuul.AddBuild(zuultest.BuildSpec{Job: "build-" + image})
		if err != nil {
			b.Fatal(err)
		}
		bd, err := st.CreateBuild(ctx, store.Build{Image: image, Source: store.SourceZuul,
			Zuul: store.ZuulRef{UUID: zb.UUID, ID: zb.ID}})
		if err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(mustPath(st.FilePath(image, bd.ID, "qcow2")), []byte(image), 0o644); err != nil {
			b.Fatal(err)
		}
		bd.SetFile(store.File{Format: "qcow2", Size: int64(len(image)), Present: true})
		bd.SetState(store.Ready, st.Now())
		cur := store.Cursor{Image: image, ZuulID: zb.ID, ZuulUUID: zb.UUID, Outcome: "ready", Time: st.Now()}
		if err := raw.Write(ctx, store.PutBuild(&bd), store.PutCursor(cur)); err != nil {
			b.Fatal(err)
		}
		bd, _ = st.Build(ctx, bd.ID)
		for _, p := range []string{"cloud-a", "cloud-b"} {
			up, err := st.CreateUpload(ctx, &bd, p, "qcow2")
			if err != nil {
				b.Fatal(err)
			}
			up.SetState(store.Ready, st.Now())
			up.ExternalID, up.ExternalName = "ext-"+up.ID, image
			if err := raw.Write(ctx, store.PutUpload(&up)); err != nil {
				b.Fatal(err)
			}
		}
	}
	st.Close()
	once()
	b.ResetTimer()
	for range b.N {
		once()
	}
}
