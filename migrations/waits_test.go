package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3/lock"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/migrations"
)

// The migration's own waits hold no snapshot: a snapshot held anywhere in
// the database stops vacuum of every table in it, the application's too.

// TestWaitForMigrationLockHoldsNoSnapshot: a migrate that finds another
// holding the migration lock waits for it in goose's try-lock loop
// (pg_try_advisory_lock every 5 s), short statements each, not in one
// blocking pg_advisory_lock: VACUUM removes rows deleted while it waits.
func TestWaitForMigrationLockHoldsNoSnapshot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := harness.NewEmptyDatabase(t)
	holder, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	defer holder.Close(ctx)
	_, err = holder.Exec(ctx, `SELECT pg_advisory_lock($1)`, lock.DefaultLockID)
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() {
		_, err := migrations.Up(ctx, db.URL, migrations.Expect{Database: db.Name})
		done <- err
	}()
	harness.Eventually(t, 10*time.Second, "the migrate waiting for the lock", func() bool {
		return db.Int(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1`,
			migrations.ApplicationName) > 0
	})
	watch := harness.WatchSnapshots(db.Pool, migrations.ApplicationName, 50*time.Millisecond)
	dead, err := harness.DeleteRows(ctx, db.Pool, "app_rows", 1000)
	require.NoError(t, err)
	// Longer than goose's 5 s between tries: a wait that held a snapshot
	// from one try to the next would show here.
	time.Sleep(6 * time.Second)
	left, err := dead.Vacuum(ctx)
	require.NoError(t, err)
	oldest, samples, err := watch.Stop()
	require.NoError(t, err)
	select {
	case err := <-done:
		t.Fatalf("the migrate did not wait for the lock: %v", err)
	default:
	}
	t.Logf("%d samples; the waiting migrate's oldest snapshot: %s", samples, oldest)
	require.Zero(t, left, "VACUUM could not remove rows deleted while the migrate waited for its lock")
	require.Less(t, oldest.Age, time.Second, "the migrate's wait held a snapshot")

	_, err = holder.Exec(ctx, `SELECT pg_advisory_unlock($1)`, lock.DefaultLockID)
	require.NoError(t, err)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("the migrate did not take the lock a minute after it was freed")
	}
}

// TestLedgerBackfillLetsVacuumRun: 00004 fills the ledger in pages that
// commit one by one, each with a snapshot of its own, so VACUUM removes rows
// deleted after the data move began while it is still moving.
func TestLedgerBackfillLetsVacuumRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, expect := databaseAt(t, 3)
	// Enough pages that the move lasts several seconds on a busy machine.
	_, err := db.Pool.Exec(ctx, `
		INSERT INTO outbox_events (entity_type, entity_id, op, event_version, status, processed_at)
		SELECT 'book', (g % 50000)::text, 'upsert', g, 'done', now() FROM generate_series(1, 400000) g`)
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() {
		_, err := migrations.Run(ctx, db.URL, expect, migrations.Config{UpTo: 4}, zerolog.Nop())
		done <- err
	}()
	moving := func() bool {
		return db.Int(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND application_name = $1 AND state = 'active' AND query LIKE 'DO $$%'`, migrations.ApplicationName) > 0
	}
	harness.Eventually(t, time.Minute, "the ledger's data move running", moving)
	dead, err := harness.DeleteRows(ctx, db.Pool, "app_rows", 1000)
	require.NoError(t, err)
	left, err := dead.WaitRemoved(ctx, 10*time.Second)
	require.NoError(t, err, "VACUUM removing the rows deleted during the data move: %d left", left)
	require.True(t, moving(), "the data move ended before VACUUM could tell; give it more rows")
	require.NoError(t, <-done)
}

// An index build CONCURRENTLY waits for every older transaction, without a
// lock timeout: behind a session running a statement in a transaction
// older than the build (as a previous release's standby waits for
// leadership), the migration fails after LockWait naming it, and the hint
// says to end it or wait, not to lengthen MIGRATE_LOCK_TIMEOUT, which
// cannot help.
func TestConcurrentBuildHintNamesTheOldTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, expect := databaseAt(t, 16)
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, `SELECT txid_current()`)
	require.NoError(t, err)
	go func() { _, _ = tx.Exec(ctx, `SELECT pg_sleep(6)`) }()

	_, err = migrations.Run(ctx, db.URL, expect, migrations.Config{UpTo: 17, LockWait: 2 * time.Second}, zerolog.Nop())
	var lt *migrations.LockTimeoutError
	require.ErrorAs(t, err, &lt)
	require.Contains(t, lt.Statement, "CONCURRENTLY")
	require.NotEmpty(t, lt.Blockers, "the session in the way named")
	require.Equal(t, "active", lt.Blockers[0].State)
	require.NotContains(t, lt.Hint(), "give it a longer MIGRATE_LOCK_TIMEOUT")
	require.Contains(t, lt.Hint(), "a longer MIGRATE_LOCK_TIMEOUT cannot help: end that session")
}
