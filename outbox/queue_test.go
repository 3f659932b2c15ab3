package outbox_test

import (
	"context"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/outbox"
)

// queuedBundle is an outbox led by w1 in epoch 1, with the origin every
// projection's position starts from.
func queuedBundle(t *testing.T) (bundle, outbox.Position) {
	t.Helper()
	b := bundle{harness.NewOutbox(t)}
	b.Lead(t, 1)
	origin, err := b.Store.Origin(context.Background())
	require.NoError(t, err)
	require.NotNil(t, origin, "migration 00018 records the origin")
	return b, *origin
}

func (b bundle) read(t *testing.T, from outbox.Position, limit int) ([]outbox.Event, outbox.Position) {
	t.Helper()
	events, to, err := b.Store.ReadQueued(context.Background(), "search", from, limit, true)
	require.NoError(t, err)
	return events, to
}

func entityIDs(events []outbox.Event) []string {
	ids := make([]string, len(events))
	for i, e := range events {
		ids[i] = e.EntityID
	}
	return ids
}

// TestReadQueuedNeverSkipsALateCommit: a producer's transaction that took
// its id first and commits after a later one is read in the next batch,
// not left behind the position (an id cursor would have passed it).
func TestReadQueuedNeverSkipsALateCommit(t *testing.T) {
	t.Parallel()
	b, origin := queuedBundle(t)
	ctx := context.Background()
	late, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	defer late.Rollback(ctx)
	_, err = late.Exec(ctx, `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', 'late', 'upsert')`)
	require.NoError(t, err)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', 'early', 'upsert')`)

	events, p1 := b.read(t, origin, 10)
	require.Equal(t, []string{"early"}, entityIDs(events), "the open transaction's row is not visible yet")
	require.True(t, events[0].Queued)
	events, p2 := b.read(t, p1, 10)
	require.Empty(t, events)

	require.NoError(t, late.Commit(ctx))
	events, p3 := b.read(t, p2, 10)
	require.Equal(t, []string{"late"}, entityIDs(events), "the late commit is read after the position passed a later id")
	events, _ = b.read(t, p3, 10)
	require.Empty(t, events, "each row is read once")
}

// TestReadQueuedPagesInsideABatch: a batch larger than the limit is read in
// pages, each past the last, in (xid, id) order, and a rolled back row is
// never read.
func TestReadQueuedPagesInsideABatch(t *testing.T) {
	t.Parallel()
	b, origin := queuedBundle(t)
	b.insert(t, 5)
	ctx := context.Background()
	aborted, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = aborted.Exec(ctx, `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', 'aborted', 'upsert')`)
	require.NoError(t, err)
	require.NoError(t, aborted.Rollback(ctx))
	b.insert(t, 2)

	var got []string
	pos := origin
	for range 5 {
		events, to := b.read(t, pos, 2)
		got, pos = append(got, entityIDs(events)...), to
	}
	require.Equal(t, []string{"1", "2", "3", "4", "5", "1", "2"}, got)
}

