package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/migrations"
)

// schemaQueries describe a schema by what the migrations make: columns
// (with storage), indexes (with validity), constraints (with validation),
// table options, triggers, functions and extensions.
var schemaQueries = []string{
	`SELECT c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod) || ' notnull=' || a.attnotnull ||
	        ' default=' || coalesce(pg_get_expr(d.adbin, d.adrelid), '') || ' storage=' || a.attstorage::text
	   FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
	   LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
	  WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped`,
	`SELECT pg_get_indexdef(i.indexrelid) || ' valid=' || i.indisvalid
	   FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relnamespace = current_schema()::regnamespace`,
	`SELECT conrelid::regclass || ' ' || conname || ' ' || pg_get_constraintdef(oid) || ' validated=' || convalidated
	   FROM pg_constraint WHERE connamespace = current_schema()::regnamespace`,
	`SELECT relname || ' ' || coalesce(array_to_string(reloptions, ','), '')
	   FROM pg_class WHERE relnamespace = current_schema()::regnamespace AND relkind = 'r'`,
	`SELECT tgrelid::regclass || ' ' || pg_get_triggerdef(oid) FROM pg_trigger WHERE NOT tgisinternal`,
	`SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ') ' || md5(p.prosrc)
	   FROM pg_proc p WHERE p.pronamespace = current_schema()::regnamespace`,
	`SELECT extname FROM pg_extension`,
}

func schemaOf(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	var out []string
	for _, q := range schemaQueries {
		rows, err := pool.Query(context.Background(), q)
		require.NoError(t, err, q)
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err, q)
		out = append(out, got...)
	}
	sort.Strings(out)
	return out
}

// diff returns the lines only in a and only in b.
func diff(a, b []string) (onlyA, onlyB []string) {
	count := map[string]int{}
	for _, s := range a {
		count[s]++
	}
	for _, s := range b {
		count[s]--
	}
	for s, n := range count {
		for ; n > 0; n-- {
			onlyA = append(onlyA, s)
		}
		for ; n < 0; n++ {
			onlyB = append(onlyB, s)
		}
	}
	return onlyA, onlyB
}

// databaseAt is a database of the test's own migrated by the runner up to
// version, and the guard that names it.
func databaseAt(t *testing.T, version int64) (harness.DB, migrations.Expect) {
	t.Helper()
	db := harness.NewEmptyDatabase(t)
	expect := migrations.Expect{Database: db.Name}
	_, err := migrations.Run(context.Background(), db.URL, expect, migrations.Config{UpTo: version}, zerolog.Nop())
	require.NoError(t, err)
	return db, expect
}

// TestSchemaSameAfterOldToNew: an install migrated by the old files (all of
// them, or some and then the new runner for the rest) ends with the same
// schema as a fresh install by the new files.
func TestSchemaSameAfterOldToNew(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fresh := harness.NewEmptyDatabase(t)
	_, err := migrations.Up(ctx, fresh.URL, migrations.Expect{Database: fresh.Name})
	require.NoError(t, err)
	want := schemaOf(t, fresh.Pool)
	require.NotEmpty(t, want)

	for _, from := range []int64{0, 1, 3, 4, 7, 10} {
		t.Run(fmt.Sprintf("old_to_%d", from), func(t *testing.T) {
			t.Parallel()
			db := harness.NewEmptyDatabase(t)
			legacyUp(t, db.URL, from) // 0: every old file
			_, err := migrations.Up(ctx, db.URL, migrations.Expect{Database: db.Name})
			require.NoError(t, err)
			missing, extra := diff(want, schemaOf(t, db.Pool))
			require.Empty(t, missing, "in the fresh schema, not in this one")
			require.Empty(t, extra, "in this schema, not in the fresh one")
		})
	}
}

