package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/replay"
)

func TestGaugesCountExactlyUpToTheCap(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Lead(t, 1)
	b.insert(t, 700)
	b.claim(t, 1, 200)

	g, err := outbox.ReadGauges(context.Background(), b.Pool, time.Minute)
	require.NoError(t, err)
	require.Equal(t, int64(500), g.Lag)
	require.False(t, g.LagEstimated)
	require.Equal(t, int64(200), g.InFlight)
	require.Zero(t, g.Stuck)
	require.Positive(t, g.OldestPendingAge)
}

// Above the cap the lag is estimated from the ids, and the reading touches
// a bounded number of pages however long the backlog: a count(*) of it is
// what the metrics poller ran every 5 s before.
func TestGaugesReadABoundedPartOfALongBacklog(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, 150_000)
	b.Exec(t, `VACUUM ANALYZE outbox_events`)

	g, err := outbox.ReadGauges(context.Background(), b.Pool, time.Minute)
	require.NoError(t, err)
	require.True(t, g.LagEstimated)
	require.Equal(t, int64(150_000), g.Lag, "consecutive pending ids: the estimate is exact")

	ctx := context.Background()
	rows, err := b.Pool.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+outbox.GaugesSQL, 60.0, outbox.GaugeCountCap)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	plan, buffers := planBuffers(t, lines)
	requireNoSeqScan(t, b, plan, "the gauges read the indexes")
	// The first 10k pending entries (~30 index pages, heap for their
	// created_at), not the 150k.
	require.Less(t, buffers, 1_000, plan)
}

// A month-old event replayed now waits from its replay: the oldest-pending
// age (the backlog alert's) and status's oldest do not jump a month.
func TestOldestPendingAgeCountsARevivedRowFromItsRevival(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, status, error_class, error_reason, created_at, updated_at)
		VALUES ('book', 'old', 'upsert', 'failed', 'transient', 'timeout', now() - interval '30 days', now() - interval '29 days')`)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, created_at) VALUES ('book', 'new', 'upsert', now() - interval '2 minutes')`)
	_, err := replay.Replay(ctx, b.Pool, replay.Request{Reason: "timeout", By: "t", Why: "engine back", Yes: true})
	require.NoError(t, err)

	g, err := outbox.ReadGauges(ctx, b.Pool, time.Minute)
	require.NoError(t, err)
	require.InDelta(t, (2 * time.Minute).Seconds(), g.OldestPendingAge.Seconds(), 30, "the fresh row is the oldest waiting")
	s, err := outbox.TakeSnapshot(ctx, b.Pool, time.Minute)
	require.NoError(t, err)
	require.InDelta(t, (2 * time.Minute).Seconds(), s.OldestPendingAge.Seconds(), 30)
}
