package consume

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
)

// TestABatchFreesItsBulkLaneBeforeItsAcks: with one bulk lane, the first
// batch's writes return and its acks wait (on a lock of the ledger); the
// next batch's writes go out meanwhile, so the engine does not wait on
// Postgres. Held through the acks, the lane let through 5 events of 10.
func TestABatchFreesItsBulkLaneBeforeItsAcks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	written := make(chan string, 100)
	h := funcHandler(func(_ context.Context, e outbox.Event) projection.Result {
		written <- e.EntityID
		return projection.Result{}
	})
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version)
		SELECT 'book', g::text, 'upsert', 1 FROM generate_series(1, 10) g`)
	ctx := context.Background()
	hold, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = hold.Rollback(ctx) }()
	_, err = hold.Exec(ctx, `LOCK TABLE outbox_ledger IN SHARE MODE`)
	require.NoError(t, err)

	stop := start(t, b, Config{BulkSize: 5, Concurrency: 1, PollInterval: 20 * time.Millisecond},
		projection.Registry{"search": h})
	for i := range 10 {
		select {
		case <-written:
		case <-time.After(10 * time.Second):
			t.Fatalf("%d events of 10 written while the first batch's acks wait", i)
		}
	}
	// Asked on the holding transaction: the acks waiting hold the pool's
	// connections.
	var done int
	require.NoError(t, hold.QueryRow(ctx, `SELECT count(*) FROM outbox_event_states WHERE status = 'done'`).Scan(&done))
	require.Zero(t, done, "the acks waited on the lock")
	require.NoError(t, hold.Rollback(ctx))
	harness.Eventually(t, 10*time.Second, "every event acked once the lock goes", func() bool {
		return b.Count(t, `status = 'done'`) == 10
	})
	stop()
}