// TestReadQueuedGivesEachEventItsOwnFields: the read reuses its scan
// targets from row to row; each event still keeps its own payload,
// version, scope and ledger entry, and a row without one has none.
func TestReadQueuedGivesEachEventItsOwnFields(t *testing.T) {
	t.Parallel()
	b, origin := queuedBundle(t)
	b.Exec(t, `INSERT INTO outbox_ledger (projection, entity_type, entity_id, version, deleted, event_id)
	            VALUES ('search', 'book', 'a', 7, true, 70)`)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload, scope_key)
	            VALUES ('book', 'a', 'upsert', 8, '{"n": 1}', 'lib-1'), ('book', 'b', 'upsert', NULL, '{"n": 22}', NULL)`)
	events, _ := b.read(t, origin, 10)
	require.Len(t, events, 2)
	a, c := events[0], events[1]
	require.JSONEq(t, `{"n": 1}`, string(a.Payload))
	require.JSONEq(t, `{"n": 22}`, string(c.Payload))
	require.Equal(t, int64(8), *a.EventVersion)
	require.Nil(t, c.EventVersion)
	require.Equal(t, "lib-1", *a.ScopeKey)
	require.Nil(t, c.ScopeKey)
	require.Equal(t, &outbox.Applied{Version: 7, EventID: 70, Deleted: true}, a.Applied)
	require.Nil(t, c.Applied, "b has no ledger entry; a's must not carry over")
}

// TestReadQueuedSkipsAPausedProjection: a paused projection reads nothing
// and its position stays; resumed, it reads from there.
func TestReadQueuedSkipsAPausedProjection(t *testing.T) {
	t.Parallel()
	b, origin := queuedBundle(t)
	b.insert(t, 3)
	b.Exec(t, `INSERT INTO outbox_projection_state (projection, paused, changed_by, why) VALUES ('search', true, 't', 'test')`)
	events, to := b.read(t, origin, 10)
	require.Empty(t, events)
	require.Equal(t, origin, to)
	b.Exec(t, `UPDATE outbox_projection_state SET paused = false`)
	events, _ = b.read(t, to, 10)
	require.Len(t, events, 3)
}

// TestQueuedSuccessWritesNoRow: reading, acking and saving the position of
// a thousand queued rows, twice for the same documents, updates and
// deletes none of them nor any ledger row (the ledger only takes inserts),
// and the operator's view shows them done once the checkpoint is saved.
func TestQueuedSuccessWritesNoRow(t *testing.T) {
	t.Parallel()
	b, from := queuedBundle(t)
	for round := 1; round <= 2; round++ {
		b.insert(t, 1000)
		require.Equal(t, 1000, b.states(t)["pending"])
		from = b.drainQueued(t, from, 1000)
		require.Equal(t, map[string]int{"done": 1000 * round}, b.states(t))
		require.Equal(t, map[string]int{"queued": 1000 * round}, b.statuses(t), "no row was written")
	}
	require.Equal(t, []int{1000}, harness.Column[int](t, b.DB,
		`SELECT count(*) FROM outbox_ledger_entries WHERE event_id > 1000`), "every document's entry is its second event's")
	// The statistics reach pg_stat a moment after the acks' transactions.
	var changed int
	require.Eventually(t, func() bool {
		var inserted int
		require.NoError(t, b.Pool.QueryRow(context.Background(), `
			SELECT sum(n_tup_ins), sum(n_tup_upd + n_tup_del) FROM pg_stat_user_tables
			 WHERE relid IN (SELECT relid FROM pg_partition_tree('outbox_ledger'))`).Scan(&inserted, &changed))
		return inserted == 2000
	}, 10*time.Second, 50*time.Millisecond, "two acks of 1000 documents insert 2000 ledger rows")
	require.Zero(t, changed, "no ledger row was updated or deleted")
}

// drainQueued reads, acks and confirms n queued rows past from, and returns
// the position past them.
func (b bundle) drainQueued(t *testing.T, from outbox.Position, n int) outbox.Position {
	t.Helper()
	ctx := context.Background()
	var events []outbox.Event
	to := from
	for range 3 { // a read ends at its batch's end: the next starts the next batch
		if len(events) == n {
			break
		}
		page, next := b.read(t, to, n-len(events))
		events, to = append(events, page...), next
	}
	require.Len(t, events, n)
	ids := claimedIDs(events)
	acked, err := b.Store.AckQueuedDone(ctx, 1, ids, ids)
	require.NoError(t, err)
	require.Len(t, acked, n)
	saved, err := b.Store.SaveCheckpoints(ctx, 1, time.Minute, []outbox.Checkpoint{{Projection: "search", Done: to, Claimed: to, DoneEvents: int64(n)}})
	require.NoError(t, err)
	require.Equal(t, 1, saved)
	return to
}

// TestQueuedAckFencedByEpoch: a deposed leader's acks and checkpoints
// change nothing.
func TestQueuedAckFencedByEpoch(t *testing.T) {
	t.Parallel()
	b, origin := queuedBundle(t)
	ctx := context.Background()
	b.insert(t, 3)
	events, to := b.read(t, origin, 10)
	b.Lead(t, 2)
	acked, err := b.Store.AckQueuedDone(ctx, 1, []int64{events[0].ID}, nil)
	require.ErrorIs(t, err, outbox.ErrDeposed, "refused by the guard, not a row that left the queue")
	require.Empty(t, acked)
	failed, err := b.Store.AckQueuedFailed(ctx, 1, []outbox.Failure{{ID: events[1].ID, Class: "transient", Reason: "timeout", RetryIn: time.Second}})
	require.ErrorIs(t, err, outbox.ErrDeposed)
	require.Empty(t, failed)
	saved, err := b.Store.SaveCheckpoints(ctx, 1, time.Minute, []outbox.Checkpoint{{Projection: "search", Done: to, Claimed: to}})
	require.NoError(t, err)
	require.Zero(t, saved)
	require.Equal(t, map[string]int{"pending": 3}, b.states(t))
}

// TestQueuedFailureBecomesAClaimedRow: a queued row that fails gets its
// first write, as pending with its backoff or failed, and the position no
// longer decides its state.
func TestQueuedFailureBecomesAClaimedRow(t *testing.T) {
	t.Parallel()
	b, origin := queuedBundle(t)
	ctx := context.Background()
	b.insert(t, 2)
	events, to := b.read(t, origin, 10)
	changed, err := b.Store.AckQueuedFailed(ctx, 1, []outbox.Failure{
		{ID: events[0].ID, Class: "transient", Reason: "timeout", RetryIn: time.Hour},
		{ID: events[1].ID, Class: "deterministic", Reason: "mapping", Terminal: true},
	})
	require.NoError(t, err)
	require.ElementsMatch(t, []int64{events[0].ID, events[1].ID}, changed)
	_, err = b.Store.SaveCheckpoints(ctx, 1, time.Minute, []outbox.Checkpoint{{Projection: "search", Done: to, Claimed: to}})
	require.NoError(t, err)
	require.Equal(t, map[string]int{"pending": 1, "failed": 1}, b.states(t))
	require.Equal(t, []int{1}, harness.Column[int](t, b.DB, `SELECT attempts FROM outbox_events WHERE id = $1`, events[0].ID))
}

func (b bundle) states(t *testing.T) map[string]int {
	t.Helper()
	return harness.Pairs[string, int](t, b.DB, `SELECT status, count(*) FROM outbox_event_states GROUP BY status`)
}

// TestStatusAndGaugesCountQueuedRowsByPosition: queued rows count as
// pending until read, processing while their batch is in flight, and
// neither once the position is past them.
func TestStatusAndGaugesCountQueuedRowsByPosition(t *testing.T) {
	t.Parallel()
	b, origin := queuedBundle(t)
	ctx := context.Background()
	b.insert(t, 10)
	_, p1 := b.read(t, origin, 4)
	_, err := b.Store.SaveCheckpoints(ctx, 1, time.Minute, []outbox.Checkpoint{
		{Projection: "search", Done: origin, Claimed: p1, InFlightSince: time.Now()}})
	require.NoError(t, err)
	counts := func() (pending, processing int64, g outbox.Gauges) {
		s, err := outbox.TakeSnapshot(ctx, b.Pool, time.Minute)
		require.NoError(t, err)
		g, err = outbox.ReadGauges(ctx, b.Pool, time.Minute)
		require.NoError(t, err)
		return s.Counts["pending"], s.Counts["processing"], g
	}
	pending, processing, g := counts()
	require.Equal(t, [2]int64{6, 4}, [2]int64{pending, processing})
	require.Equal(t, [2]int64{6, 4}, [2]int64{g.Lag, g.InFlight})
	require.Equal(t, 4, b.Count(t, `status = 'processing' AND locked_by = 'w1' AND lease_until > now()`))

	_, err = b.Store.SaveCheckpoints(ctx, 1, time.Minute, []outbox.Checkpoint{{Projection: "search", Done: p1, Claimed: p1, DoneEvents: 4}})
	require.NoError(t, err)
	pending, processing, g = counts()
	require.Equal(t, [2]int64{6, 0}, [2]int64{pending, processing})
	require.Equal(t, [2]int64{6, 0}, [2]int64{g.Lag, g.InFlight})
	require.Equal(t, 4, b.Count(t, `status = 'done'`))
}

// TestReadQueuedPlanWalksOnlyWhatItReturns: 50k queued rows in one batch,
// read from a position 40k rows in: the read walks outbox_events_queued_idx
// from the position and visits about the rows it returns, whatever the
// statistics say, with no sequential scan or sort of the batch; and the
// backlog view the gauges read walks only the 10k rows past the position.
func TestReadQueuedPlanWalksOnlyWhatItReturns(t *testing.T) {
	t.Parallel()
	b, origin := queuedBundle(t)
	ctx := context.Background()
	for range 5 {
		b.insert(t, 10_000)
	}
	events, pos := b.read(t, origin, 40_000)
	require.Len(t, events, 40_000)
	_, err := b.Store.SaveCheckpoints(ctx, 1, time.Minute, []outbox.Checkpoint{{Projection: "search", Done: pos, Claimed: pos}})
	require.NoError(t, err)
	b.Exec(t, `ANALYZE outbox_events`)
	plan, _, buffers := explainAnalyze(t, b, outbox.ReadQueuedLedgerSQL, []any{pgx.NamedArgs{
		"projection": "search", "tick": false, "cur": pos.Cur, "prev": pos.Prev, "xid": pos.XID, "after_id": pos.ID,
		"limit": 500}}, outbox.QueuedPlan[1:])
	require.Regexp(t, `outbox_events_\d_queued_idx`, plan)
	requireNoSeqScan(t, b, plan, "the read walks the index")
	require.Less(t, heapFetches(plan)+rowsRemoved(plan)+joinRowsRemoved(plan), 2_000, plan)
	require.Less(t, buffers, 5_000, plan)

	// The backlog is a function (its plan settings hold inside it): what it
	// walks shows in the buffers it touched, about those of the 10k rows
	// past the position (~580 pages with the plan's own); walking the 40k
	// behind it too made ~1,300 more.
	backlog, _, backlogBuffers := explainAnalyze(t, b, `SELECT count(*) FROM outbox_queue_backlog`, nil, nil)
	t.Logf("backlog of 10k past a position 40k rows in: %d buffers", backlogBuffers)
	require.Less(t, backlogBuffers, 900, "the rows behind the position are not walked\n%s", backlog)
	require.Equal(t, 10_000, b.Int(t, `SELECT count(*) FROM outbox_queue_backlog`))
}

// TestReadQueuedFromANewBatchWalksOnlyWhatItReturns: a drained position
// (every read of a steady stream ends its batch) starts the next batch at
// xmax of its snapshot. The read and the backlog start their index walk
// there, not at the projection's oldest queued row: with (0, 0) as the
// position's row bound, they walked every queued row kept for the
// retention, 11k buffers a read at 3.5 M rows in the held soak, growing
// with the table.
func TestReadQueuedFromANewBatchWalksOnlyWhatItReturns(t *testing.T) {
	t.Parallel()
	b, origin := queuedBundle(t)
	ctx := context.Background()
	for range 20 {
		b.insert(t, 10_000)
	}
	events, pos := b.read(t, origin, 300_000)
	require.Len(t, events, 200_000)
	require.Equal(t, pos.Drained(), pos)
	_, err := b.Store.SaveCheckpoints(ctx, 1, time.Minute, []outbox.Checkpoint{{Projection: "search", Done: pos, Claimed: pos}})
	require.NoError(t, err)
	b.insert(t, 200)
	b.Exec(t, `VACUUM ANALYZE outbox_events`)
	// Without the ledger's lookups (three index probes a row, whatever the
	// position), what is left is the walk of the outbox.
	plan, _, buffers := explainAnalyze(t, b, outbox.ReadQueuedSQL, []any{pgx.NamedArgs{
		"projection": "search", "tick": true, "cur": pos.Cur, "prev": pos.Cur, "xid": pos.XID, "after_id": pos.ID,
		"limit": 500}}, outbox.QueuedPlan[1:])
	require.Contains(t, plan, "rows=200 loops=1", plan)
	require.Less(t, buffers, 100, "the 200k rows behind the position are not walked\n%s", plan)
	backlog, _, backlogBuffers := explainAnalyze(t, b, `SELECT count(*) FROM outbox_queue_backlog`, nil, nil)
	// ~330 buffers: the function's own plan and the 200 rows; walking the
	// 200k behind too made ~1,000 more.
	require.Less(t, backlogBuffers, 600, "the 200k rows behind the position are not walked\n%s", backlog)
	require.Equal(t, 200, b.Int(t, `SELECT count(*) FROM outbox_queue_backlog`))
}

var joinRowsRemovedLine = regexp.MustCompile(`Rows Removed by Join Filter: (\d+)`)

// joinRowsRemoved sums the rows a plan's joins read and dropped: the late
// transactions' rows compared with an array were dropped by a join filter
// after a walk of the whole backlog past the position.
func joinRowsRemoved(plan string) int {
	n := 0
	for _, m := range joinRowsRemovedLine.FindAllStringSubmatch(plan, -1) {
		v, _ := strconv.Atoi(m[1])
		n += v
	}
	return n
}

// The leader's ack of a row that left the queue meanwhile (an earlier
// read's failure made it pending) misses that row without an error: the
// guard held, and the read may be confirmed.
func TestQueuedAckOfARowNoLongerQueued(t *testing.T) {
	t.Parallel()
	b, origin := queuedBundle(t)
	ctx := context.Background()
	b.insert(t, 2)
	events, _ := b.read(t, origin, 10)
	changed, err := b.Store.AckQueuedFailed(ctx, 1, []outbox.Failure{{ID: events[0].ID, Class: "transient", Reason: "timeout", RetryIn: time.Hour}})
	require.NoError(t, err)
	require.Len(t, changed, 1)
	acked, err := b.Store.AckQueuedDone(ctx, 1, claimedIDs(events), claimedIDs(events))
	require.NoError(t, err)
	require.Equal(t, []int64{events[1].ID}, slices.Collect(maps.Keys(acked)))
	again, err := b.Store.AckQueuedFailed(ctx, 1, []outbox.Failure{{ID: events[0].ID, Class: "transient", Reason: "timeout", RetryIn: time.Hour}})
	require.NoError(t, err)
	require.Empty(t, again)
}
