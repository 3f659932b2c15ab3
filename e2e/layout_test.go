package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

var reLayoutRow = regexp.MustCompile("(?m)^\\| `([^`]+)` \\|")

// The README's layout table names every directory of the tree (the top
// level, internal/ and tools/, whose rows name their packages), and
// nothing that is not there.
func TestReadmeLayoutMatchesTheTree(t *testing.T) {
	t.Parallel()
	root := harness.Root(t)
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	require.NoError(t, err)
	section := string(readme)
	start := strings.Index(section, "## Layout")
	require.NotEqual(t, -1, start)
	section = section[start:]
	section = section[:strings.Index(section, "\n## ")+1]
	rows := map[string]bool{}
	for _, m := range reLayoutRow.FindAllStringSubmatch(section, -1) {
		rows[m[1]] = true
		_, err := os.Stat(filepath.Join(root, m[1]))
		require.NoError(t, err, "the layout names %s, which is not in the tree", m[1])
	}
	// Directories of tracked files only: build output (bin/, .cache/) is
	// not part of the layout.
	out, err := exec.Command("git", "-C", root, "ls-files").Output()
	require.NoError(t, err)
	tracked := map[string]bool{}
	for _, file := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		parts := strings.SplitN(file, "/", 3)
		switch {
		case len(parts) < 2 || strings.HasPrefix(parts[0], "."):
		case parts[0] == "tools" && len(parts) == 3:
			tracked["tools/"+parts[1]+"/"] = true
		case parts[0] != "tools":
			tracked[parts[0]+"/"] = true
		}
	}
	for path := range tracked {
		require.True(t, rows[path], "%s has no row in the README's layout table", path)
	}
	for _, dir := range []string{"internal"} {
		entries, err := os.ReadDir(filepath.Join(root, dir))
		require.NoError(t, err)
		for _, e := range entries {
			if e.IsDir() && e.Name() != "testkit" {
				require.Contains(t, section, "`"+e.Name()+"`", "internal/%s is not named in the layout table", e.Name())
			}
		}
	}
	for _, name := range []string{"harness", "faultproxy", "tcpproxy", "holdproxy"} {
		require.Contains(t, section, "`"+name+"`", "internal/testkit/%s is not named in the layout table", name)
	}
}
