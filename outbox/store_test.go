package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/outbox"
)

type bundle struct{ harness.Outbox }

// setup is an outbox whose rows are claimed (inserted pending), for the
// claim's tests; queue_test.go's read queued ones.
func setup(t *testing.T) bundle {
	t.Helper()
	return bundle{harness.NewOutbox(t).ClaimedByDefault(t)}
}

// setupLeading is setup with w1 leading epoch and n pending books to claim.
func setupLeading(t *testing.T, epoch int64, n int) bundle {
	t.Helper()
	b := setup(t)
	b.Lead(t, epoch)
	b.insert(t, n)
	return b
}

func (b bundle) insert(t *testing.T, n int) {
	t.Helper()
	b.Exec(t, `
		INSERT INTO outbox_events (entity_type, entity_id, op, payload)
		SELECT 'book', g::text, 'upsert', jsonb_build_object('title', 'b' || g) FROM generate_series(1, $1) g`, n)
}

func (b bundle) statuses(t *testing.T) map[string]int {
	t.Helper()
	return harness.Pairs[string, int](t, b.DB, `SELECT status, count(*) FROM outbox_events GROUP BY status`)
}

// claim and the four below are the store's calls as the leader of epoch,
// failing the test on an error.
func (b bundle) claim(t *testing.T, epoch int64, limit int) []outbox.Event {
	t.Helper()
	events, err := b.Store.Claim(context.Background(), epoch, limit, time.Minute, []string{"search"})
	require.NoError(t, err)
	return events
}

// currentClaim is the claim that holds ids now, for the acks below: tests
// of a stale claim call the store themselves.
func (b bundle) currentClaim(t *testing.T, ids []int64) int64 {
	t.Helper()
	if len(ids) == 0 {
		return 0
	}
	var claim *int64
	require.NoError(t, b.DB.Pool.QueryRow(context.Background(), `SELECT claim_seq FROM outbox_events WHERE id = $1`, ids[0]).Scan(&claim))
	if claim == nil {
		return 0
	}
	return *claim
}

func (b bundle) ackDone(t *testing.T, epoch int64, ids, applied []int64) map[int64]float64 {
	t.Helper()
	acked, err := b.Store.AckDone(context.Background(), epoch, b.currentClaim(t, ids), ids, applied)
	require.NoError(t, err)
	return acked
}

func (b bundle) ackFailed(t *testing.T, epoch int64, failures ...outbox.Failure) []int64 {
	t.Helper()
	ids := make([]int64, len(failures))
	for i, f := range failures {
		ids[i] = f.ID
	}
	changed, err := b.Store.AckFailed(context.Background(), epoch, b.currentClaim(t, ids), failures)
	require.NoError(t, err)
	return changed
}

func (b bundle) release(t *testing.T, epoch int64, ids ...int64) []int64 {
	t.Helper()
	released, err := b.Store.Release(context.Background(), epoch, ids)
	require.NoError(t, err)
	return released
}

func (b bundle) reclaim(t *testing.T, epoch int64, maxProcessing time.Duration, maxAttempts int) outbox.ReclaimResult {
	t.Helper()
	res, err := b.Store.Reclaim(context.Background(), epoch, maxProcessing, maxAttempts)
	require.NoError(t, err)
	return res
}

func claimedIDs(events []outbox.Event) []int64 {
	return harness.Map(events, func(e outbox.Event) int64 { return e.ID })
}

func TestClaimInIDOrderAndAckDone(t *testing.T) {
	t.Parallel()
	b := setupLeading(t, 1, 5)

	events := b.claim(t, 1, 3)
	require.Len(t, events, 3)
	require.Equal(t, []int64{1, 2, 3}, claimedIDs(events))
	require.JSONEq(t, `{"title":"b1"}`, string(events[0].Payload))
	require.Equal(t, map[string]int{"processing": 3, "pending": 2}, b.statuses(t))

	require.Len(t, b.ackDone(t, 1, []int64{1, 2, 3}, nil), 3)
	require.Equal(t, map[string]int{"done": 3, "pending": 2}, b.statuses(t))
}

