package testenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
)

// nodepoolYAML is a small nodepool.yaml: one diskimage, one openstack provider that
// lists it, a label of a pool that boots it. extra is appended at the top level; the
// provider lists providerImage as its diskimage.
func nodepoolYAML(dir, providerImage, extra string) string {
	return fmt.Sprintf(`zookeeper-servers:
  - host: 127.0.0.1
    port: 2281
zookeeper-tls:
  ca: %[1]s/ca.pem
  cert: %[1]s/client.pem
  key: %[1]s/client-key.pem
images-dir: %[1]s/images
build-log-dir: %[1]s/logs
labels:
  - name: debian-small
diskimages:
  - name: debian
    formats: [raw]
    elements: [debian-minimal, vm]
    release: bookworm
    username: debian
    python-path: /usr/bin/python3
providers:
  - name: cloud-a
    cloud: testenv
    diskimages:
      - name: %[2]s
        meta:
          purpose: test
    pools:
      - name: main
        labels:
          - name: debian-small
            diskimage: %[2]s
            min-ram: 1024
%[3]s`, dir, providerImage, extra)
}

// writeFile writes content to name in dir and returns its path.
func writeFile(t *testing.T, dir, name, content string, mode os.FileMode) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	return path
}

// unreachableClouds is a clouds.yaml whose cloud testenv nothing serves: loading a
// config only reads it.
const unreachableClouds = "clouds:\n  testenv:\n    auth_type: none\n    image_endpoint_override: http://127.0.0.1:9/\n"

