package dib

import (
	"slices"
	"strings"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/config"
)

func TestCommand(t *testing.T) {
	base := []string{"PATH=/usr/bin", "DIB_RELEASE=from-host", "HOME=/root"}
	tests := []struct {
		name        string
		img         config.DiskImage
		formats     []string
		elementsDir string
		wantArgs    []string
		wantEnv     map[string]string // "" means: must be absent
	}{
		{
			name:        "qcow2 and raw with release and elements-dir",
			img:         config.DiskImage{Name: "debian", DIBCmd: "disk-image-create", Elements: []string{"debian-minimal", "vm"}, Release: "bookworm"},
			formats:     []string{"qcow2", "raw"},
			elementsDir: "/etc/nodepool/elements",
			wantArgs: []string{"disk-image-create", "-x", "-t", "qcow2,raw", "--checksum", "--no-tmpfs",
				"--qemu-img-options", "compat=0.10", "-o", "/images/debian-abc", "debian-minimal", "vm"},
			wantEnv: map[string]string{
				"DIB_RELEASE": "bookworm", "DIB_IMAGE_NAME": "debian", "DIB_IMAGE_FILENAME": "/images/debian-abc",
				"ELEMENTS_PATH": "/etc/nodepool/elements", "PATH": "/usr/bin", "HOME": "/root",
			},
		},
		{
			name:     "no qcow2: no qemu-img options; no release keeps the host's; no elements-dir",
			img:      config.DiskImage{Name: "debian", DIBCmd: "disk-image-create", Elements: []string{"debian-minimal"}},
			formats:  []string{"tar"},
			wantArgs: []string{"disk-image-create", "-x", "-t", "tar", "--checksum", "--no-tmpfs", "-o", "/images/debian-abc", "debian-minimal"},
			wantEnv:  map[string]string{"DIB_RELEASE": "from-host", "ELEMENTS_PATH": ""},
		},
		{
			name:     "dib-cmd with arguments and quoting; env-vars win over what nodepool sets",
			img:      config.DiskImage{Name: "debian", DIBCmd: `sudo -E '/opt/my dib/disk-image-create'`, Elements: []string{"e"}, EnvVars: map[string]string{"DIB_IMAGE_NAME": "override", "TMPDIR": "/var/tmp"}},
			formats:  []string{"vhd"},
			wantArgs: []string{"sudo", "-E", "/opt/my dib/disk-image-create", "-x", "-t", "vhd", "--checksum", "--no-tmpfs", "-o", "/images/debian-abc", "e"},
			wantEnv:  map[string]string{"DIB_IMAGE_NAME": "override", "TMPDIR": "/var/tmp"},
		},
		{
			name:     "empty dib-cmd is nodepool's default",
			img:      config.DiskImage{Name: "debian", Elements: []string{"e"}},
			formats:  []string{"qcow2"},
			wantArgs: []string{"disk-image-create", "-x", "-t", "qcow2", "--checksum", "--no-tmpfs", "--qemu-img-options", "compat=0.10", "-o", "/images/debian-abc", "e"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inv, err := command(&tt.img, tt.formats, "/images/debian-abc", tt.elementsDir, base)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(inv.Args, tt.wantArgs) {
				t.Errorf("args\n got %q\nwant %q", inv.Args, tt.wantArgs)
			}
			env := map[string]string{}
			for _, kv := range inv.Env {
				k, v, _ := strings.Cut(kv, "=")
				if _, dup := env[k]; dup {
					t.Errorf("%s appears twice in the environment", k)
				}
				env[k] = v
			}
			for k, want := range tt.wantEnv {
				got, ok := env[k]
				if want == "" && ok {
					t.Errorf("%s=%q is set, want it absent", k, got)
				} else if want != "" && got != want {
					t.Errorf("%s=%q, want %q", k, got, want)
				}
			}
		})
	}
}

func TestCommandBadDIBCmd(t *testing.T) {
	for _, cmd := range []string{`disk-image-create 'unterminated`, `   `} {
		img := config.DiskImage{Name: "x", DIBCmd: cmd, Elements: []string{"e"}}
		if _, err := command(&img, []string{"qcow2"}, "/o", "", nil); err == nil {
			t.Errorf("dib-cmd %q: no error", cmd)
		}
	}
}

