// Package buildinfo says which build of wlproj is running: the version and
// build date that `make build` and `make deb` stamp with the linker, and the
// commit, dirty flag and Go version the Go toolchain records in the binary.
// The CLI prints it (--version, wlproj version), the replica logs it first
// and exports it as wlproj_build_info, and the console shows it.
package buildinfo

import (
	"cmp"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
)

// Set with -ldflags "-X github.com/wlproj/wlproj/internal/buildinfo.version=…"
// (and revision, dirty, buildDate) by the Makefile. A plain `go build`
// leaves them empty: the version is then the module's (set by `go install
// …@vX`) or "devel", and the commit what the toolchain recorded. The
// Makefile stamps the commit too because the toolchain records none in a
// git worktree, a source tarball or under -buildvcs=false.
var (
	version   string
	revision  string
	dirty     string
	buildDate string
)

const (
	// versionDefault is the version of a build nothing stamped.
	versionDefault = "devel"
	// unknown stands for a commit or date the binary does not carry (built
	// outside a checkout, or with -buildvcs=false).
	unknown = "unknown"
)

// Info is one build's identity. Revision, CommitTime and BuildDate are
// "unknown" when the binary does not carry them.
type Info struct {
	Version    string `json:"version"`
	Revision   string `json:"revision"`
	Dirty      bool   `json:"dirty"`
	CommitTime string `json:"commit_time"`
	GoVersion  string `json:"go_version"`
	BuildDate  string `json:"build_date"`
}

// Get returns the running binary's Info, read once.
var Get = sync.OnceValue(func() Info {
	bi, _ := debug.ReadBuildInfo()
	return read(bi, stamps{version, revision, dirty, buildDate})
})

// stamps are the values the linker set; empty ones were not.
type stamps struct{ version, revision, dirty, buildDate string }

// read is Get without the globals, for tests.
func read(bi *debug.BuildInfo, st stamps) Info {
	info := Info{Version: st.version, GoVersion: runtime.Version(), BuildDate: st.buildDate}
	if bi != nil {
		info.GoVersion = cmp.Or(bi.GoVersion, info.GoVersion)
		if v := bi.Main.Version; info.Version == "" && v != "" && v != "(devel)" {
			info.Version = v
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				info.Revision = s.Value
			case "vcs.modified":
				info.Dirty = s.Value == "true"
			case "vcs.time":
				info.CommitTime = s.Value
			}
		}
	}
	if st.revision != "" {
		info.Revision, info.Dirty = st.revision, st.dirty == "true"
	}
	info.Version = cmp.Or(info.Version, versionDefault)
	info.Revision = cmp.Or(info.Revision, unknown)
	info.CommitTime = cmp.Or(info.CommitTime, unknown)
	info.BuildDate = cmp.Or(info.BuildDate, unknown)
	return info
}

// String is the one line of `wlproj --version`.
func (i Info) String() string {
	return fmt.Sprintf("wlproj %s commit=%s dirty=%t go=%s built=%s", i.Version, i.Revision, i.Dirty, i.GoVersion, i.BuildDate)
}

// ShortRevision is the commit's first 12 characters, for the console.
func (i Info) ShortRevision() string {
	if len(i.Revision) > 12 {
		return i.Revision[:12]
	}
	return i.Revision
}