func TestNodepoolConfig(t *testing.T) {
	RequireNodepool(t)
	dir := t.TempDir()
	env := []string{"OS_CLIENT_CONFIG_FILE=" + writeFile(t, dir, "clouds.yaml", unreachableClouds, 0o644)}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	t.Run("valid", func(t *testing.T) {
		path := writeFile(t, dir, "valid.yaml", nodepoolYAML(dir, "debian", ""), 0o644)
		if log, err := NodepoolConfigValidate(ctx, path, env); err != nil {
			t.Fatalf("config-validate refused a valid file: %v", err)
		} else if !strings.Contains(log, "validating "+path) {
			t.Errorf("config-validate log does not say what it validated:\n%s", log)
		}
		got, err := NodepoolLoadConfig(ctx, path, env)
		if err != nil {
			t.Fatal(err)
		}
		want := NodepoolConfig{
			ZooKeeperServers: "127.0.0.1:2281",
			ZooKeeperTLS:     NodepoolZooKeeperTLS{Cert: dir + "/client.pem", Key: dir + "/client-key.pem", CA: dir + "/ca.pem"},
			Diskimages: map[string]NodepoolDiskimage{"debian": {
				// qcow2 is the image_format openstacksdk gives a cloud that names none;
				// nodepool adds the format of every openstack provider of the image.
				ImageTypes: []string{"qcow2", "raw"},
				Elements:   "debian-minimal vm",
				Release:    "bookworm",
				EnvVars:    map[string]string{},
				Username:   "debian",
				PythonPath: "/usr/bin/python3",
				DibCmd:     "disk-image-create",
				RebuildAge: 24 * 60 * 60, BuildTimeout: 8 * 60 * 60,
			}},
			Labels: map[string]NodepoolLabel{"debian-small": {}},
			Providers: map[string]NodepoolProvider{"cloud-a": {
				Driver:     "openstack",
				ImageType:  "qcow2",
				Diskimages: map[string]NodepoolProviderDiskimage{"debian": {Meta: map[string]any{"purpose": "test"}}},
				Pools:      map[string]NodepoolPool{"main": {Labels: map[string]string{"debian-small": "debian"}}},
			}},
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("loadConfig made\n%+v\nwant\n%+v", got, want)
		}
	})

	t.Run("unknown top-level key", func(t *testing.T) {
		path := writeFile(t, dir, "zuul-images.yaml", nodepoolYAML(dir, "debian", "zuul-images:\n  - name: debian\n"), 0o644)
		log, err := NodepoolConfigValidate(ctx, path, env)
		var npErr *NodepoolError
		if !errors.As(err, &npErr) {
			t.Fatalf("config-validate accepted a top-level key nodepool does not know (err %v):\n%s", err, log)
		}
		if want := "extra keys not allowed @ data['zuul-images']"; !strings.Contains(npErr.Last, want) || !strings.Contains(log, want) {
			t.Errorf("config-validate's refusal does not say %q: %v", want, err)
		}
		// Only the validator is strict: nodepool's daemons load such a file and ignore the key.
		if _, err := NodepoolLoadConfig(ctx, path, env); err != nil {
			t.Errorf("loadConfig refused a file with an unknown top-level key: %v", err)
		}
	})

	t.Run("secure file", func(t *testing.T) {
		path := writeFile(t, dir, "with-secure.yaml", nodepoolYAML(dir, "debian", ""), 0o644)
		secure := writeFile(t, dir, "secure.conf", "zookeeper-servers:\n  - {host: zk.example.com, chroot: /np}\n"+
			"diskimages:\n  - name: debian\n    env-vars: {DIB_PASSWORD: secret}\n", 0o600)
		got, err := NodepoolLoadSecureConfig(ctx, path, secure, env)
		if err != nil {
			t.Fatal(err)
		}
		if got.ZooKeeperServers != "zk.example.com:2281/np" || got.ZooKeeperTLS.CA != dir+"/ca.pem" ||
			!reflect.DeepEqual(got.Diskimages["debian"].EnvVars, map[string]string{"DIB_PASSWORD": "secret"}) {
			t.Errorf("loadSecureConfig made servers %q, tls %+v, debian %+v", got.ZooKeeperServers, got.ZooKeeperTLS, got.Diskimages["debian"])
		}
		unknown := writeFile(t, dir, "unknown.conf", "diskimages:\n  - name: fedora\n    env-vars: {A: b}\n", 0o600)
		_, err = NodepoolLoadSecureConfig(ctx, path, unknown, env)
		var npErr *NodepoolError
		if !errors.As(err, &npErr) || npErr.Last != "Exception: "+unknown+": unknown diskimage fedora" {
			t.Errorf("loadSecureConfig with an unknown diskimage: %v, want nodepool's exception", err)
		}
	})

	t.Run("provider diskimage not at the top level", func(t *testing.T) {
		path := writeFile(t, dir, "missing.yaml", nodepoolYAML(dir, "debian-bookworm", ""), 0o644)
		_, err := NodepoolLoadConfig(ctx, path, env)
		var npErr *NodepoolError
		if !errors.As(err, &npErr) {
			t.Fatalf("loadConfig accepted a provider diskimage that is not a top-level diskimage (err %v)", err)
		}
		if want := "KeyError: 'debian-bookworm'"; npErr.Last != want {
			t.Errorf("loadConfig failed with %q, want %q\n%s", npErr.Last, want, npErr.Output)
		}
		if !strings.Contains(npErr.Output, "Traceback (most recent call last):") {
			t.Errorf("error output is not the traceback:\n%s", npErr.Output)
		}
		log, err := NodepoolConfigValidate(ctx, path, env)
		if want := "diskimage debian-bookworm in provider cloud-a is not defined in the main diskimages list"; err == nil || !strings.Contains(log, want) {
			t.Errorf("config-validate (err %v) did not say %q:\n%s", err, want, log)
		}
	})
}

// fakeDIB stands in for disk-image-create with the command line nodepool-builder
// gives DIB: -x -t fmt[,fmt] --checksum --no-tmpfs [--qemu-img-options opts]
// -o path elements... It writes path.fmt for each format with the md5sum and
// sha256sum sidecars that --checksum makes.
const fakeDIB = `#!/bin/sh
set -eu
fmts= out= opts=
while [ $# -gt 0 ]; do
	case $1 in
	-t) fmts=$2; shift ;;
	-o) out=$2; shift ;;
	--qemu-img-options) opts=$2; shift ;;
	-x|--checksum|--no-tmpfs) ;;
	-*) echo "unexpected option $1" >&2; exit 2 ;;
	*) echo "element $1" ;;
	esac
	shift
done
[ -n "$fmts" ] && [ -n "$out" ] || { echo "no -t or -o" >&2; exit 2; }
for fmt in $(echo "$fmts" | tr , ' '); do
	case $fmt in
	qcow2) qemu-img create -q -f qcow2 ${opts:+-o "$opts"} "$out.qcow2" 16M ;;
	raw) truncate -s 16M "$out.raw" ;;
	*) echo "cannot make $fmt" >&2; exit 2 ;;
	esac
	md5sum "$out.$fmt" >"$out.$fmt.md5"
	sha256sum "$out.$fmt" >"$out.$fmt.sha256"
done
echo "built $out ($fmts)"
`

