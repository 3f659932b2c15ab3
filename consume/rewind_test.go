package consume

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/classify"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
)

// latestFunc is a funcHandler that keeps a ledger, as search does.
type latestFunc struct{ funcHandler }

func (latestFunc) LatestOnly() bool { return true }

// rewindSetup is a loop reading one queued row per batch, over a
// latest-only projection h, whose ledger refuses entity '2' until the
// test drops the refuse trigger: the ack of a batch holding it fails.
func rewindSetup(t *testing.T, h funcHandler) (bundle, *Loop) {
	t.Helper()
	b := setup(t)
	loop, err := NewLoop(Config{BulkSize: 1}, b.Store, projection.Registry{"search": latestFunc{h}}, zerolog.Nop())
	require.NoError(t, err)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version) VALUES ('book', '1', 'upsert', 1)`)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version) VALUES ('book', '2', 'upsert', 1)`)
	b.Exec(t, `CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
	           BEGIN IF NEW.entity_id = '2' THEN RAISE EXCEPTION 'refused'; END IF; RETURN NEW; END $$`)
	b.Exec(t, `CREATE TRIGGER refuse BEFORE INSERT ON outbox_ledger FOR EACH ROW EXECUTE FUNCTION refuse()`)
	return b, loop
}

// claimFlight claims the loop's next batch and checks its entities.
func claimFlight(t *testing.T, loop *Loop, entities ...string) *flight {
	t.Helper()
	f, err := loop.claim(context.Background(), 1)
	require.NoError(t, err)
	require.NotNil(t, f)
	var got []string
	for _, e := range f.events {
		got = append(got, e.EntityID)
	}
	require.Equal(t, entities, got)
	return f
}

// handled processes a claimed batch.
func handled(t *testing.T, loop *Loop, f *flight) BatchResult {
	t.Helper()
	res, err := loop.handle(context.Background(), 1, f)
	require.NoError(t, err)
	return res
}

// Two reads in flight, F1 = [1] and F2 = [2]; F2's ack fails and the queue
// rewinds; the read again, G1 = [1, 2, 3], starts at the same row as F1.
// F1's ack then confirms F1 only: it must not confirm G1, whose rows 2
// and 3 were never acked (the position would pass them, and they would
// show done, with no ledger entry and never in the index).
func TestEarlierReadDoesNotConfirmTheReadAgain(t *testing.T) {
	t.Parallel()
	b, loop := rewindSetup(t, func(context.Context, outbox.Event) projection.Result { return projection.Result{} })
	f1 := claimFlight(t, loop, "1")
	f2 := claimFlight(t, loop, "2")
	require.Equal(t, BatchResult{AckErrors: 1}, handled(t, loop, f2))

	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version) VALUES ('book', '3', 'upsert', 1)`)
	loop.cfg.BulkSize = 3
	g1 := claimFlight(t, loop, "1", "2", "3")
	require.Equal(t, BatchResult{Done: 1}, handled(t, loop, f1))
	loop.checkpoint(context.Background(), 1, true)
	require.Zero(t, b.Count(t, `status = 'done' AND entity_id IN ('2', '3')`), "rows never acked are not passed")

	b.Exec(t, `DROP TRIGGER refuse ON outbox_ledger`)
	require.Equal(t, BatchResult{Done: 3, Superseded: 1}, handled(t, loop, g1), "row 1 is in the ledger since F1")
	loop.checkpoint(context.Background(), 1, true)
	require.Equal(t, 3, b.Count(t, `status = 'done'`))
	require.Equal(t, 3, b.Int(t, `SELECT count(DISTINCT entity_id)::int FROM outbox_ledger`), "each done row's version is in the ledger")
}

// F1 = [1] and F2 = [2] in flight; F2's ack fails and the queue rewinds;
// the read again, G1 = [1, 2, 3], takes row 1 while F1 still holds it.
// F1's 503 then makes row 1 pending (a claimed row from now on), so G1's
// ack finds it no longer queued. G1 must still be confirmed: its other
// rows are done, row 1 retries through the claim path, and the position
// goes on (before, G1 stayed in flight for the rest of the term: every
// later row showed processing and the rotation was held).
func TestReadWhoseRowLeftTheQueueIsConfirmed(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	b, loop := rewindSetup(t, func(_ context.Context, e outbox.Event) projection.Result {
		if e.EntityID == "1" && calls.Add(1) == 1 {
			return projection.Result{Err: classify.New(classify.ServerError, "503")}
		}
		return projection.Result{}
	})
	f1 := claimFlight(t, loop, "1")
	f2 := claimFlight(t, loop, "2")
	require.Equal(t, BatchResult{AckErrors: 1}, handled(t, loop, f2))

	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version) VALUES ('book', '3', 'upsert', 1)`)
	loop.cfg.BulkSize = 3
	g1 := claimFlight(t, loop, "1", "2", "3")
	require.Equal(t, BatchResult{Retried: 1}, handled(t, loop, f1))
	b.Exec(t, `DROP TRIGGER refuse ON outbox_ledger`)
	require.Equal(t, BatchResult{Done: 2, Unqueued: 1}, handled(t, loop, g1))
	loop.checkpoint(context.Background(), 1, true)
	require.Equal(t, map[string]string{"1": "pending", "2": "done", "3": "done"},
		statesByEntity(t, b), "the read confirmed; row 1 is the claim path's")

	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version) VALUES ('book', '4', 'upsert', 1)`)
	b.Exec(t, `UPDATE outbox_events SET next_retry_at = now() WHERE entity_id = '1'`)
	for range 3 {
		_, err := loop.runOnce(context.Background(), 1)
		require.NoError(t, err)
	}
	require.Equal(t, map[string]string{"1": "done", "2": "done", "3": "done", "4": "done"}, statesByEntity(t, b))
}

// statesByEntity is each row's status by its entity id.
func statesByEntity(t *testing.T, b bundle) map[string]string {
	t.Helper()
	rows, err := b.Pool.Query(context.Background(), `SELECT entity_id, status FROM outbox_event_states`)
	require.NoError(t, err)
	out := map[string]string{}
	for rows.Next() {
		var id, status string
		require.NoError(t, rows.Scan(&id, &status))
		out[id] = status
	}
	require.NoError(t, rows.Err())
	return out
}
