package consume

import (
	"context"
	"testing"

	"github.com/VictoriaMetrics/metrics"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/classify"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
)

// The error counters are process-wide, so these tests are not parallel:
// Go runs them alone, before the parallel ones, and a delta is theirs.

// failUpdates makes Postgres refuse every update of an outbox row that
// matches when (a trigger's WHEN condition on OLD and NEW): a real fault
// of the statement that writes it, not a mock.
func failUpdates(t *testing.T, b bundle, when string) {
	t.Helper()
	b.Exec(t, `CREATE FUNCTION injected_fault() RETURNS trigger LANGUAGE plpgsql AS
		$$ BEGIN RAISE EXCEPTION 'injected fault'; END $$`)
	b.Exec(t, `CREATE TRIGGER injected_fault BEFORE UPDATE ON outbox_events FOR EACH ROW WHEN (`+when+`)
		EXECUTE FUNCTION injected_fault()`)
}

func delta(c *metrics.Counter, f func()) uint64 {
	before := c.Get()
	f()
	return c.Get() - before
}

// A claim that fails counts, as a leader on a schema missing a column its
// claim reads would fail every claim (column e.traceparent does not exist,
// on schema 14); a claim cut short by the end of the term does not.
func TestClaimErrorsAreCounted(t *testing.T) {
	b := setupClaimed(t)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', '1', 'upsert')`)
	loop, err := NewLoop(Config{}, b.Store, projection.Registry{"search": funcHandler(
		func(context.Context, outbox.Event) projection.Result { return projection.Result{} })}, zerolog.Nop())
	require.NoError(t, err)

	b.Exec(t, `ALTER TABLE outbox_events RENAME COLUMN traceparent TO traceparent_gone`)
	require.EqualValues(t, 1, delta(claimErrorsTotal, func() {
		_, err := loop.runOnce(context.Background(), 1)
		require.ErrorContains(t, err, "traceparent")
	}))
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	require.Zero(t, delta(claimErrorsTotal, func() {
		_, err := loop.runOnce(cancelled, 1)
		require.Error(t, err)
	}), "leadership lost or shutdown is no claim error")

	b.Exec(t, `ALTER TABLE outbox_events RENAME COLUMN traceparent_gone TO traceparent`)
	require.Zero(t, delta(claimErrorsTotal, func() {
		res, err := loop.runOnce(context.Background(), 1)
		require.NoError(t, err)
		require.Equal(t, 1, res.Done)
	}))
}

// An ack that fails counts, done or failed alike; the rows stay in
// processing for the lease to bring back.
func TestAckErrorsAreCounted(t *testing.T) {
	b := setupClaimed(t)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', 'ok', 'upsert'), ('book', 'bad', 'upsert')`)
	h := funcHandler(func(_ context.Context, e outbox.Event) projection.Result {
		if e.EntityID == "bad" {
			return projection.Result{Err: classify.New(classify.MappingError, "strict mapping")}
		}
		return projection.Result{}
	})
	loop, err := NewLoop(Config{}, b.Store, projection.Registry{"search": h}, zerolog.Nop())
	require.NoError(t, err)
	failUpdates(t, b, `OLD.status = 'processing' AND NEW.status IN ('done', 'failed')`)

	require.EqualValues(t, 2, delta(ackErrorsTotal, func() {
		res, err := loop.runOnce(context.Background(), 1)
		require.NoError(t, err, "the loop logs a failed ack and carries on")
		require.Equal(t, BatchResult{AckErrors: 2}, res)
	}), "the done ack and the failed ack")
	require.Equal(t, 2, b.Count(t, `status = 'processing'`))
}

// A reclaimer round that fails counts.
func TestReclaimErrorsAreCounted(t *testing.T) {
	b := setupClaimed(t)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, status, locked_by, claim_token, lease_until, processing_started_at)
		VALUES ('book', '1', 'upsert', 'processing', 'w0', 1, now() - interval '1 second', now())`)
	failUpdates(t, b, `OLD.status = 'processing' AND NEW.status = 'pending'`)
	r := NewReclaimer(Config{MaxAttempts: 5}, b.Store, zerolog.Nop())
	require.EqualValues(t, 1, delta(reclaimErrorsTotal, func() {
		_, err := r.runOnce(context.Background(), 1)
		require.ErrorContains(t, err, "injected fault")
	}))
	require.Equal(t, 1, b.Count(t, `status = 'processing'`), "nothing reclaimed")
}
