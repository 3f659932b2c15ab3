package consume

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
)

// counting is a projection that succeeds and counts what it was sent.
func counting(sent *atomic.Int64) funcHandler {
	return func(context.Context, outbox.Event) projection.Result {
		sent.Add(1)
		return projection.Result{}
	}
}

// versions is each outbox row's tuple (ctid and xmin): an update, HOT or
// not, gives a row a new one, and a delete removes it.
func versions(t *testing.T, b bundle) map[int64]string {
	t.Helper()
	return harness.Pairs[int64, string](t, b.DB, `SELECT id, ctid::text || '/' || xmin::text FROM outbox_events`)
}

// TestLoopDrainsQueuedRowsWithoutWritingThem: the running loop sends a
// thousand queued events and saves its position; none of their rows is
// updated or deleted, and each shows done.
func TestLoopDrainsQueuedRowsWithoutWritingThem(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var sent atomic.Int64
	h := counting(&sent)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op)
	           SELECT 'book', g::text, 'upsert' FROM generate_series(1, 1000) g`)
	before := versions(t, b)
	start(t, b, Config{BulkSize: 100}, projection.Registry{"search": h})
	harness.Drained(t, b.Pool, 30*time.Second)
	require.Equal(t, 1000, b.Count(t, `status = 'done' AND queued`))
	require.EqualValues(t, 1000, sent.Load(), "each event sent once")
	require.Equal(t, before, versions(t, b), "no outbox row updated or deleted")
	require.Equal(t, 1000, b.Int(t, `SELECT done_events::int FROM outbox_positions WHERE projection = 'search'`))
}

// TestLoopReadsALateCommitBehindItsPosition: a producer's transaction that
// took its id before others and commits after the loop passed them is sent.
func TestLoopReadsALateCommitBehindItsPosition(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	seen := make(chan string, 100)
	h := funcHandler(func(_ context.Context, e outbox.Event) projection.Result {
		seen <- e.EntityID
		return projection.Result{}
	})
	late, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	defer late.Rollback(ctx)
	_, err = late.Exec(ctx, `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', 'late', 'upsert')`)
	require.NoError(t, err)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', 'early', 'upsert')`)
	start(t, b, Config{PollInterval: 50 * time.Millisecond}, projection.Registry{"search": h})
	require.Equal(t, "early", <-seen)
	harness.Eventually(t, 10*time.Second, "the position saved past the later row", func() bool {
		return b.Count(t, `entity_id = 'early' AND status = 'done'`) == 1
	})
	require.NoError(t, late.Commit(ctx))
	select {
	case id := <-seen:
		require.Equal(t, "late", id)
	case <-time.After(10 * time.Second):
		t.Fatal("the late commit was never sent")
	}
	harness.Drained(t, b.Pool, 10*time.Second)
}

// TestLoopResumesFromTheSavedPosition: a new term reads on from what the
// last one saved, and sends nothing of what it confirmed again.
func TestLoopResumesFromTheSavedPosition(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var sent atomic.Int64
	h := counting(&sent)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) SELECT 'book', g::text, 'upsert' FROM generate_series(1, 50) g`)
	stop := start(t, b, Config{}, projection.Registry{"search": h})
	harness.Drained(t, b.Pool, 10*time.Second)
	stop()
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) SELECT 'book', g::text, 'upsert' FROM generate_series(51, 80) g`)
	start(t, b, Config{}, projection.Registry{"search": h})
	harness.Drained(t, b.Pool, 10*time.Second)
	require.EqualValues(t, 80, sent.Load())
}

// TestQueuedAckFailureIsReadAgain: the ack of a read of queued rows fails
// (the ledger cannot be written); the position stays behind them, and the
// next round reads and sends them again, then confirms them.
func TestQueuedAckFailureIsReadAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	search := &recorder{}
	loop, err := NewLoop(Config{}, b.Store, projection.Registry{"search": latestRecorder{search}}, zerolog.Nop())
	require.NoError(t, err)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version) VALUES ('book', '1', 'upsert', 1)`)
	b.Exec(t, `CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'refused'; END $$`)
	b.Exec(t, `CREATE TRIGGER refuse BEFORE INSERT ON outbox_ledger FOR EACH ROW EXECUTE FUNCTION refuse()`)

	res, err := loop.runOnce(context.Background(), 1)
	require.NoError(t, err)
	require.Equal(t, BatchResult{AckErrors: 1}, res)
	require.Equal(t, 1, b.Count(t, `status = 'pending'`), "not done: the position stayed")

	b.Exec(t, `DROP TRIGGER refuse ON outbox_ledger`)
	res, err = loop.runOnce(context.Background(), 1)
	require.NoError(t, err)
	require.Equal(t, BatchResult{Done: 1}, res, "read again")
	require.Len(t, search.sent, 2, "sent twice: the engine's versions make the second a no-op")
	require.Equal(t, 1, b.Count(t, `status = 'done'`))
}

// TestDeposedLeadersQueuedAcksAreFenced: the old leader's bulk of queued
// rows comes back after a new leader took the epoch; its acks and its
// position are refused, and the new leader reads the rows from the last
// saved position and finishes them.
func TestDeposedLeadersQueuedAcksAreFenced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', 'a', 'upsert'), ('book', 'b', 'upsert')`)
	entered, release := make(chan struct{}, 2), make(chan struct{})
	old := funcHandler(func(_ context.Context, e outbox.Event) projection.Result {
		entered <- struct{}{}
		<-release
		return projection.Result{}
	})
	loop, err := NewLoop(Config{}, b.Store, projection.Registry{"search": old}, zerolog.Nop())
	require.NoError(t, err)
	got := make(chan BatchResult, 1)
	go func() {
		res, err := loop.runOnce(context.Background(), 1)
		if err != nil {
			t.Errorf("runOnce: %v", err)
		}
		got <- res
	}()
	<-entered
	takeOver(t, b)
	close(release)
	require.Equal(t, BatchResult{Fenced: 2}, <-got)
	// It may have saved its read as in flight before the takeover; it
	// confirmed nothing after it.
	require.Zero(t, b.Int(t, `SELECT count(*) FROM outbox_positions WHERE done_events > 0`), "the deposed leader confirmed nothing")
	require.Zero(t, b.Count(t, `status = 'done'`))

	var sent atomic.Int64
	next := &outbox.Store{Pool: b.Pool, Owner: "w2", LeaderName: "test"}
	fresh, err := NewLoop(Config{}, next, projection.Registry{"search": counting(&sent)}, zerolog.Nop())
	require.NoError(t, err)
	res, err := fresh.runOnce(context.Background(), 2)
	require.NoError(t, err)
	require.Equal(t, BatchResult{Done: 2}, res)
	require.Equal(t, 2, b.Count(t, `status = 'done'`))
	require.Equal(t, []string{"w2"}, harness.Column[string](t, b.DB, `SELECT saved_by FROM outbox_positions`))
}

