package harness

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// PreviousRelease is the commit of the release before this one: the
// running release of an upgrade to this one (runbook, Upgrade order).
const PreviousRelease = "12f648762d649ff54762ed320cfe2bf29b6d768d"

// PreviousReleaseSchema is the newest migration PreviousRelease carries.
const PreviousReleaseSchema = 16

// BinaryOf builds wlproj as of commit, from this checkout's history, once
// per machine: into the user's cache directory under the commit's name (a
// commit's source never changes), so a later run finds it. Built from
// git archive rather than a git worktree, which would add to the
// repository's worktree list that other checkouts share. Without the
// history (a shallow clone) the test is skipped, saying why.
func BinaryOf(t testing.TB, commit string) string {
	t.Helper()
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "wlproj", "e2e-bin", commit)
	bin := filepath.Join(dir, "wlproj")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	root := Root(t)
	if err := exec.Command("git", "-C", root, "cat-file", "-e", commit+"^{commit}").Run(); err != nil {
		t.Skipf("commit %s is not in this checkout's history (%v): its binary cannot be built", commit, err)
	}
	src := t.TempDir()
	out, err := exec.Command("sh", "-c", `git -C "$1" archive "$2" | tar -x -C "$3"`, "sh", root, commit, src).CombinedOutput()
	require.NoError(t, err, "git archive %s: %s", commit, out)
	require.NoError(t, os.MkdirAll(dir, 0o755))
	// Built aside and renamed: another test process finds all or nothing.
	tmp := filepath.Join(dir, "wlproj.building-"+strconv.Itoa(os.Getpid()))
	build := exec.Command("go", "build", "-o", tmp, ".")
	build.Dir = src
	out, err = build.CombinedOutput()
	require.NoError(t, err, "go build of %s: %s", commit, out)
	require.NoError(t, os.Rename(tmp, bin))
	return bin
}
