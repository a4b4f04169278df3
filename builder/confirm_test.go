package builder

import (
	"slices"
	"strings"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/config"
)

// confirmNodepool is a nodepool.yaml declaring the zuul-image debian, with a
// provider that checks its uploads with a hook.
const confirmNodepool = `images-dir: /var/lib/nodepool/images
diskimages:
  - name: debian
    pause: true
providers:
  - name: cloud-a
    cloud: cloud-a
    post-upload-hook: /usr/local/bin/check-image
    diskimages:
      - name: debian
`

// confirmOwn is the builder's own file beside it, zuul-images first, as
// files written before builder came first have it.
const confirmOwn = `zuul-images:
  - name: debian
    api-url: https://zuul.example.com/
    tenant: example
    project: org/images
    branch: master
    pipelines: [periodic, post]
    job: build-debian
    auth-token-file: /etc/nodepool/zuul.token
    artifact-hosts: [zuul.example.com]
builder:
  keep-builds: 5
  build-diskimages: false
  leak-sweep: false
  gearman-servers:
    - host: gearman.example.com
  gearman-functions: [image-build]
`

// TestToConfirm: a change of the builder's own settings, wherever they are
// read from, is never applied by a file change alone; nor is a
// post-upload-hook taken away. Edits of nodepool.yaml's other keys and of the
// secure file are, and moving the settings unchanged from one file to the
// other is no change.
func TestToConfirm(t *testing.T) {
	parse := func(t *testing.T, nodepool string, own, secure *string) *config.Config {
		t.Helper()
		var o, s *config.Text
		if own != nil {
			o = &config.Text{Name: "nodepool-builder.yaml", Data: []byte(*own)}
		}
		if secure != nil {
			s = &config.Text{Name: "secure.conf", Data: []byte(*secure)}
		}
		cfg, err := config.ParseFiles(config.Text{Name: "nodepool.yaml", Data: []byte(nodepool)}, o, s, func(string) (string, bool) { return "", false })
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	own := func(s string) *string { return &s }
	cut := func(text, at string) string { return text[:strings.Index(text, at)] }
	secure := own("diskimages:\n  - name: debian\n    env-vars: {DIB_SECRET: one}\n")
	running := parse(t, confirmNodepool, own(confirmOwn), secure)
	// The one-file config: the builder's settings in nodepool.yaml.
	oneFile := confirmNodepool + confirmOwn
	for _, c := range []struct {
		name             string
		nodepool         string
		own, secure      *string
		changes, dropped []string
	}{
		{name: "unchanged", nodepool: confirmNodepool, own: own(confirmOwn), secure: secure},
		{name: "comments and layout", nodepool: confirmNodepool, secure: secure,
			own: own("# the builder's own\n" + strings.ReplaceAll(confirmOwn, "[periodic, post]", "\n      - periodic\n      - post"))},
		{name: "builder cut off", nodepool: confirmNodepool, own: own(cut(confirmOwn, "builder:")), secure: secure,
			changes: []string{"builder.build-diskimages", "builder.gearman-functions", "builder.gearman-servers",
				"builder.keep-builds", "builder.leak-sweep"}},
		{name: "a zuul-image cut after job", nodepool: confirmNodepool, own: own(cut(confirmOwn, "    auth-token-file:")), secure: secure,
			changes: []string{"zuul-images[debian].artifact-hosts", "zuul-images[debian].auth-token-file",
				"builder.build-diskimages", "builder.gearman-functions", "builder.gearman-servers", "builder.keep-builds",
				"builder.leak-sweep"}},
		{name: "one key edited", nodepool: confirmNodepool, own: own(strings.Replace(confirmOwn, "keep-builds: 5", "keep-builds: 6", 1)),
			secure: secure, changes: []string{"builder.keep-builds"}},
		{name: "a default written out", nodepool: confirmNodepool, own: own(confirmOwn + "  keep-uploads: 2\n"), secure: secure,
			changes: []string{"builder.keep-uploads"}},
		// Without its file the zuul-image is nodepool.yaml's paused
		// declaration: its uploads stay, but every setting changes.
		{name: "the builder's file removed", nodepool: confirmNodepool, secure: secure,
			changes: []string{"zuul-images[debian]", "builder.build-diskimages", "builder.gearman-functions",
				"builder.gearman-servers", "builder.keep-builds", "builder.leak-sweep"}},
		{name: "a zuul-image added", nodepool: strings.Replace(confirmNodepool, "providers:", "  - name: ubuntu\n    pause: true\nproviders:", 1),
			own: own(strings.Replace(confirmOwn, "builder:", "  - name: ubuntu\n    api-url: https://zuul.example.com/\n"+
				"    tenant: example\n    project: org/images\n    job: build-ubuntu\nbuilder:", 1)),
			secure: secure, changes: []string{"zuul-images[ubuntu]"}},
		{name: "the settings moved into nodepool.yaml unchanged", nodepool: oneFile, secure: secure},
		{name: "a provider's hook taken away", nodepool: strings.Replace(confirmNodepool, "    post-upload-hook: /usr/local/bin/check-image\n", "", 1),
			own: own(confirmOwn), secure: secure, changes: []string{"providers[cloud-a].post-upload-hook"}},
		{name: "a provider's hook changed", nodepool: strings.Replace(confirmNodepool, "check-image", "check-image-v2", 1),
			own: own(confirmOwn), secure: secure},
		{name: "nodepool.yaml edited", nodepool: confirmNodepool + "  - name: cloud-b\n    cloud: cloud-b\n    rate: 2.0\n    diskimages:\n      - name: debian\n",
			own: own(confirmOwn), secure: secure},
		{name: "the secure file edited", nodepool: confirmNodepool, own: own(confirmOwn),
			secure: own("diskimages:\n  - name: debian\n    env-vars: {DIB_SECRET: two}\n")},
		{name: "the provider cut off", nodepool: cut(confirmNodepool, "providers:"), own: own(confirmOwn), secure: secure,
			dropped: []string{"provider cloud-a: every upload (it is no longer in the config)", "image debian: every upload (no provider lists it)"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := toConfirm(running, parse(t, c.nodepool, c.own, c.secure))
			if !slices.Equal(got.changes, c.changes) || !slices.Equal(got.drops, c.dropped) {
				t.Errorf("toConfirm: changes %q, drops %q\nwant changes %q, drops %q", got.changes, got.drops, c.changes, c.dropped)
			}
			for _, key := range got.changes {
				if strings.ContainsAny(key, "/:") {
					t.Errorf("change %q names a value of the files, not a key", key)
				}
			}
			if got.none() != (len(c.changes)+len(c.dropped) == 0) {
				t.Errorf("none() = %v with changes %q and drops %q", got.none(), got.changes, got.drops)
			}
		})
	}

	// In a one-file config, the settings in nodepool.yaml are held alike.
	one := parse(t, oneFile, nil, secure)
	if got := toConfirm(one, parse(t, cut(oneFile, "builder:"), nil, secure)); len(got.changes) != 5 {
		t.Errorf("builder cut off a one-file config: changes %q, want the 5 keys of builder", got.changes)
	}
}

// TestHeldSaysWhatWouldChange: the held change's message names the log
// attributes it has, the keys changed and what would be released.
func TestHeldSaysWhatWouldChange(t *testing.T) {
	h := heldError{confirmation{changes: []string{"zuul-images[debian].auth-token-file"}, drops: []string{"image debian: every upload"}}}
	msg := h.Error()
	for _, want := range []string{"config change held", "changes", "drops"} {
		if !strings.Contains(msg, want) {
			t.Errorf("%q does not say %q", msg, want)
		}
	}
	if got := h.attrs(); len(got) != 4 || got[0] != "changes" || got[2] != "drops" {
		t.Errorf("attrs = %v", got)
	}
	if only := (heldError{confirmation{changes: []string{"builder.keep-builds"}}}); strings.Contains(only.Error(), "release") || len(only.attrs()) != 2 {
		t.Errorf("a change that releases nothing: %q, %v", only.Error(), only.attrs())
	}
}
