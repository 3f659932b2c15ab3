package cli

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

// The tombstone window may not be shorter than the retention of done rows:
// refused before anything connects, in the operator's variables.
func TestRunRefusesATombstoneRetentionBelowRetention(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	code := Run([]string{"run", "--database-url", "postgres://127.0.0.1:1/none",
		"--retention", "48h", "--ledger-tombstone-retention", "24h"}, &stdout, &stderr)
	require.NotZero(t, code)
	require.Contains(t, stderr.String(),
		"OUTBOX_LEDGER_TOMBSTONE_RETENTION=24h0m0s must not be below OUTBOX_RETENTION=48h0m0s")
}

// run --help says what the retention does since the outbox is partitioned
// (00021): whole partitions go by TRUNCATE; no row is deleted one by one.
func TestRunHelpSaysTheRetentionTruncatesPartitions(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	require.Zero(t, Run([]string{"run", "--help"}, &stdout, &stderr), stderr.String())
	help := stdout.String()
	require.NotContains(t, help, "small batches")
	require.Contains(t, help, "TRUNCATE")
}

// Without a database URL, run says which variable to set, not the Go field
// the replica's configuration holds it in.
func TestRunWithoutADatabaseURLNamesTheVariable(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	var stdout, stderr bytes.Buffer
	code := Run([]string{"run"}, &stdout, &stderr)
	require.NotZero(t, code)
	require.Contains(t, stderr.String(), "DATABASE_URL is required")
	require.NotContains(t, stderr.String(), "DatabaseURL")
}

// Every other command without a database URL names the variable too, as
// well as the flag, not only "missing flags: --database-url".
func TestCommandsWithoutADatabaseURLNameTheVariable(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	for _, args := range [][]string{{"status"}, {"failed", "list"}, {"migrate", "--expect-db", "x"}} {
		var stdout, stderr bytes.Buffer
		require.NotZero(t, Run(args, &stdout, &stderr), args)
		require.Contains(t, stderr.String(), "DATABASE_URL", args)
	}
}