// TestLedgerBackfillInPagesEqualsOneStatement: 00004 fills the ledger in
// pages of 10 000 outbox ids; the result equals the old single statement's,
// with a document's newest version in any page.
func TestLedgerBackfillInPagesEqualsOneStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := harness.NewEmptyDatabase(t)
	legacyUp(t, db.URL, 3)
	// 25 000 events over 3 pages, 1 000 documents in two projections;
	// versions are not in id order, some are NULL (the id counts), some
	// events are not done.
	_, err := db.Pool.Exec(ctx, `
		INSERT INTO outbox_events (projection, entity_type, entity_id, op, event_version, status, processed_at)
		SELECT CASE WHEN g % 3 = 0 THEN 'chronicle' ELSE 'search' END, 'book', (g % 1000)::text,
		       CASE WHEN g % 7 = 0 THEN 'delete' ELSE 'upsert' END,
		       CASE WHEN g % 11 = 0 THEN NULL ELSE (g * 7919) % 30011 END,
		       CASE WHEN g % 5 = 0 THEN 'pending' ELSE 'done' END,
		       timestamptz '2026-01-01' + g * interval '1 second'
		  FROM generate_series(1, 25000) g`)
	require.NoError(t, err)
	const oldStatement = `
		SELECT DISTINCT ON (projection, entity_type, entity_id)
		       format('%s/%s/%s v=%s del=%s ev=%s at=%s', projection, entity_type, entity_id,
		              coalesce(event_version, id), op = 'delete', id, coalesce(processed_at, now()))
		  FROM outbox_events
		 WHERE status = 'done'
		 ORDER BY projection, entity_type, entity_id, coalesce(event_version, id) DESC, id DESC`
	rows, err := db.Pool.Query(ctx, oldStatement)
	require.NoError(t, err)
	want, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Greater(t, len(want), 1000)

	_, err = migrations.Run(ctx, db.URL, migrations.Expect{Database: db.Name}, migrations.Config{UpTo: 4}, zerolog.Nop())
	require.NoError(t, err)
	rows, err = db.Pool.Query(ctx, `
		SELECT format('%s/%s/%s v=%s del=%s ev=%s at=%s', projection, entity_type, entity_id, version, deleted, event_id, applied_at)
		  FROM outbox_applied ORDER BY projection, entity_type, entity_id`)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, len(want), len(got))
	for i := range want {
		require.Equal(t, want[i], got[i])
	}
}

// TestRerunRebuildsInvalidIndex: a CONCURRENTLY build that failed leaves an
// INVALID index under the name; the rerun drops it and builds the real one,
// where IF NOT EXISTS alone would keep the broken one.
func TestRerunRebuildsInvalidIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, expect := databaseAt(t, 3)
	_, err := db.Pool.Exec(ctx, `INSERT INTO outbox_events (entity_type, entity_id, op, status) VALUES ('book', '1', 'upsert', 'done'), ('book', '2', 'upsert', 'done')`)
	require.NoError(t, err)
	// A unique build over duplicates fails after its catalog entry
	// committed: what an interrupted build leaves.
	_, err = db.Pool.Exec(ctx, `CREATE UNIQUE INDEX CONCURRENTLY outbox_events_done_idx ON outbox_events (status) WHERE status = 'done'`)
	require.Error(t, err)
	var valid bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT indisvalid FROM pg_index WHERE indexrelid = 'outbox_events_done_idx'::regclass`).Scan(&valid))
	require.False(t, valid)

	_, err = migrations.Up(ctx, db.URL, expect)
	require.NoError(t, err)
	var def string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pg_get_indexdef(indexrelid), indisvalid FROM pg_index WHERE indexrelid = 'outbox_events_done_idx'::regclass`).Scan(&def, &valid))
	require.True(t, valid)
	require.Contains(t, def, "(processed_at) WHERE (status = 'done'::text)")
}

