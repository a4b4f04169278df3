package main

import "runtime/debug"

// Set by make build: -ldflags "-X main.buildVersion=$(git describe --tags
// --always --dirty) -X main.buildCommit=$(git rev-parse HEAD)". Nothing
// changes them at run time.
var buildVersion, buildCommit string

// version is the program's version, as the builder registers it in ZooKeeper.
func version() string {
	v, _ := describeBuild(buildVersion, buildCommit, buildInfo())
	return v
}

// versionText is what --version prints after the program's name: the version
// and the commit it was built from.
func versionText() string {
	v, commit := describeBuild(buildVersion, buildCommit, buildInfo())
	if commit == "" {
		return v
	}
	return v + " (commit " + commit + ")"
}

// buildInfo is what Go recorded in the binary; nil when it recorded nothing.
func buildInfo() *debug.BuildInfo {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return nil
	}
	return info
}

// describeBuild composes the version and the commit: the values make build
// stamped, else what Go recorded in the binary (the module version of a go
// install, and a checkout's revision, which go build records by itself).
// commit is the revision's first 12 hex digits, followed by ", modified" when
// the checkout had changes nobody committed; "" when nothing says it.
func describeBuild(stampedVersion, stampedCommit string, info *debug.BuildInfo) (version, commit string) {
	version, commit = stampedVersion, stampedCommit
	modified := false
	if info != nil {
		if version == "" && info.Main.Version != "" && info.Main.Version != "(devel)" {
			version = info.Main.Version
		}
		if commit == "" {
			for _, s := range info.Settings {
				switch s.Key {
				case "vcs.revision":
					commit = s.Value
				case "vcs.modified":
					modified = s.Value == "true"
				}
			}
		}
	}
	switch {
	case version != "":
	case info == nil && commit == "":
		version = "unknown"
	default:
		version = "devel"
	}
	if len(commit) > 12 {
		commit = commit[:12]
	}
	if commit != "" && modified {
		commit += ", modified"
	}
	return version, commit
}
