package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/harness"
	"github.com/wlproj/wlproj/outbox"
)

type bundle struct {
	db    harness.DB
	store *outbox.Store
}

func setup(t *testing.T) bundle {
	t.Helper()
	db := harness.NewDatabase(t)
	return bundle{db: db, store: &outbox.Store{Pool: db.Pool, Owner: "w1", LeaderName: "test"}}
}

func (b bundle) setEpoch(t *testing.T, epoch int64) {
	t.Helper()
	_, err := b.db.Pool.Exec(context.Background(), `
		INSERT INTO outbox_leader (name, holder, epoch) VALUES ('test', 'w1', $1)
		ON CONFLICT (name) DO UPDATE SET epoch = excluded.epoch`, epoch)
	require.NoError(t, err)
}

func (b bundle) insert(t *testing.T, n int) {
	t.Helper()
	_, err := b.db.Pool.Exec(context.Background(), `
		INSERT INTO outbox_events (entity_type, entity_id, op, payload)
		SELECT 'book', g::text, 'upsert', jsonb_build_object('title', 'b' || g) FROM generate_series(1, $1) g`, n)
	require.NoError(t, err)
}

func (b bundle) statuses(t *testing.T) map[string]int {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), `SELECT status, count(*) FROM outbox_events GROUP BY status`)
	require.NoError(t, err)
	defer rows.Close()
	got := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		require.NoError(t, rows.Scan(&s, &n))
		got[s] = n
	}
	return got
}

func TestClaimInIDOrderAndAckDone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.setEpoch(t, 1)
	b.insert(t, 5)

	events, err := b.store.Claim(ctx, 1, 3, time.Minute)
	require.NoError(t, err)
	require.Len(t, events, 3)
	require.Equal(t, []int64{1, 2, 3}, []int64{events[0].ID, events[1].ID, events[2].ID})
	require.JSONEq(t, `{"title":"b1"}`, string(events[0].Payload))
	require.Equal(t, map[string]int{"processing": 3, "pending": 2}, b.statuses(t))

	acked, err := b.store.AckDone(ctx, 1, []int64{1, 2, 3}, nil)
	require.NoError(t, err)
	require.Len(t, acked, 3)
	require.Equal(t, map[string]int{"done": 3, "pending": 2}, b.statuses(t))
}

func TestClaimSkipsRowsNotYetDue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.setEpoch(t, 1)
	b.insert(t, 2)
	_, err := b.db.Pool.Exec(ctx, `UPDATE outbox_events SET next_retry_at = now() + interval '1 hour' WHERE id = 1`)
	require.NoError(t, err)

	events, err := b.store.Claim(ctx, 1, 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, events, 1)
	require.EqualValues(t, 2, events[0].ID)
}

func TestStaleEpochIsFenced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.setEpoch(t, 1)
	b.insert(t, 4)
	events, err := b.store.Claim(ctx, 1, 2, time.Minute)
	require.NoError(t, err)
	require.Len(t, events, 2)

	// A new leader takes over: epoch 2.
	b.setEpoch(t, 2)

	stale, err := b.store.Claim(ctx, 1, 10, time.Minute)
	require.NoError(t, err)
	require.Empty(t, stale, "a deposed leader claims nothing")

	acked, err := b.store.AckDone(ctx, 1, []int64{1, 2}, nil)
	require.NoError(t, err)
	require.Empty(t, acked, "a deposed leader's ack changes nothing")

	changed, err := b.store.AckFailed(ctx, 1, []outbox.Failure{{ID: 1, Class: "deterministic", Reason: "mapping_error", Terminal: true}})
	require.NoError(t, err)
	require.Empty(t, changed)
	released, err := b.store.Release(ctx, 1, []int64{1, 2})
	require.NoError(t, err)
	require.Empty(t, released)
	require.Equal(t, map[string]int{"processing": 2, "pending": 2}, b.statuses(t))

	// The new leader reclaims what the old one had in flight.
	res, err := b.store.Reclaim(ctx, 2, time.Hour, 10)
	require.NoError(t, err)
	require.ElementsMatch(t, []outbox.Row{{ID: 1, Projection: "search"}, {ID: 2, Projection: "search"}}, res.Pending)
	require.Equal(t, map[string]int{"pending": 4}, b.statuses(t))
}