// readyUploads prints, as JSON, every upload of an image to a provider that
// ZooKeeper holds as ready, with the path of its znode.
const readyUploads = `import json
image, provider = sys.argv[1], sys.argv[2]
root = "/nodepool/images/%s/builds" % image
found = []
for build in (zk.get_children(root) if zk.exists(root) else []):
    images = "%s/%s/providers/%s/images" % (root, build, provider)
    for seq in (zk.get_children(images) if zk.exists(images) else []):
        if seq == "lock":
            continue
        data, _ = zk.get("%s/%s" % (images, seq))
        upload = json.loads(data) if data else {}
        if upload.get("state") == "ready":
            upload["path"] = "%s/%s" % (images, seq)
            found.append(upload)
print(json.dumps(found))
`

// TestNodepoolBuilderUploads runs nodepool's own builder on a TLS ZooKeeper with a
// stand-in DIB and a standalone Glance: it builds the image and uploads it.
func TestNodepoolBuilderUploads(t *testing.T) {
	RequireNodepool(t)
	RequireKazoo(t)
	RequireBinary(t, "qemu-img")
	start := time.Now()
	z := NewZooKeeper(t, ZooKeeperOptions{TLS: true})
	g := NewGlance(t)
	dir := t.TempDir()
	for _, sub := range []string{"images", "logs"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	dib := writeFile(t, dir, "fake-dib", fakeDIB, 0o755)
	config := writeFile(t, dir, "nodepool.yaml", fmt.Sprintf(`zookeeper-servers:
  - host: 127.0.0.1
    port: %d
zookeeper-tls:
  ca: %s
  cert: %s
  key: %s
images-dir: %[5]s/images
build-log-dir: %[5]s/logs
labels:
  - name: debian-small
diskimages:
  - name: debian
    dib-cmd: %[6]s
    elements: [debian-minimal, vm]
providers:
  - name: cloud-a
    cloud: %[7]s
    diskimages:
      - name: debian
        meta:
          purpose: test
    pools:
      - name: main
        labels:
          - name: debian-small
            diskimage: debian
`, z.Port, z.CA, z.ClientCert, z.ClientKey, dir, dib, g.Cloud), 0o644)
	t.Logf("zookeeper and glance up after %s", time.Since(start))

	b := StartNodepoolBuilder(t, NodepoolBuilderOptions{
		Config: config,
		Env:    []string{"OS_CLIENT_CONFIG_FILE=" + g.CloudsFile},
	})
	b.WaitLog(t, regexp.MustCompile(`DIB image debian is built`), time.Minute)
	t.Logf("built after %s", time.Since(start))
	ready := b.WaitLog(t, regexp.MustCompile(`Image build debian-[0-9a-f]+ \(external_id \S+\) in cloud-a is ready`), 2*time.Minute)
	t.Logf("uploaded after %s: %s", time.Since(start), ready)

	var uploads []struct {
		Path       string `json:"path"`
		ExternalID string `json:"external_id"`
		Format     string `json:"format"`
	}
	WaitFor(t, 30*time.Second, "a ready upload in ZooKeeper", func() bool {
		if err := json.Unmarshal([]byte(z.Kazoo(t, readyUploads, "debian", "cloud-a")), &uploads); err != nil {
			t.Fatal(err)
		}
		return len(uploads) > 0
	}, b.Log)
	up := uploads[0]
	if up.ExternalID == "" || up.Format != "qcow2" || !strings.Contains(ready, "(external_id "+up.ExternalID+")") {
		t.Errorf("ready upload %+v, want a qcow2 with the external_id of %q", up, ready)
	}
	t.Logf("%s: %+v", up.Path, up)
	// /nodepool/images/debian/builds/<build>/providers/cloud-a/images/<upload>
	parts := strings.Split(up.Path, "/")
	buildID, uploadID := parts[5], parts[9]

	resp, err := http.Get(g.Endpoint + "/v2/images/" + up.ExternalID)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	type glanceImage struct {
		Status     string `json:"status"`
		DiskFormat string `json:"disk_format"`
		Checksum   string `json:"checksum"`
		SHA256     string `json:"owner_specified.openstack.sha256"`
		Purpose    string `json:"purpose"`
		BuildID    string `json:"nodepool_build_id"`
		UploadID   string `json:"nodepool_upload_id"`
	}
	var image glanceImage
	if err := json.NewDecoder(resp.Body).Decode(&image); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET image %s: HTTP %d, %v", up.ExternalID, resp.StatusCode, err)
	}
	file := filepath.Join(dir, "images", "debian-"+buildID+".qcow2")
	want := glanceImage{Status: "active", DiskFormat: "qcow2",
		Checksum: ToolSum(t, "md5sum", file), SHA256: ToolSum(t, "sha256sum", file),
		Purpose: "test", BuildID: buildID, UploadID: uploadID}
	if image != want {
		t.Errorf("glance has %+v\nwant %+v", image, want)
	}
	if tbs := b.Tracebacks(); len(tbs) > 0 {
		t.Errorf("nodepool-builder logged %d tracebacks:\n%s", len(tbs), strings.Join(tbs, "\n\n"))
	}

	// SIGINT takes nodepool-builder's own way out, which closes its ZooKeeper
	// session: its registration is gone at once.
	b.Stop(t)
	if !strings.Contains(b.Log(), "Finished stopping") {
		t.Errorf("nodepool-builder did not finish stopping:\n%s", logTail(b.LogFile))
	}
	if left := z.Kazoo(t, "print(zk.get_children('/nodepool/components/builder'))"); left != "[]\n" {
		t.Errorf("builder components left after stop: %s", left)
	}
	t.Logf("done after %s", time.Since(start))
}