// TestQueueStateErrorsAreCounted: when the queue's state cannot be read (a
// grant missing, a table gone), queued rows go unread; each failed read
// counts as a claim error, for the alert, and the claim of pending rows
// goes on.
func TestQueueStateErrorsAreCounted(t *testing.T) {
	b := setup(t)
	loop := withTableGone(t, b, "outbox_queue_origin")
	require.EqualValues(t, 1, delta(claimErrorsTotal, func() {
		res, err := loop.runOnce(context.Background(), 1)
		require.NoError(t, err)
		require.Equal(t, BatchResult{Done: 1}, res, "the pending row is claimed all the same")
	}))
}

// TestLedgerNotTakenCountsOneClaimError: a turn whose LoadQueue cannot
// take the ledger, nor the TakeLedger after it, counts one claim error
// (the take's), not one for each, and claims nothing.
func TestLedgerNotTakenCountsOneClaimError(t *testing.T) {
	b := setup(t)
	loop := withTableGone(t, b, "outbox_ledger_rotation")
	require.EqualValues(t, 1, delta(claimErrorsTotal, func() {
		res, _ := loop.runOnce(context.Background(), 1)
		require.Equal(t, BatchResult{}, res, "nothing is claimed before the ledger is taken")
	}))
	require.Equal(t, 1, b.Count(t, `status = 'pending'`))
}

// withTableGone renames table away, as a grant missing or a schema behind
// would leave it unreadable, and returns a loop whose projection succeeds,
// with one pending row to claim.
func withTableGone(t *testing.T, b bundle, table string) *Loop {
	t.Helper()
	b.Exec(t, `ALTER TABLE `+table+` RENAME TO `+table+`_gone`)
	loop, err := NewLoop(Config{}, b.Store, projection.Registry{"search": funcHandler(func(context.Context, outbox.Event) projection.Result {
		return projection.Result{}
	})}, zerolog.Nop())
	require.NoError(t, err)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, status) VALUES ('book', 'claimed', 'upsert', 'pending')`)
	return loop
}

// TestDrainLeavesNoQueuedRowInFlight: a leader drained with a read of
// queued rows it never sent saves a position that shows none of them in
// flight (they are pending, for the next leader), and an idle leader then
// writes its position no more.
func TestDrainLeavesNoQueuedRowInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h, entered := hangingHandler()
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) SELECT 'book', g::text, 'upsert' FROM generate_series(1, 30) g`)
	stop := start(t, b, Config{BulkSize: 10, Concurrency: 1, ShutdownGrace: time.Second}, projection.Registry{"search": h})
	<-entered
	harness.Eventually(t, 10*time.Second, "a checkpoint shows rows in flight", func() bool {
		return b.Count(t, `status = 'processing'`) > 0
	})
	stop()
	require.Zero(t, b.Count(t, `status = 'processing'`), "nothing left in flight by a stopped leader")
	require.Equal(t, 30, b.Count(t, `status = 'pending'`))
	require.Equal(t, []bool{true}, harness.Column[bool](t, b.DB, `SELECT locked_by IS NULL FROM outbox_positions`))
}

// TestIdleLeaderWritesNoPosition: once a leader has nothing to read, its
// position row is not written again, however often it looks.
func TestIdleLeaderWritesNoPosition(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', '1', 'upsert')`)
	var sent atomic.Int64
	start(t, b, Config{PollInterval: 20 * time.Millisecond}, projection.Registry{"search": counting(&sent)})
	harness.Eventually(t, 10*time.Second, "the position saved done, nothing in flight", func() bool {
		return b.Int(t, `SELECT count(*) FROM outbox_positions WHERE done_events = 1 AND locked_by IS NULL`) == 1
	})
	saved := harness.Column[string](t, b.DB, `SELECT ctid::text FROM outbox_positions`)
	time.Sleep(2 * time.Second) // a hundred polls: what is checked is that nothing happens meanwhile
	require.Equal(t, saved, harness.Column[string](t, b.DB, `SELECT ctid::text FROM outbox_positions`), "no new version of the position")
}