func TestAckFailedRetryKeepsHistory(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.setEpoch(t, 1)
	b.insert(t, 2)

	for attempt := 1; attempt <= 2; attempt++ {
		_, err := b.db.Pool.Exec(ctx, `UPDATE outbox_events SET next_retry_at = now()`)
		require.NoError(t, err)
		events, err := b.store.Claim(ctx, 1, 10, time.Minute)
		require.NoError(t, err)
		require.Len(t, events, 2)
		changed, err := b.store.AckFailed(ctx, 1, []outbox.Failure{
			{ID: 1, Class: "transient", Reason: "server_error", Message: "503 attempt", RetryIn: time.Hour},
			{ID: 2, Class: "deterministic", Reason: "mapping_error", Message: "strict", Terminal: attempt == 2, RetryIn: time.Hour},
		})
		require.NoError(t, err)
		require.Len(t, changed, 2)
	}

	var status, reason string
	var attempts, historyLen int
	var retryIn float64
	require.NoError(t, b.db.Pool.QueryRow(ctx, `
		SELECT status, error_reason, attempts, jsonb_array_length(error_history),
		       extract(epoch FROM next_retry_at - now())
		FROM outbox_events WHERE id = 1`).Scan(&status, &reason, &attempts, &historyLen, &retryIn))
	require.Equal(t, "pending", status)
	require.Equal(t, "server_error", reason)
	require.Equal(t, 2, attempts)
	require.Equal(t, 2, historyLen, "every error is kept in the history")
	require.Greater(t, retryIn, 3500.0)

	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT status, error_reason FROM outbox_events WHERE id = 2`).Scan(&status, &reason))
	require.Equal(t, "failed", status)
	require.Equal(t, "mapping_error", reason)
}

func TestReleaseDoesNotCountAnAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.setEpoch(t, 3)
	b.insert(t, 1)
	_, err := b.store.Claim(ctx, 3, 10, time.Minute)
	require.NoError(t, err)
	released, err := b.store.Release(ctx, 3, []int64{1})
	require.NoError(t, err)
	require.Equal(t, []int64{1}, released)
	var attempts int
	var status string
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT status, attempts FROM outbox_events`).Scan(&status, &attempts))
	require.Equal(t, "pending", status)
	require.Zero(t, attempts)
}

func TestReclaimExpiredLeaseAndStuckCap(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.setEpoch(t, 1)
	b.insert(t, 3)
	_, err := b.store.Claim(ctx, 1, 10, time.Minute)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, `
		UPDATE outbox_events SET lease_until = now() - interval '1 second' WHERE id = 1;
		UPDATE outbox_events SET processing_started_at = now() - interval '1 hour' WHERE id = 2;
		UPDATE outbox_events SET lease_until = now() - interval '1 second', attempts = 4 WHERE id = 3;`)
	require.NoError(t, err)

	res, err := b.store.Reclaim(ctx, 1, 10*time.Minute, 5)
	require.NoError(t, err)
	require.ElementsMatch(t, []outbox.Row{{ID: 1, Projection: "search"}, {ID: 2, Projection: "search"}}, res.Pending)
	require.Equal(t, []outbox.Row{{ID: 3, Projection: "search"}}, res.Failed)

	var reason, event string
	require.NoError(t, b.db.Pool.QueryRow(ctx, `
		SELECT error_reason, error_history->-1->>'event' FROM outbox_events WHERE id = 3`).Scan(&reason, &event))
	require.Equal(t, "stuck", reason)
	require.Equal(t, "stuck_reclaimed", event)

	// Nothing left to reclaim: a second pass is a no-op.
	res, err = b.store.Reclaim(ctx, 1, 10*time.Minute, 5)
	require.NoError(t, err)
	require.Empty(t, res.Pending)
	require.Empty(t, res.Failed)
}