func TestNodepoolTracebacks(t *testing.T) {
	log := `2024-09-17 10:00:00,001 INFO nodepool.builder.BuildWorker.0: Building image debian
2024-09-17 10:00:01,002 ERROR nodepool.builder.UploadWorker.0: Failed to upload build 1 of image debian to provider cloud-a
2024-09-17 10:00:01,002 ERROR nodepool.builder.UploadWorker.0:   Traceback (most recent call last):
2024-09-17 10:00:01,002 ERROR nodepool.builder.UploadWorker.0:     File "x.py", line 1, in f
2024-09-17 10:00:01,002 ERROR nodepool.builder.UploadWorker.0:       g()
2024-09-17 10:00:01,002 ERROR nodepool.builder.UploadWorker.0:   KeyError: 'debian'
2024-09-17 10:00:01,003 INFO nodepool.builder.UploadWorker.0: next
Exception in thread Thread-1:
Traceback (most recent call last):
  File "y.py", line 2, in run
    h()
RuntimeError: boom
after
`
	got := tracebacks(log)
	want := []string{
		`2024-09-17 10:00:01,002 ERROR nodepool.builder.UploadWorker.0:   Traceback (most recent call last):
2024-09-17 10:00:01,002 ERROR nodepool.builder.UploadWorker.0:     File "x.py", line 1, in f
2024-09-17 10:00:01,002 ERROR nodepool.builder.UploadWorker.0:       g()
2024-09-17 10:00:01,002 ERROR nodepool.builder.UploadWorker.0:   KeyError: 'debian'`,
		`Traceback (most recent call last):
  File "y.py", line 2, in run
    h()
RuntimeError: boom`,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("tracebacks =\n%q\nwant\n%q", got, want)
	}
}
