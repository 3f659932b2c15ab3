package cli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

func TestMigrateGuardExitsNonZero(t *testing.T) {
	t.Parallel()
	db := harness.NewEmptyDatabase(t)
	var stdout, stderr bytes.Buffer
	code := Run([]string{"migrate", "--database-url", db.URL, "--expect-db", "not-" + db.Name}, &stdout, &stderr)
	require.NotZero(t, code)
	require.Contains(t, stderr.String(), "refusing to migrate")
	require.Contains(t, stderr.String(), db.Name, "the message says what it found")

	code = Run([]string{"migrate", "--database-url", db.URL, "--expect-db", db.Name}, &stdout, &stderr)
	require.Zero(t, code, stderr.String())
	require.True(t, strings.Contains(stdout.String(), "applied"), stdout.String())
}
