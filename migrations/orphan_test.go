package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/migrations"
)

// TestRerunWaitsForAnotherSessionsBuild: another session (not wlproj
// migrate's) is building the index a migration builds, under its name,
// and waits for an old snapshot; its index is INVALID until it ends. The
// migration neither drops it under the build (which failed with "tuple
// concurrently updated") nor ends that session: it waits, and keeps the
// index once the build made it valid. (Process tests of a killed migrate's
// own orphaned builds, which it terminates: e2e/migrate_kill_test.go.)
func TestRerunWaitsForAnotherSessionsBuild(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, expect := databaseAt(t, 15)

	old, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	defer old.Close(ctx)
	snapshot, err := old.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	_, err = snapshot.Exec(ctx, `SELECT count(*) FROM outbox_leader`)
	require.NoError(t, err)

	cfg, err := pgx.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.RuntimeParams["application_name"] = "dba"
	dba, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer dba.Close(ctx)
	built := make(chan error, 1)
	go func() {
		_, err := dba.Exec(ctx, `CREATE INDEX CONCURRENTLY outbox_events_due_idx ON outbox_events (projection, next_retry_at, id) WHERE status = 'pending'`)
		built <- err
	}()
	harness.Eventually(t, 10*time.Second, "the other build waiting for the old snapshot", func() bool {
		return db.Int(t, `SELECT count(*) FROM pg_stat_progress_create_index WHERE pid = $1 AND phase = 'waiting for old snapshots'`,
			int(dba.PgConn().PID())) == 1
	})

	var building uint32
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT 'outbox_events_due_idx'::regclass::oid`).Scan(&building))

	migrated := make(chan error, 1)
	go func() {
		_, err := migrations.Run(ctx, db.URL, expect, migrations.Config{UpTo: 16}, zerolog.Nop())
		migrated <- err
	}()
	time.Sleep(2 * time.Second)
	select {
	case err := <-migrated:
		t.Fatalf("the migration did not wait for the other build: %v", err)
	case err := <-built:
		t.Fatalf("the other build ended while its snapshot was held: %v", err)
	default:
	}
	require.NoError(t, snapshot.Rollback(ctx))
	require.NoError(t, <-built, "the other session's build was not disturbed")
	require.NoError(t, <-migrated)
	var kept uint32
	var valid bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT indexrelid, indisvalid FROM pg_index WHERE indexrelid = 'outbox_events_due_idx'::regclass`).Scan(&kept, &valid))
	require.True(t, valid)
	require.Equal(t, building, kept, "the migration dropped the index the other session built, and built it again")
}