func TestClaimSkipsRowsNotYetDue(t *testing.T) {
	t.Parallel()
	b := setupLeading(t, 1, 2)
	b.Exec(t, `UPDATE outbox_events SET next_retry_at = now() + interval '1 hour' WHERE id = 1`)

	events := b.claim(t, 1, 10)
	require.Len(t, events, 1)
	require.EqualValues(t, 2, events[0].ID)
}

func TestStaleEpochIsFenced(t *testing.T) {
	t.Parallel()
	b := setupLeading(t, 1, 4)
	require.Len(t, b.claim(t, 1, 2), 2)

	// A new leader takes over: epoch 2.
	b.Lead(t, 2)

	require.Empty(t, b.claim(t, 1, 10), "a deposed leader claims nothing")
	require.Empty(t, b.ackDone(t, 1, []int64{1, 2}, nil), "a deposed leader's ack changes nothing")
	require.Empty(t, b.ackFailed(t, 1, outbox.Failure{ID: 1, Class: "deterministic", Reason: "mapping_error", Terminal: true}))
	require.Empty(t, b.release(t, 1, 1, 2))
	require.Equal(t, map[string]int{"processing": 2, "pending": 2}, b.statuses(t))

	// The new leader reclaims what the old one had in flight.
	res := b.reclaim(t, 2, time.Hour, 10)
	require.ElementsMatch(t, []outbox.Row{{ID: 1, Projection: "search"}, {ID: 2, Projection: "search"}}, res.Pending)
	require.Equal(t, map[string]int{"pending": 4}, b.statuses(t))
}

func TestAckFailedRetryKeepsHistory(t *testing.T) {
	t.Parallel()
	b := setupLeading(t, 1, 2)

	for attempt := 1; attempt <= 2; attempt++ {
		b.Exec(t, `UPDATE outbox_events SET next_retry_at = now()`)
		require.Len(t, b.claim(t, 1, 10), 2)
		require.Len(t, b.ackFailed(t, 1,
			outbox.Failure{ID: 1, Class: "transient", Reason: "server_error", Message: "503 attempt", RetryIn: time.Hour},
			outbox.Failure{ID: 2, Class: "deterministic", Reason: "mapping_error", Message: "strict", Terminal: attempt == 2, RetryIn: time.Hour},
		), 2)
	}

	ctx := context.Background()
	var status, reason string
	var attempts, historyLen int
	var retryIn float64
	require.NoError(t, b.Pool.QueryRow(ctx, `
		SELECT status, error_reason, attempts, jsonb_array_length(error_history),
		       extract(epoch FROM next_retry_at - now())
		FROM outbox_events WHERE id = 1`).Scan(&status, &reason, &attempts, &historyLen, &retryIn))
	require.Equal(t, "pending", status)
	require.Equal(t, "server_error", reason)
	require.Equal(t, 2, attempts)
	require.Equal(t, 2, historyLen, "every error is kept in the history")
	require.Greater(t, retryIn, 3500.0)

	require.NoError(t, b.Pool.QueryRow(ctx, `SELECT status, error_reason FROM outbox_events WHERE id = 2`).Scan(&status, &reason))
	require.Equal(t, "failed", status)
	require.Equal(t, "mapping_error", reason)
}

func TestReleaseDoesNotCountAnAttempt(t *testing.T) {
	t.Parallel()
	b := setupLeading(t, 3, 1)
	b.claim(t, 3, 10)
	require.Equal(t, []int64{1}, b.release(t, 3, 1))
	var attempts int
	var status string
	require.NoError(t, b.Pool.QueryRow(context.Background(), `SELECT status, attempts FROM outbox_events`).Scan(&status, &attempts))
	require.Equal(t, "pending", status)
	require.Zero(t, attempts)
}

