package consume

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
)

// The loop's paths that runOnce alone does not take, each against the real
// engine and ending with the verdict.

// runLoop runs loop as leader of epoch 1 until the test ends or the
// returned function drains it.
func runLoop(t *testing.T, loop *Loop) (drainAndWait func()) {
	t.Helper()
	drain, done := make(chan struct{}), make(chan struct{})
	go func() { defer close(done); loop.Run(context.Background(), 1, drain) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			close(drain)
			<-done
		}
	}
	t.Cleanup(stop)
	return stop
}

// Two batches in flight through Run: the first deletes a book, the second,
// claimed while the first is in the engine, carries an older upsert of it,
// with the ledger entry its claim read before the delete was acked. The
// second waits for the first and takes its ledger advance, so the upsert is
// dropped unsent, though the engine has forgotten the delete by then.
func TestLoopOrdersTwoBatchesInFlight(t *testing.T) {
	t.Parallel()
	f := newEngineFixture(t)
	f.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload)
		VALUES ('book', '1', 'upsert', 1, '{"title": "Dune"}')`)
	require.Equal(t, BatchResult{Done: 1}, f.round(t))
	var del, upsert int64
	require.NoError(t, f.Pool.QueryRow(context.Background(), `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload)
		VALUES ('book', '1', 'delete', 3, '{}') RETURNING id`).Scan(&del))
	require.NoError(t, f.Pool.QueryRow(context.Background(), `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload)
		VALUES ('book', '1', 'upsert', 2, '{"title": "Dune, late"}') RETURNING id`).Scan(&upsert))

	release := make(chan struct{})
	var sent []int64 // written by the loop's goroutines one at a time: the second waits for the first
	var forgot error
	h := &hooked{Search: f.search(t), before: func(call int, events []outbox.Event) {
		sent = append(sent, harness.Map(events, func(e outbox.Event) int64 { return e.ID })...)
		if call == 1 {
			<-release // the delete's bulk stays in flight until the upsert is claimed
			return
		}
		forgot = harness.ForgetDeletes(context.Background(), f.base, f.index, 10*time.Second)
	}}
	loop, err := NewLoop(Config{BulkSize: 1, Concurrency: 2, PollInterval: 20 * time.Millisecond},
		f.Store, projection.Registry{"search": h}, zerolog.Nop())
	require.NoError(t, err)
	stop := runLoop(t, loop)
	harness.Eventually(t, 5*time.Second, "the upsert claimed behind the delete", func() bool {
		return f.Count(t, `id = $1 AND status = 'processing'`, upsert) == 1
	})
	require.Equal(t, 1, f.Count(t, `id = $1 AND status = 'processing'`, del), "the delete is still in flight")
	close(release)
	harness.Drained(t, f.Pool, 10*time.Second)
	stop()

	require.NoError(t, forgot)
	require.Equal(t, []int64{del}, sent, "the older upsert never reaches the engine")
	require.Equal(t, 1, f.Count(t, `id = $1 AND status = 'done'`, upsert))
	require.False(t, f.present(t, "book:1"))
	harness.Verified(t, f.Pool, f.index)
}

// A handler that returns no result for an event: the loop fails it as
// unknown (transient) at once, and it is retried and done, not left in
// processing until a lease an hour away.
func TestLoopRetriesAnEventTheHandlerDropped(t *testing.T) {
	t.Parallel()
	f := newEngineFixture(t)
	f.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload) VALUES
		('book', 'kept', 'upsert', 1, '{"title": "Kept"}'), ('book', 'dropped', 'upsert', 1, '{"title": "Dropped"}')`)
	dropped := int64(f.Int(t, `SELECT id FROM outbox_events WHERE entity_id = 'dropped'`))
	h := &hooked{Search: f.search(t), after: func(call int, results []projection.Result) []projection.Result {
		if call > 1 {
			return results
		}
		return slices.DeleteFunc(results, func(r projection.Result) bool { return r.ID == dropped })
	}}
	loop, err := NewLoop(Config{Lease: time.Hour, BaseBackoff: 10 * time.Millisecond, MaxBackoff: 10 * time.Millisecond,
		PollInterval: 20 * time.Millisecond}, f.Store, projection.Registry{"search": h}, zerolog.Nop())
	require.NoError(t, err)
	stop := runLoop(t, loop)
	harness.Drained(t, f.Pool, 10*time.Second)
	stop()

	require.Equal(t, 1, f.Count(t, `entity_id = 'dropped' AND status = 'done' AND attempts = 1
		AND error_history->0->>'reason' = 'unknown' AND error_history->0->>'class' = 'transient'`))
	require.Equal(t, 1, f.Count(t, `entity_id = 'kept' AND status = 'done' AND attempts = 0`))
	harness.Verified(t, f.Pool, f.index)
}

// The acks of a batch fail (the loop's pool is gone after the bulk): the
// rows stay processing, the lease runs out, the reclaimer returns them and
// the next round finishes them. Nothing is lost.
func TestLoopAckFailureComesBackThroughTheLease(t *testing.T) {
	t.Parallel()
	f := newEngineFixture(t)
	f.ClaimedByDefault(t) // the lease is a claimed row's; queued_test.go has the queued rows' rewind
	pool, err := pgxpool.New(context.Background(), f.URL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	f.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload) VALUES
		('book', 'good', 'upsert', 1, '{"title": "Good"}'), ('book', 'bad', 'upsert', 1, '{"title": "Bad", "isbn": "x"}')`)
	h := &hooked{Search: f.search(t), after: func(_ int, results []projection.Result) []projection.Result {
		pool.Close() // Postgres is gone by the time the bulk answers
		return results
	}}
	store := &outbox.Store{Pool: pool, Owner: "w1", LeaderName: "test"}
	loop, err := NewLoop(Config{Lease: time.Second, MaxAttempts: 5}, store, projection.Registry{"search": h}, zerolog.Nop())
	require.NoError(t, err)
	res, err := loop.runOnce(context.Background(), 1)
	require.NoError(t, err)
	require.Equal(t, BatchResult{AckErrors: 2}, res, "neither ack was written")
	require.Equal(t, 2, f.Count(t, `status = 'processing' AND attempts = 0`))
	require.True(t, f.present(t, "book:good"), "the bulk itself went through")

	harness.Eventually(t, 5*time.Second, "the lease ran out", func() bool {
		return f.Count(t, `status = 'processing' AND lease_until < now()`) == 2
	})
	reclaimed, err := NewReclaimer(Config{MaxAttempts: 5}, f.Store, zerolog.Nop()).runOnce(context.Background(), 1)
	require.NoError(t, err)
	require.Len(t, reclaimed.Pending, 2)
	require.Equal(t, BatchResult{Done: 1, Failed: 1}, f.round(t))
	require.Equal(t, 2, f.Count(t, `attempts >= 1 AND error_history @> '[{"event": "stuck_reclaimed"}]'`))
	harness.Verified(t, f.Pool, f.index, harness.ExpectFailed(t, f.DB, "mapping_error", `entity_id = 'bad'`)...)
}
