package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/outbox"
)

// drainedPast reads every queued row there is and saves the position past
// them, as a drained leader's checkpoint leaves it.
func (b bundle) drainedPast(t *testing.T, origin outbox.Position, n int) outbox.Position {
	t.Helper()
	events, pos := b.read(t, origin, n+1)
	require.Len(t, events, n)
	_, err := b.Store.SaveCheckpoints(context.Background(), 1, time.Minute,
		[]outbox.Checkpoint{{Projection: "search", Done: pos, Claimed: pos}})
	require.NoError(t, err)
	return pos
}

// openProducer inserts n queued rows in a transaction it leaves open until
// the test ends, as a producer's long writing transaction would.
func (b bundle) openProducer(t *testing.T, n int) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { tx.Rollback(context.Background()) }) //nolint:errcheck
	_, err = tx.Exec(ctx, `INSERT INTO outbox_events (entity_type, entity_id, op)
		SELECT 'book', 'open' || g, 'upsert' FROM generate_series(1, $1) g`, n)
	require.NoError(t, err)
	return tx
}

// entriesRead runs sql in a transaction of its own and returns how many
// entries it read from the outbox's indexes, and rows from its partitions'
// sequential scans, those of statements inside a function too: each index
// entry is a heap visit, an uncommitted row's included. Unlike
// EXPLAIN's buffers, it does not count a session's catalog reads, which
// other tests' schema changes make vary by thousands.
func entriesRead(t *testing.T, b bundle, sql string, args ...any) int {
	t.Helper()
	ctx := context.Background()
	tx, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	// The counters also hold what earlier transactions of the session read
	// until they reach the statistics, which happens between transactions
	// only: the difference within one is the statement's.
	read := func() (n int) {
		require.NoError(t, tx.QueryRow(ctx, `
			SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(r)), 0)::int FROM (
			  SELECT relid FROM pg_partition_tree('outbox_events')
			  UNION ALL
			  SELECT i.indexrelid FROM pg_partition_tree('outbox_events') p JOIN pg_index i ON i.indrelid = p.relid) t(r)`).Scan(&n))
		return n
	}
	before := read()
	rows, err := tx.Query(ctx, sql, args...)
	require.NoError(t, err)
	rows.Close()
	require.NoError(t, rows.Err())
	return read() - before
}

// TestBacklogStepsOverAnOpenTransaction: a producer's open transaction of
// 100k uncommitted rows past a drained position. The backlog, the gauges
// and the status statement step over its rows (its xid is in progress in
// their snapshot) instead of visiting each to find it invisible: ~5,400
// buffers more per read at 200k rows before 00026, each read's cost
// growing with the open transaction. The same rows come out: the open
// transaction sees its own, and every reader sees them once it commits.
func TestBacklogStepsOverAnOpenTransaction(t *testing.T) {
	t.Parallel()
	b, origin := queuedBundle(t)
	ctx := context.Background()
	b.insert(t, 20_000)
	b.drainedPast(t, origin, 20_000)
	b.insert(t, 100)
	open := b.openProducer(t, 100_000)
	b.Exec(t, `VACUUM ANALYZE outbox_events`)

	// Before 00026 each read visited the open transaction's 100k entries.
	check := func(when string, backlog int) {
		t.Helper()
		read := entriesRead(t, b, `SELECT count(*) FROM outbox_queue_backlog`)
		t.Logf("%s: backlog read %d index entries", when, read)
		require.Less(t, read, 1_000, "%s: the backlog walks the open transaction's rows", when)
		require.Equal(t, backlog, b.Int(t, `SELECT count(*) FROM outbox_queue_backlog`), when)
		read = entriesRead(t, b, outbox.GaugesSQL, 60.0, outbox.GaugeCountCap)
		t.Logf("%s: gauges read %d index entries", when, read)
		require.Less(t, read, 1_000, "%s: the gauges walk the open transaction's rows", when)
		read = entriesRead(t, b, outbox.SnapshotSQL, 60.0, false, 3600.0)
		t.Logf("%s: status read %d index entries", when, read)
		require.Less(t, read, 1_000, "%s: status walks the open transaction's rows", when)
	}
	// The open transaction began last: its xid is past every snapshot's
	// xmax until a later one commits.
	check("open transaction newest", 100)
	b.insert(t, 10)
	// Now its xid is in every later snapshot's list of transactions in
	// progress.
	check("open transaction in progress", 110)

	var own int
	require.NoError(t, open.QueryRow(ctx, `SELECT count(*) FROM outbox_queue_backlog`).Scan(&own))
	require.Equal(t, 100_110, own, "a transaction sees its own rows in the backlog")
	require.NoError(t, open.Commit(ctx))
	require.Equal(t, 100_110, b.Int(t, `SELECT count(*) FROM outbox_queue_backlog`), "committed, its rows are the backlog")
	s, err := outbox.TakeSnapshot(ctx, b.Pool, time.Minute)
	require.NoError(t, err)
	require.EqualValues(t, 100_110, s.Lag)
}

// TestStatusCountsRowsPastTheRetentionWithoutWalkingTheRest: status counts
// the queued rows older than the retention it is given, and when the
// oldest is younger it reads one row per projection, not each row the
// retention keeps (the count walked all of them: 100-150 ms at 1 M rows).
// Past RetentionCountCap it stops and says so.
func TestStatusCountsRowsPastTheRetentionWithoutWalkingTheRest(t *testing.T) {
	t.Parallel()
	b, origin := queuedBundle(t)
	ctx := context.Background()
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, created_at)
		SELECT 'book', 'old' || g, 'upsert', now() - interval '3 hours' FROM generate_series(1, 30) g`)
	b.insert(t, 50_000)
	b.drainedPast(t, origin, 50_030)
	b.Exec(t, `VACUUM ANALYZE outbox_events`)
	snapshot := func(retention time.Duration) outbox.Snapshot {
		s, err := outbox.TakeSnapshotWith(ctx, b.Pool, outbox.SnapshotOptions{MaxProcessing: time.Minute, Retention: retention})
		require.NoError(t, err)
		return s
	}
	s := snapshot(time.Hour)
	require.EqualValues(t, 30, s.DoneOverRetention)
	require.False(t, s.DoneOverRetentionCapped)
	require.Greater(t, s.OldestDoneAge, 2*time.Hour)

	b.Exec(t, `DELETE FROM outbox_events WHERE entity_id LIKE 'old%'`)
	b.Exec(t, `VACUUM ANALYZE outbox_events`)
	read := entriesRead(t, b, outbox.SnapshotSQL, 60.0, false, 3600.0)
	t.Logf("status over 50k queued rows younger than the retention read %d index entries", read)
	require.Less(t, read, 100, "status walks the rows the retention keeps")
	require.Zero(t, snapshot(time.Hour).DoneOverRetention)

	// A rotation long late: every row is past the retention. The count
	// walks the index in order and stops at the cap, not reading them all.
	b.Exec(t, `UPDATE outbox_events SET created_at = now() - interval '3 hours'`)
	b.Exec(t, `VACUUM ANALYZE outbox_events`)
	s = snapshot(time.Hour)
	require.EqualValues(t, outbox.RetentionCountCap, s.DoneOverRetention)
	require.True(t, s.DoneOverRetentionCapped)
	read = entriesRead(t, b, outbox.SnapshotSQL, 60.0, false, 3600.0)
	t.Logf("status over 50k queued rows all older than the retention read %d index entries", read)
	require.Less(t, read, 3*outbox.RetentionCountCap, "status reads every row past the retention")
}
