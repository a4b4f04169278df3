package state

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/store/storetest"
)

// loadTestConfig writes a config of an images-dir, with zk's keys when given.
func loadTestConfig(t *testing.T, dir, zk string) *config.Config {
	t.Helper()
	path := filepath.Join(dir, "nodepool.yaml")
	text := "images-dir: " + filepath.Join(dir, "images") + "\n" + zk
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(config.Files{Nodepool: path})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestImportToZooKeeper(t *testing.T) {
	z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{})
	ctx := context.Background()
	dir := t.TempDir()
	zkKeys := fmt.Sprintf("zookeeper-servers:\n  - host: %s\n    port: %d\n    chroot: /import\nzookeeper-timeout: 4\n",
		strings.Split(z.Addr, ":")[0], z.Port)

	// A SQLite state with a ready build and its upload.
	sqlCfg := loadTestConfig(t, dir, "")
	st, err := Open(ctx, sqlCfg, Options{Access: store.Create})
	if err != nil {
		t.Fatal(err)
	}
	sq, _ := st.SQLite()
	raw := storetest.Raw{Backend: sq, Now: st.Now}
	b, err := st.CreateBuild(ctx, store.Build{Image: "debian", Source: store.SourceDIB, Files: []store.File{{Format: "qcow2", Present: true}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := raw.SetBuildState(ctx, &b, store.Ready, ""); err != nil {
		t.Fatal(err)
	}
	u, err := st.CreateUpload(ctx, &b, "cloud-a", "qcow2")
	if err != nil {
		t.Fatal(err)
	}
	u.SetState(store.Ready, st.Now())
	u.ExternalID = "img-1"
	if err := raw.Write(ctx, store.PutUpload(&u)); err != nil {
		t.Fatal(err)
	}
	builderID := st.BuilderID()
	st.Close()

	// With zookeeper-servers added, the state is refused until it is imported.
	cfg := loadTestConfig(t, dir, zkKeys)
	_, err = Open(ctx, cfg, Options{Access: store.Create})
	if !errors.Is(err, config.ErrUnusable) || !strings.Contains(err.Error(), "zookeeper-import") ||
		!strings.Contains(err.Error(), cfg.Builder.StateDB) || !strings.Contains(err.Error(), "1 build and 1 upload") {
		t.Fatalf("open with an unimported SQLite state: %v", err)
	}

	r, err := ImportToZooKeeper(ctx, cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if r.Builds.Copied != 1 || r.Uploads.Copied != 1 || r.BuilderID != builderID || r.To != z.Addr+"/import" || !r.MovedAt.IsZero() {
		t.Errorf("import = %+v", r)
	}
	zst, err := Open(ctx, cfg, Options{Access: store.Create})
	if err != nil {
		t.Fatal(err)
	}
	got, err := zst.Build(ctx, b.ID)
	if err != nil || got.State != store.Ready || got.BuilderID != builderID || zst.BuilderID() != builderID {
		t.Errorf("build in ZooKeeper = %+v, %v; builder id %s, want %s", got, err, zst.BuilderID(), builderID)
	}
	ups, err := zst.Uploads(ctx, store.UploadFilter{})
	if err != nil || len(ups) != 1 || ups[0].ExternalID != "img-1" || ups[0].State != store.Ready {
		t.Errorf("uploads in ZooKeeper = %+v, %v", ups, err)
	}
	zst.Close()

	// A second import copies nothing: the state is marked moved.
	again, err := ImportToZooKeeper(ctx, cfg, Options{})
	if err != nil || again.MovedAt.IsZero() || again.Builds.Copied+again.Uploads.Copied != 0 {
		t.Errorf("second import = %+v, %v", again, err)
	}
	// Going back to SQLite is refused: that state is out of date.
	_, err = Open(ctx, sqlCfg, Options{Access: store.ReadOnly})
	if !errors.Is(err, config.ErrUnusable) || !strings.Contains(err.Error(), "copied to ZooKeeper") {
		t.Errorf("open of the moved SQLite state: %v", err)
	}
}

func TestZooKeeperStateWithoutSQLiteState(t *testing.T) {
	z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{})
	ctx := context.Background()
	dir := t.TempDir()
	zkKeys := fmt.Sprintf("zookeeper-servers:\n  - host: %s\n    port: %d\n    chroot: /fresh\n",
		strings.Split(z.Addr, ":")[0], z.Port)
	cfg := loadTestConfig(t, dir, zkKeys)
	st, err := Open(ctx, cfg, Options{Access: store.Create})
	if err != nil {
		t.Fatalf("a fresh images-dir: %v", err)
	}
	st.Close()
	// An empty SQLite state (a builder that never got to make a record) passes too.
	empty, err := store.Open(ctx, store.Options{ImagesDir: cfg.ImagesDir, DBPath: cfg.Builder.StateDB})
	if err != nil {
		t.Fatal(err)
	}
	empty.Close()
	st, err = Open(ctx, cfg, Options{Access: store.ReadOnly})
	if err != nil {
		t.Fatalf("an empty SQLite state: %v", err)
	}
	st.Close()
	_, err = ImportToZooKeeper(ctx, loadTestConfig(t, dir, ""), Options{})
	if !errors.Is(err, config.ErrUnusable) || !strings.Contains(err.Error(), "no zookeeper-servers") {
		t.Errorf("import without zookeeper-servers: %v", err)
	}
}
