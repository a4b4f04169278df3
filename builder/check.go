package builder

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/dib"
	"github.com/nodepool-builder/nodepool-builder/state"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/uploader/openstack"
	"github.com/nodepool-builder/nodepool-builder/zuulapi"
	"github.com/nodepool-builder/nodepool-builder/zuulmqtt"
)

// CheckError is what Check found wrong: every problem, each saying what it is
// about and what to do. It wraps config.ErrUnusable and each problem.
type CheckError struct {
	Path     string // the config file
	Problems []error
}

func (e *CheckError) Error() string {
	if len(e.Problems) == 1 {
		return fmt.Sprintf("%s cannot be used on this host: %v", e.Path, e.Problems[0])
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s cannot be used on this host (%d problems):", e.Path, len(e.Problems))
	for _, p := range e.Problems {
		b.WriteString("\n- ")
		b.WriteString(p.Error())
	}
	return b.String()
}

func (e *CheckError) Unwrap() []error { return append([]error{config.ErrUnusable}, e.Problems...) }

// Check finds what would stop the builder from running cfg on this host, before
// anything runs: an images-dir that is not set, that this user cannot create or
// write in, or that another builder used (see store.Options.TakeOver); a
// build-log-dir it cannot write (when there are diskimages to build); when it
// builds diskimages, a diskimage-builder that cannot become root (see
// dib.CheckRoot); no clouds.yaml or a provider's cloud missing from it or
// unusable, a zuul-image's api-url or ca-cert, zookeeper-tls files that do not
// load, and the files builder.zuul-mqtt names (ca-cert, client-cert and
// client-key, password-file) that do not read. It reports every problem it
// finds, as a *CheckError. It only reads: it touches no network, takes no lock
// and creates nothing (sudo -n true aside). config-validate runs it, and so does
// the builder before its first step, so both say the same.
//
// The warnings are the config's own (Config.Warnings: a layout nodepool's
// tools refuse), then what works but puts a credential at risk: a Zuul token or
// an api-url's password, or a cloud's login, sent over plain http, a cloud
// that checks no TLS certificate, and the MQTT broker's password sent over
// plain mqtt://; a cloud's key that openstacksdk follows and the builder
// ignores (image_api_use_tasks); each names its zuul-image, provider or
// section; and a file
// holding a secret that other users may read (secretFileWarnings). The
// builder logs them when it opens the Zuul clients and the clouds, at start
// and on every reload, and when it starts listening to the broker.
func Check(ctx context.Context, cfg *config.Config) (warnings []string, err error) {
	problems := append(checkDirs(cfg), checkRoot(ctx, cfg)...)
	cloudProblems, cloudWarnings := checkClouds(ctx, cfg)
	problems = append(problems, cloudProblems...)
	warnings = append(slices.Clone(cfg.Warnings), cloudWarnings...)
	for _, zi := range cfg.ZuulImages {
		// Making the client checks the api-url and reads the ca-cert.
		c, err := zuulapi.New(zuulapi.Options{APIURL: zi.APIURL, Tenant: zi.Tenant, TokenFile: zi.AuthTokenFile, CACertFile: zi.CACert})
		if err != nil {
			problems = append(problems, fmt.Errorf("zuul-image %s: %w", zi.Name, err))
			continue
		}
		for _, w := range c.Warnings() {
			warnings = append(warnings, "zuul-image "+zi.Name+": "+w)
		}
	}
	problems = append(problems, checkZooKeeperTLS(cfg)...)
	warnings = append(warnings, secretFileWarnings(cfg)...)
	if z := cfg.Builder.ZuulMQTT; z != nil {
		// Making the listener reads its files; it connects to nothing.
		l, err := zuulmqtt.New(*z, zuulmqtt.Options{Images: func() []config.ZuulImage { return nil }, Hint: func(string) {}})
		if err != nil {
			problems = append(problems, fmt.Errorf("builder.%w", err))
		} else {
			for _, w := range l.Warnings() {
				warnings = append(warnings, "builder."+w)
			}
		}
	}
	if len(problems) == 0 {
		return warnings, nil
	}
	return warnings, &CheckError{Path: cfg.Path, Problems: problems}
}

// checkHost finds what Check finds that assembling the config does not: the
// images-dir, the build-log-dir, diskimage-builder's way to root and the
// zookeeper-tls files. A reload asks it too, before it assembles the new config.
func checkHost(ctx context.Context, cfg *config.Config) []error {
	problems := append(checkDirs(cfg), checkRoot(ctx, cfg)...)
	return append(problems, checkZooKeeperTLS(cfg)...)
}

// checkDirs checks the images-dir and, when there are diskimages to build, the
// build-log-dir.
func checkDirs(cfg *config.Config) []error {
	var problems []error
	add := func(err error) {
		if err != nil {
			problems = append(problems, err)
		}
	}
	if cfg.ImagesDir == "" {
		add(errors.New("images-dir is not set; the builder needs a directory for image files and its state"))
	} else {
		db := cfg.Builder.StateDB
		if cfg.ZooKeeper != nil {
			db = "" // the state is in ZooKeeper
		}
		add(store.CheckImagesDir(cfg.ImagesDir, db))
		add(store.CheckClaim(cfg.ImagesDir, db))
	}
	if len(cfg.DiskImages) > 0 && !cfg.Builder.LeaveDiskImages {
		add(store.CheckWritable("build-log-dir", cfg.BuildLogDir))
	}
	return problems
}

// checkRoot checks, when this builder builds diskimages (one not paused in
// the config, and build-diskimages on), that diskimage-builder can become root
// through sudo: otherwise every build would fail, each after its wait.
func checkRoot(ctx context.Context, cfg *config.Config) []error {
	if cfg.Builder.LeaveDiskImages || !slices.ContainsFunc(cfg.DiskImages, func(d config.DiskImage) bool { return !d.Pause }) {
		return nil
	}
	if err := dib.CheckRoot(ctx); err != nil {
		return []error{err}
	}
	return nil
}

// checkZooKeeperTLS loads the zookeeper-tls files.
func checkZooKeeperTLS(cfg *config.Config) []error {
	if zc := cfg.ZooKeeper; zc != nil && zc.TLS != nil {
		if _, err := state.ZooKeeperTLS(zc.TLS); err != nil {
			return []error{fmt.Errorf("zookeeper-tls: %w", err)}
		}
	}
	return nil
}

// checkClouds opens every provider's cloud from clouds.yaml, as the builder
// does; opening reads the file and logs in to nothing. Without a clouds.yaml
// the providers share one problem. It returns the clouds' warnings too.
func checkClouds(ctx context.Context, cfg *config.Config) (problems []error, warnings []string) {
	if len(cfg.Providers) == 0 {
		return nil, nil
	}
	if _, err := openstack.CloudsFile(); err != nil {
		names := make([]string, 0, len(cfg.Providers))
		for _, p := range cfg.Providers {
			names = append(names, p.Name)
		}
		need := "provider " + names[0] + " needs"
		if len(names) > 1 {
			need = "providers " + strings.Join(names, ", ") + " need"
		}
		return []error{fmt.Errorf("%s a clouds.yaml: %w", need, err)}, nil
	}
	for _, p := range cfg.Providers {
		c, err := openstack.Open(ctx, openstack.Options{Cloud: p.Cloud, Region: p.RegionName})
		if err != nil {
			problems = append(problems, fmt.Errorf("provider %s: %w", p.Name, err))
			continue
		}
		for _, w := range c.Warnings() {
			warnings = append(warnings, "provider "+p.Name+" (cloud "+p.Cloud+"): "+w)
		}
	}
	return problems, warnings
}

// secretFileWarnings names each file holding a secret (nodepool's secure
// file, clouds.yaml and the secure.yaml merged over it, a Zuul
// auth-token-file, the zookeeper-tls key, builder.zuul-mqtt's password-file
// and client-key) that users other than the builder's may read, with the chmod that stops them; a file several
// zuul-images share is named once. A file that does not read is left to the
// checks that load it.
func secretFileWarnings(cfg *config.Config) []string {
	type secret struct{ what, path string }
	files := []secret{{"the secure file", cfg.SecurePath}}
	if len(cfg.Providers) > 0 {
		if path, err := openstack.CloudsFile(); err == nil {
			files = append(files, secret{"clouds.yaml", path}, secret{"clouds.yaml's secure.yaml", openstack.SecureFile(path)})
		}
	}
	for _, zi := range cfg.ZuulImages {
		files = append(files, secret{"auth-token-file", zi.AuthTokenFile})
	}
	if zc := cfg.ZooKeeper; zc != nil && zc.TLS != nil {
		files = append(files, secret{"zookeeper-tls key", zc.TLS.Key})
	}
	if z := cfg.Builder.ZuulMQTT; z != nil {
		files = append(files, secret{"builder.zuul-mqtt password-file", z.PasswordFile}, secret{"builder.zuul-mqtt client-key", z.ClientKey})
	}
	var warnings []string
	seen := map[string]bool{}
	for _, f := range files {
		if f.path == "" || seen[f.path] {
			continue
		}
		seen[f.path] = true
		if open := openToOthers(f.path); open != "" {
			warnings = append(warnings, f.what+" "+f.path+" "+open)
		}
	}
	return warnings
}

// openToOthers says who besides the builder's user may read the file at path,
// and how to stop them; "" when no one. A file of another user (root's, say)
// that its group may read is how the builder reads it, and is taken.
func openToOthers(path string) string {
	fi, err := os.Stat(path)
	if err != nil {
		return ""
	}
	mode := fi.Mode().Perm()
	owned := true
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		owned = int(st.Uid) == os.Geteuid()
	}
	var who string
	switch {
	case mode&0o004 != 0:
		who = "every user of the host"
	case mode&0o040 != 0 && owned:
		who = "its group"
	default:
		return ""
	}
	fix := "chmod 600 " + path
	if !owned {
		fix = "give it to the builder's user and " + fix
	}
	return fmt.Sprintf("can be read by %s (mode %04o): %s", who, mode, fix)
}
