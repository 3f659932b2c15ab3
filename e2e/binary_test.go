package e2e

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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
