package cli

import (
	"bytes"
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/migrations"
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

// TestMigrateDryRunListsLocksAndChangesNothing: the dry run lists what would
// run with each statement's lock, and leaves the database as it found it,
// whether empty or part-migrated.
func TestMigrateDryRunListsLocksAndChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := harness.NewEmptyDatabase(t)
	var stdout, stderr bytes.Buffer
	code := Run([]string{"migrate", "--database-url", db.URL, "--expect-db", db.Name, "--dry-run"}, &stdout, &stderr)
	require.Zero(t, code, stderr.String())
	out := stdout.String()
	for _, want := range []string{
		"nothing was changed",
		"00001_outbox.sql (one transaction)",
		"00004_applied_ledger.sql (each statement commits alone)",
		"CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_events_done_idx",
		"lock: SHARE UPDATE EXCLUSIVE on outbox_events (writes go on; waits for older transactions)",
		"ALTER TABLE outbox_events ADD COLUMN traceparent text;\n    lock: ACCESS EXCLUSIVE on outbox_events",
		"CREATE TABLE IF NOT EXISTS outbox_applied (",
	} {
		require.Contains(t, out, want)
	}
	var tables int
	require.NoError(t, db.Pool.QueryRow(ctx,
		`SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'`).Scan(&tables))
	require.Zero(t, tables, "a dry run creates nothing, not even goose's table")

	_, err := migrations.Run(ctx, db.URL, migrations.Expect{Database: db.Name}, migrations.Config{UpTo: 14}, zerolog.Nop())
	require.NoError(t, err)
	stdout.Reset()
	code = Run([]string{"migrate", "--database-url", db.URL, "--dry-run"}, &stdout, &stderr)
	require.Zero(t, code, stderr.String())
	require.Contains(t, stdout.String(), "now at version 14")
	require.Contains(t, stdout.String(), "00015_traceparent.sql")
	require.NotContains(t, stdout.String(), "00014_")
	var version int64
	var traceparent bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT (SELECT max(version_id) FROM goose_db_version),
		EXISTS (SELECT 1 FROM information_schema.columns WHERE table_name = 'outbox_events' AND column_name = 'traceparent')`).Scan(&version, &traceparent))
	require.Equal(t, int64(14), version)
	require.False(t, traceparent, "the dry run applied nothing")
}

// TestMigrateRefusesBadLockTimeout: an out-of-range setting is refused by
// its variable's name before anything connects.
func TestMigrateRefusesBadLockTimeout(t *testing.T) {
	t.Parallel()
	db := harness.NewEmptyDatabase(t)
	var stdout, stderr bytes.Buffer
	code := Run([]string{"migrate", "--database-url", db.URL, "--lock-timeout", "5ms"}, &stdout, &stderr)
	require.NotZero(t, code)
	require.Contains(t, stderr.String(), "MIGRATE_LOCK_TIMEOUT")
	code = Run([]string{"migrate", "--database-url", db.URL, "--lock-timeout", "2s", "--lock-wait", "1s"}, &stdout, &stderr)
	require.NotZero(t, code)
	require.Contains(t, stderr.String(), "MIGRATE_LOCK_WAIT")
	var tables int
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'`).Scan(&tables))
	require.Zero(t, tables)
}

func TestMigrateRefusesSeveralHostsWithoutReadWrite(t *testing.T) {
	t.Parallel()
	db := harness.NewEmptyDatabase(t)
	u, err := url.Parse(db.URL)
	require.NoError(t, err)
	u.Host = "127.0.0.1:1," + u.Host
	for _, args := range [][]string{{"migrate"}, {"migrate", "--dry-run"}} {
		var stdout, stderr bytes.Buffer
		code := Run(append(args, "--database-url", u.String()), &stdout, &stderr)
		require.Equal(t, exitUsage, code, stderr.String())
		require.Contains(t, stderr.String(), "target_session_attrs=read-write")
	}
	var tables int
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'`).Scan(&tables))
	require.Zero(t, tables)
}

// The guard is required: without --expect-db migrate changes nothing,
// wherever the URL points; a dry run, which changes nothing, may go without.
func TestMigrateRequiresTheGuard(t *testing.T) {
	t.Parallel()
	db := harness.NewEmptyDatabase(t)
	var stdout, stderr bytes.Buffer
	code := Run([]string{"migrate", "--database-url", db.URL}, &stdout, &stderr)
	require.Equal(t, exitUsage, code, stderr.String())
	require.Contains(t, stderr.String(), "--expect-db (MIGRATE_EXPECT_DB) is required")
	var tables int
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'`).Scan(&tables))
	require.Zero(t, tables, "nothing was changed")

	stdout.Reset()
	stderr.Reset()
	require.Zero(t, Run([]string{"migrate", "--database-url", db.URL, "--dry-run"}, &stdout, &stderr), stderr.String())
}
