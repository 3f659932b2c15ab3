package main

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/cli"
	"github.com/wlproj/wlproj/internal/testkit/harness"
)

func TestHelpListsSubcommands(t *testing.T) {
	t.Parallel()
	out, err := exec.Command(harness.Binary(t), "--help").CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, sub := range []string{"run", "migrate", "replay", "failed list", "failed stats", "status"} {
		require.Contains(t, string(out), "\n  "+sub+" ", "help must list %q", sub)
	}
}

func TestMigrateGuardExitsNonZero(t *testing.T) {
	t.Parallel()
	db := harness.NewEmptyDatabase(t)
	var stdout, stderr bytes.Buffer
	code := cli.Run([]string{"migrate", "--database-url", db.URL, "--expect-db", "not-" + db.Name}, &stdout, &stderr)
	require.NotZero(t, code)
	require.Contains(t, stderr.String(), "refusing to migrate")
	require.Contains(t, stderr.String(), db.Name, "the message says what it found")

	code = cli.Run([]string{"migrate", "--database-url", db.URL, "--expect-db", db.Name}, &stdout, &stderr)
	require.Zero(t, code, stderr.String())
	require.True(t, strings.Contains(stdout.String(), "applied"), stdout.String())
}

func TestRunRejectsOutOfRangeSettings(t *testing.T) {
	t.Parallel()
	for env, value := range map[string]string{
		"OUTBOX_BULK_SIZE":              "0",
		"OUTBOX_CONCURRENCY":            "65",
		"OUTBOX_LEASE_SECONDS":          "0.5",
		"OUTBOX_MAX_ATTEMPTS":           "0",
		"OUTBOX_SHUTDOWN_GRACE_SECONDS": "0",
		"OUTBOX_HTTP_PORT":              "70000",
		"OUTBOX_TCP_KEEPALIVES_COUNT":   "0",
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, harness.Binary(t), "run")
		cmd.Env = append(cmd.Environ(), "DATABASE_URL=postgres://127.0.0.1:1/none", env+"="+value)
		out, err := cmd.CombinedOutput()
		require.Error(t, err, "%s=%s must be refused", env, value)
		require.Contains(t, string(out), env, "the error names the variable")
	}
}

// The tombstone window may not be shorter than the retention of done rows:
// refused before anything connects, in the operator's variables.
func TestRunRefusesATombstoneRetentionBelowRetention(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	code := cli.Run([]string{"run", "--database-url", "postgres://127.0.0.1:1/none",
		"--retention", "48h", "--ledger-tombstone-retention", "24h"}, &stdout, &stderr)
	require.NotZero(t, code)
	require.Contains(t, stderr.String(),
		"OUTBOX_LEDGER_TOMBSTONE_RETENTION=24h0m0s must not be below OUTBOX_RETENTION=48h0m0s")
}
