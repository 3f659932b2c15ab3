package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/alecthomas/kong"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/cli"
	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// flagDefaults walks the CLI's model: env var → default and help text, as
// kong resolved them from the packages' constants.
func flagDefaults(t *testing.T) map[string]*kong.Flag {
	t.Helper()
	model, err := cli.Model()
	require.NoError(t, err)
	flags := map[string]*kong.Flag{}
	var walk func(n *kong.Node)
	walk = func(n *kong.Node) {
		for _, f := range n.Flags {
			for _, env := range f.Envs {
				// status shares OUTBOX_MAX_PROCESSING_SECONDS; run's flag has the range.
				if old, ok := flags[env]; !ok || !reHelpRange.MatchString(old.Help) {
					flags[env] = f
				}
			}
		}
		for _, child := range n.Children {
			walk(child)
		}
	}
	walk(model.Node)
	return flags
}

var (
	reConfigRow = regexp.MustCompile("(?m)^\\| `([A-Z][A-Z0-9_]*)` \\|([^|]*)\\|([^|]*)\\|")
	reAccepted  = regexp.MustCompile(`accepted ([0-9.]+)[–-]([0-9.]+)`)
	reHelpRange = regexp.MustCompile(`\[([0-9.]+), ([0-9.]+)\]`)
)

// The runbook's configuration table states each default and accepted range
// again for operators; it must say what the code does.
func TestRunbookConfigTableMatchesTheCode(t *testing.T) {
	t.Parallel()
	runbook, err := os.ReadFile(filepath.Join(harness.Root(t), "runbook.md"))
	require.NoError(t, err)
	flags := flagDefaults(t)
	rows := reConfigRow.FindAllStringSubmatch(string(runbook), -1)
	require.NotEmpty(t, rows)
	seen := map[string]bool{}
	for _, row := range rows {
		env, def, rng := row[1], strings.TrimSpace(row[2]), row[3]
		f, ok := flags[env]
		if !ok {
			continue // DATABASE_URL-like rows without a flag default
		}
		seen[env] = true
		if literal, ok := strings.CutPrefix(def, "`"); ok && f.Default != "" {
			literal, _, _ = strings.Cut(literal, "`")
			require.Equal(t, f.Default, literal, "%s: the runbook's default differs from the code's", env)
		}
		if m := reAccepted.FindStringSubmatch(rng); m != nil {
			h := reHelpRange.FindStringSubmatch(f.Help)
			require.NotNil(t, h, "%s: the runbook gives an accepted range, --help none", env)
			require.Equal(t, h[1:], m[1:], "%s: the runbook's accepted range differs from the code's", env)
		}
	}
	for env := range flags {
		require.True(t, seen[env], "%s has no row in runbook.md's configuration table", env)
	}
}