func TestSplitCommand(t *testing.T) {
	tests := []struct {
		in   string
		want []string
		bad  bool
	}{
		{in: "disk-image-create", want: []string{"disk-image-create"}},
		{in: "  a   b\tc  ", want: []string{"a", "b", "c"}},
		{in: `'/opt/my dib/dic' -v`, want: []string{"/opt/my dib/dic", "-v"}},
		{in: `"a \"b\" \$c \x" d`, want: []string{`a "b" $c \x`, "d"}},
		{in: `a\ b c`, want: []string{"a b", "c"}},
		{in: `pre'fix 'post`, want: []string{"prefix post"}},
		{in: `''`, want: []string{""}},
		{in: `a 'b`, bad: true},
		{in: `a "b`, bad: true},
		{in: "", want: nil},
	}
	for _, tt := range tests {
		got, err := splitCommand(tt.in)
		if tt.bad {
			if err == nil {
				t.Errorf("splitCommand(%q) = %q, want an error", tt.in, got)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("splitCommand(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

func TestQuoteCommandRoundTrips(t *testing.T) {
	argv := []string{"disk-image-create", "-o", "/images/x y", "it's", "", "a=b,c"}
	got, err := splitCommand(quoteCommand(argv))
	if err != nil || !slices.Equal(got, argv) {
		t.Fatalf("split(quote(%q)) = %q, %v", argv, got, err)
	}
}

func TestFileSuffix(t *testing.T) {
	for format, want := range map[string]string{"qcow2": "qcow2", "raw": "raw", "vhd": "vhd", "tar": "tar", "squashfs": "squash"} {
		if got := fileSuffix(format); got != want {
			t.Errorf("fileSuffix(%s) = %s, want %s", format, got, want)
		}
	}
}

// TestCommandDropsDaemonCredentials: disk-image-create gets the daemon's
// environment but its OS_* variables, where a cloud's password or token is
// given, and its NODEPOOL_* variables, where the configs' substitution takes
// secrets from; a diskimage's env-vars that set one still win. The names held
// back, and only those, are told for the build log.
func TestCommandDropsDaemonCredentials(t *testing.T) {
	environ := []string{"PATH=/usr/bin", "HOME=/root", "DIB_DEBIAN_COMPONENTS=main",
		"OS_PASSWORD=hunter2", "OS_TOKEN=tok", "OS_APPLICATION_CREDENTIAL_SECRET=acs", "OS_CLIENT_SECRET=cs",
		"OS_AUTH_URL=https://keystone.example.com/v3", "OS_CLOUD=c1", "OS_USERNAME=ci",
		"NODEPOOL_REPO_PASSWORD=repo-secret", "NODEPOOL_ZK_CHROOT=/nodepool", "NODEPOOL_SCRIPTDIR=/host/scripts"}
	img := config.DiskImage{Name: "debian", Elements: []string{"e"}, EnvVars: map[string]string{
		"OS_USERNAME": "element-user", "DIB_X": "1", "NODEPOOL_SCRIPTDIR": "/etc/nodepool/scripts"}}
	inv, err := command(&img, []string{"qcow2"}, "/images/debian-abc", "", environ)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, kv := range inv.Env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	for k, want := range map[string]string{"PATH": "/usr/bin", "HOME": "/root", "DIB_DEBIAN_COMPONENTS": "main",
		"DIB_X": "1", "OS_USERNAME": "element-user", "NODEPOOL_SCRIPTDIR": "/etc/nodepool/scripts", "DIB_IMAGE_NAME": "debian"} {
		if env[k] != want {
			t.Errorf("%s=%q, want %q", k, env[k], want)
		}
	}
	held := []string{"NODEPOOL_REPO_PASSWORD", "NODEPOOL_ZK_CHROOT", "OS_APPLICATION_CREDENTIAL_SECRET", "OS_AUTH_URL",
		"OS_CLIENT_SECRET", "OS_CLOUD", "OS_PASSWORD", "OS_TOKEN"}
	for _, k := range held {
		if v, ok := env[k]; ok {
			t.Errorf("disk-image-create gets %s=%s", k, v)
		}
	}
	if !slices.Equal(inv.Held, held) {
		t.Errorf("held back %q, want %q", inv.Held, held)
	}
}