func TestReclaimExpiredLeaseAndStuckCap(t *testing.T) {
	t.Parallel()
	b := setupLeading(t, 1, 3)
	b.claim(t, 1, 10)
	b.Exec(t, `
		UPDATE outbox_events SET lease_until = now() - interval '1 second' WHERE id = 1;
		UPDATE outbox_events SET processing_started_at = now() - interval '1 hour' WHERE id = 2;
		UPDATE outbox_events SET lease_until = now() - interval '1 second', attempts = 4 WHERE id = 3;`)

	res := b.reclaim(t, 1, 10*time.Minute, 5)
	require.ElementsMatch(t, []outbox.Row{{ID: 1, Projection: "search"}, {ID: 2, Projection: "search"}}, res.Pending)
	require.Equal(t, []outbox.Row{{ID: 3, Projection: "search"}}, res.Failed)

	var reason, event string
	require.NoError(t, b.Pool.QueryRow(context.Background(), `
		SELECT error_reason, error_history->-1->>'event' FROM outbox_events WHERE id = 3`).Scan(&reason, &event))
	require.Equal(t, "stuck", reason)
	require.Equal(t, "stuck_reclaimed", event)

	// Nothing left to reclaim: a second pass is a no-op.
	res = b.reclaim(t, 1, 10*time.Minute, 5)
	require.Empty(t, res.Pending)
	require.Empty(t, res.Failed)
}

// A lease runs out while the leader's own batch is in flight; the reclaimer
// returns the rows and the same leader, same epoch, claims them again. The
// first flight's late acks must match nothing: the rows belong to the
// second claim now.
func TestAckOfAnEarlierClaimInTheSameTermIsFenced(t *testing.T) {
	t.Parallel()
	b := setupLeading(t, 1, 2)
	ctx := context.Background()
	first := b.claim(t, 1, 10)
	require.Len(t, first, 2)
	b.Exec(t, `UPDATE outbox_events SET lease_until = now() - interval '1 second'`)
	require.Len(t, b.reclaim(t, 1, time.Hour, 10).Pending, 2)
	second := b.claim(t, 1, 10)
	require.Len(t, second, 2)
	require.NotEqual(t, first[0].Claim, second[0].Claim, "each claim has a token of its own")

	ids := []int64{first[0].ID, first[1].ID}
	acked, err := b.Store.AckDone(ctx, 1, first[0].Claim, ids, ids)
	require.NoError(t, err)
	require.Empty(t, acked, "the first flight's done ack is fenced")
	changed, err := b.Store.AckFailed(ctx, 1, first[0].Claim, []outbox.Failure{{ID: ids[0], Class: "deterministic", Reason: "mapping_error", Terminal: true}})
	require.NoError(t, err)
	require.Empty(t, changed, "the first flight's failure ack is fenced")
	require.Equal(t, map[string]int{"processing": 2}, b.statuses(t))
	require.Zero(t, b.Int(t, `SELECT count(*) FROM outbox_ledger_entries`), "a fenced ack moves no ledger entry")

	acked, err = b.Store.AckDone(ctx, 1, second[0].Claim, ids, ids)
	require.NoError(t, err)
	require.Len(t, acked, 2, "the second claim's ack goes through")
}

// A row done after failed attempts no longer carries their error: SQL triage
// by reason finds failing rows only. The history keeps the attempts.
func TestAckDoneClearsEarlierErrors(t *testing.T) {
	t.Parallel()
	b := harness.NewOutbox(t)
	b.Lead(t, 1)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, status, attempts, error_class, error_reason, last_error, error_history)
		VALUES ('book', '1', 'upsert', 'pending', 2, 'transient', 'timeout', 'deadline exceeded', '[{"event": "failed", "reason": "timeout"}]')`)
	events, err := b.Store.Claim(context.Background(), 1, 10, time.Minute, nil)
	require.NoError(t, err)
	require.Len(t, events, 1)
	_, err = b.Store.AckDone(context.Background(), 1, events[0].Claim, []int64{events[0].ID}, []int64{events[0].ID})
	require.NoError(t, err)
	require.Equal(t, 1, b.Count(t, `status = 'done' AND error_class IS NULL AND error_reason IS NULL AND last_error IS NULL
		AND error_history @> '[{"reason": "timeout"}]'`))
}
