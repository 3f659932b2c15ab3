package buildinfo

import (
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestReadTakesTheStampsThenTheToolchainsRecord(t *testing.T) {
	t.Parallel()
	bi := &debug.BuildInfo{GoVersion: "go1.99.1", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "0123456789abcdef0123"},
		{Key: "vcs.modified", Value: "true"},
		{Key: "vcs.time", Value: "2026-11-01T10:00:00Z"},
	}}
	got := read(bi, stamps{version: "1.2.3", buildDate: "2026-11-02T00:00:00Z"})
	require.Equal(t, Info{Version: "1.2.3", Revision: "0123456789abcdef0123", Dirty: true,
		CommitTime: "2026-11-01T10:00:00Z", GoVersion: "go1.99.1", BuildDate: "2026-11-02T00:00:00Z"}, got)
	require.Equal(t, "wlproj 1.2.3 commit=0123456789abcdef0123 dirty=true go=go1.99.1 built=2026-11-02T00:00:00Z", got.String())
	require.Equal(t, "0123456789ab", got.ShortRevision())

	// Nothing stamped: `go install …@v1.4.0` records the module's version;
	// a checkout build with -buildvcs=false records neither commit nor date.
	got = read(&debug.BuildInfo{GoVersion: "go1.99.1", Main: debug.Module{Version: "v1.4.0"}}, stamps{})
	require.Equal(t, Info{Version: "v1.4.0", Revision: "unknown", CommitTime: "unknown", GoVersion: "go1.99.1", BuildDate: "unknown"}, got)
	got = read(&debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, stamps{})
	require.Equal(t, "devel", got.Version)
	require.NotEmpty(t, got.GoVersion, "the running toolchain's version when the build info has none")

	// The Makefile's commit wins over the toolchain's: both come from git,
	// and only the Makefile's is there in a worktree.
	got = read(bi, stamps{revision: "fedcba", dirty: "false"})
	require.Equal(t, "fedcba", got.Revision)
	require.False(t, got.Dirty)
}
