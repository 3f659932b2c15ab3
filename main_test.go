package main

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testenv"
)

func TestHelpListsSubcommands(t *testing.T) {
	t.Parallel()
	out, err := exec.Command(testenv.Binary(t), "--help").CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, sub := range []string{"run", "migrate", "replay", "failed list", "failed stats", "status"} {
		require.Contains(t, string(out), "\n  "+sub+" ", "help must list %q", sub)
	}
}

func TestMigrateGuardExitsNonZero(t *testing.T) {
	t.Parallel()
	db := testenv.NewEmptyDatabase(t)
	var stdout, stderr bytes.Buffer
	code := run([]string{"migrate", "--database-url", db.URL, "--expect-db", "not-" + db.Name}, &stdout, &stderr)
	require.NotZero(t, code)
	require.Contains(t, stderr.String(), "refusing to migrate")
	require.Contains(t, stderr.String(), db.Name, "the message says what it found")

	code = run([]string{"migrate", "--database-url", db.URL, "--expect-db", db.Name}, &stdout, &stderr)
	require.Zero(t, code, stderr.String())
	require.True(t, strings.Contains(stdout.String(), "applied"), stdout.String())
}