// TestLockTimeoutNamesStatementAndBlocker: an ALTER of outbox_events behind
// an application's open transaction gives up after LockWait with an error
// naming the statement and the blocking session, applies nothing of that
// migration, and succeeds on the next run once the transaction ended.
func TestLockTimeoutNamesStatementAndBlocker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, expect := databaseAt(t, 14)

	appCfg, err := pgx.ParseConfig(db.URL)
	require.NoError(t, err)
	appCfg.RuntimeParams["application_name"] = "the-app"
	app, err := pgx.ConnectConfig(ctx, appCfg)
	require.NoError(t, err)
	defer app.Close(ctx)
	tx, err := app.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', 'long', 'upsert')`)
	require.NoError(t, err)
	appPID := app.PgConn().PID()

	start := time.Now()
	res, err := migrations.Run(ctx, db.URL, expect, migrations.Config{LockTimeout: 100 * time.Millisecond, LockWait: 1500 * time.Millisecond, UpTo: 15}, zerolog.Nop())
	var lt *migrations.LockTimeoutError
	require.True(t, errors.As(err, &lt), "want a LockTimeoutError, got %v", err)
	require.Less(t, time.Since(start), 5*time.Second, "gives up after about LockWait")
	require.Greater(t, lt.Attempts, 1, "retried before giving up")
	require.Equal(t, "00015_traceparent.sql", lt.File)
	require.Contains(t, lt.Statement, "ADD COLUMN traceparent")
	require.NotEmpty(t, lt.Blockers)
	require.Equal(t, int(appPID), lt.Blockers[0].PID)
	require.Equal(t, "the-app", lt.Blockers[0].Application)
	require.Contains(t, err.Error(), fmt.Sprintf("pid %d", appPID))
	require.Contains(t, err.Error(), "end that transaction", "behind an idle transaction the hint is to end it")
	require.Empty(t, res.Applied)
	var version int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT max(version_id) FROM goose_db_version`).Scan(&version))
	require.Equal(t, int64(14), version, "the timed-out migration changed nothing")

	require.NoError(t, tx.Commit(ctx))
	res, err = migrations.Run(ctx, db.URL, expect, migrations.Config{UpTo: 15}, zerolog.Nop())
	require.NoError(t, err)
	require.Equal(t, []int64{15}, res.Applied)
}

// TestLockTimeoutBehindWorkAsksForALongerTimeout: behind a session whose
// transactions are working (a statement running) for longer than the lock
// timeout, every try fails however long the runner retries; the error says
// so and names MIGRATE_LOCK_TIMEOUT, and a lock timeout longer than that
// transaction lets the same statement through.
func TestLockTimeoutBehindWorkAsksForALongerTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, expect := databaseAt(t, 14)
	busy := func(hold time.Duration) <-chan error {
		started := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			tx, err := db.Pool.Begin(ctx)
			if err == nil {
				defer tx.Rollback(ctx)
				_, err = tx.Exec(ctx, `LOCK TABLE outbox_events IN ROW EXCLUSIVE MODE`)
			}
			close(started)
			if err == nil {
				_, err = tx.Exec(ctx, `SELECT pg_sleep($1)`, hold.Seconds())
			}
			done <- err
		}()
		<-started
		return done
	}

	held := busy(3 * time.Second)
	_, err := migrations.Run(ctx, db.URL, expect, migrations.Config{LockTimeout: 100 * time.Millisecond, LockWait: time.Second, UpTo: 15}, zerolog.Nop())
	var lt *migrations.LockTimeoutError
	require.True(t, errors.As(err, &lt), "want a LockTimeoutError, got %v", err)
	require.Equal(t, "active", lt.Blockers[0].State)
	require.Contains(t, err.Error(), "MIGRATE_LOCK_TIMEOUT", "behind a working session the hint is a longer lock timeout")
	require.NoError(t, <-held)

	held = busy(time.Second)
	res, err := migrations.Run(ctx, db.URL, expect, migrations.Config{LockTimeout: 5 * time.Second, UpTo: 15}, zerolog.Nop())
	require.NoError(t, err, "a lock timeout longer than the working transaction lets the statement through")
	require.Equal(t, []int64{15}, res.Applied)
	require.NoError(t, <-held)
}

// TestConcurrentBuildWaitsWithoutBlockingWrites: a CONCURRENTLY build waits
// for an older application transaction the whole LockWait at once (its wait
// blocks no insert), then gives up naming it; the invalid index it leaves is
// rebuilt by the next run.
func TestConcurrentBuildWaitsWithoutBlockingWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, expect := databaseAt(t, 3)

	app, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	defer app.Close(ctx)
	tx, err := app.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', 'long', 'upsert')`)
	require.NoError(t, err)

	type outcome struct{ err error }
	done := make(chan outcome, 1)
	go func() {
		_, err := migrations.Run(ctx, db.URL, expect, migrations.Config{LockTimeout: 100 * time.Millisecond, LockWait: 3 * time.Second, UpTo: 4}, zerolog.Nop())
		done <- outcome{err}
	}()
	// While the build waits on the application's transaction, inserts go on.
	harness.Eventually(t, 10*time.Second, "the index build waits on the application's transaction", func() bool {
		var waiting bool
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE query LIKE 'CREATE INDEX CONCURRENTLY%' AND $1 = ANY(pg_blocking_pids(pid)))`,
			int(app.PgConn().PID())).Scan(&waiting))
		return waiting
	})
	for i := range 5 {
		start := time.Now()
		_, err := db.Pool.Exec(ctx, `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', $1, 'upsert')`, fmt.Sprint(i))
		require.NoError(t, err)
		require.Less(t, time.Since(start), 100*time.Millisecond, "an insert waited for the index build")
	}
	out := <-done
	var lt *migrations.LockTimeoutError
	require.True(t, errors.As(out.err, &lt), "want a LockTimeoutError, got %v", out.err)
	require.Equal(t, "00004_applied_ledger.sql", lt.File)
	require.Contains(t, lt.Statement, "CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_events_done_idx")
	require.Equal(t, 1, lt.Attempts, "one wait of LockWait, not retries of LockTimeout")
	require.GreaterOrEqual(t, lt.Waited, 3*time.Second)
	require.NotEmpty(t, lt.Blockers)
	require.Equal(t, int(app.PgConn().PID()), lt.Blockers[0].PID)
	var valid bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT indisvalid FROM pg_index WHERE indexrelid = 'outbox_events_done_idx'::regclass`).Scan(&valid))
	require.False(t, valid, "the interrupted build left an invalid index")

	require.NoError(t, tx.Commit(ctx))
	_, err = migrations.Run(ctx, db.URL, expect, migrations.Config{UpTo: 4}, zerolog.Nop())
	require.NoError(t, err)
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT indisvalid FROM pg_index WHERE indexrelid = 'outbox_events_done_idx'::regclass`).Scan(&valid))
	require.True(t, valid)
}
