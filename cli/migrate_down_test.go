package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/migrations"
)

// wlproj migrate --down refuses what is wrong before anything changes: no
// --by, no --why, no --to, a --to that is no migration of this binary, a
// schema not past it, another database, a dry run; each exits non-zero
// naming what was wrong, and the schema and the audit log stay as they
// were.
func TestMigrateDownRefusesBadInputChangingNothing(t *testing.T) {
	t.Parallel()
	db := harness.NewDatabase(t)
	head := strconv.FormatInt(migrations.HeadVersion(), 10)
	base := []string{"migrate", "--down", "--database-url", db.URL}
	for _, c := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"--expect-db", db.Name, "--to", "16", "--why", "INC-7"}, exitUsage, "--by is required"},
		{[]string{"--expect-db", db.Name, "--to", "16", "--by", "alice"}, exitUsage, "--why is required"},
		{[]string{"--expect-db", db.Name, "--by", "alice", "--why", "INC-7"}, exitUsage, "--to is required with --down"},
		{[]string{"--expect-db", db.Name, "--to", "1000", "--by", "alice", "--why", "INC-7"}, exitUsage, "MIGRATE_TO must be one of this binary's migrations"},
		{[]string{"--expect-db", db.Name, "--to", head, "--by", "alice", "--why", "INC-7"}, 1, "no migration after " + head + " is applied"},
		{[]string{"--expect-db", "not-" + db.Name, "--to", "16", "--by", "alice", "--why", "INC-7"}, 1, "refusing to migrate"},
		{[]string{"--expect-db", db.Name, "--to", "16", "--by", "alice", "--why", "INC-7", "--dry-run"}, exitUsage, "--dry-run"},
	} {
		var stdout, stderr bytes.Buffer
		code := Run(append(append([]string{}, base...), c.args...), &stdout, &stderr)
		require.Equal(t, c.code, code, "%v: %s", c.args, stderr.String())
		require.Contains(t, stderr.String(), c.says, "%v", c.args)
		require.Contains(t, stderr.String(), "nothing was changed", "%v", c.args)
		require.NotContains(t, stderr.String(), db.URL, "no URL in the message")
	}
	require.EqualValues(t, migrations.HeadVersion(), db.Int(t, `SELECT max(version_id) FROM goose_db_version`))
	require.Zero(t, db.Int(t, `SELECT count(*) FROM outbox_replay_audit`))
}

// A real rollback to the previous release's schema, as the runbook gives
// it: audited first (who, why, when, from and to which version), then each
// migration undone newest first under MIGRATE_LOCK_TIMEOUT with retries,
// as up does. A session holding a table a Down drops (00022's) makes the
// DROP wait; while it waits, a reader of that table waits at most the
// lock timeout per try, not until the holder ends (goose's own CLI, which
// the runbook gave before, waits with no timeout); the rollback finishes
// once the holder ends.
func TestMigrateDownRollsBackAuditedUnderTheLockTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := harness.NewDatabase(t)
	db.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) SELECT 'book', g::text, 'upsert' FROM generate_series(1, 50) g`)
	holder, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer holder.Rollback(ctx) //nolint:errcheck
	_, err = holder.Exec(ctx, `SELECT count(*) FROM outbox_leader_projections`)
	require.NoError(t, err)

	done := make(chan int, 1)
	var stdout, stderr bytes.Buffer
	go func() {
		done <- Run([]string{"migrate", "--down", "--to", "16", "--by", "alice", "--why", "INC-7: roll back to the previous release",
			"--database-url", db.URL, "--expect-db", db.Name, "--lock-timeout", "100ms"}, &stdout, &stderr)
	}()
	harness.Eventually(t, 10*time.Second, "the rollback waiting for 00022's table", func() bool {
		return db.Int(t, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'DROP TABLE IF EXISTS outbox_leader_projections%'`,
			migrations.ApplicationName) > 0
	})
	for range 3 {
		start := time.Now()
		db.Exec(t, `SELECT count(*) FROM outbox_leader_projections`)
		require.Less(t, time.Since(start), 700*time.Millisecond, "a reader queued behind the waiting DROP for longer than its lock timeout")
		time.Sleep(200 * time.Millisecond)
	}
	require.NoError(t, holder.Rollback(ctx))
	select {
	case code := <-done:
		require.Zero(t, code, stderr.String())
	case <-time.After(2 * time.Minute):
		t.Fatal("the rollback did not finish once the holder ended")
	}
	require.Contains(t, stdout.String(), "schema now at version 16")
	require.EqualValues(t, 16, db.Int(t, `SELECT max(version_id) FROM goose_db_version`))
	require.Zero(t, db.Int(t, `SELECT count(*) FROM pg_class WHERE relname IN ('outbox_ledger', 'outbox_positions', 'outbox_events_rotation')`))
	require.Equal(t, 50, db.Int(t, `SELECT count(*) FROM outbox_events WHERE status = 'pending'`), "the queued rows pending again, for the previous release")

	rows := harness.Column[string](t, db, `SELECT action || ' ' || replayed_by || ' ' || reason || ' ' || selector::text
	                                         FROM outbox_replay_audit WHERE replayed_at > now() - interval '5 minutes'`)
	require.Len(t, rows, 1)
	var sel struct {
		Direction string  `json:"direction"`
		From      int64   `json:"from"`
		To        int64   `json:"to"`
		Undo      []int64 `json:"undo"`
	}
	audit := db.Int(t, `SELECT count(*) FROM outbox_replay_audit WHERE action = 'migrate' AND replayed_by = 'alice' AND reason LIKE 'INC-7%'`)
	require.Equal(t, 1, audit, rows[0])
	raw := harness.Column[string](t, db, `SELECT selector::text FROM outbox_replay_audit WHERE action = 'migrate'`)[0]
	require.NoError(t, json.Unmarshal([]byte(raw), &sel))
	require.Equal(t, "down", sel.Direction)
	require.Equal(t, migrations.HeadVersion(), sel.From)
	require.EqualValues(t, 16, sel.To)
	require.Equal(t, migrations.HeadVersion(), sel.Undo[0])
	require.Contains(t, sel.Undo, int64(17))
}
