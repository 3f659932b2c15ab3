package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/outbox"
)

// seedStatuses inserts rows and moves them into every status with plain SQL,
// the way the daemon would leave them.
func seedStatuses(t *testing.T, db harness.DB) {
	t.Helper()
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `
		INSERT INTO outbox_events (entity_type, entity_id, op, created_at)
		SELECT 'book', g::text, 'upsert', now() - make_interval(mins => 100 - g) FROM generate_series(1, 20) g`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `
		UPDATE outbox_events SET status = 'done', processed_at = now() WHERE id <= 5;
		UPDATE outbox_events SET status = 'processing', locked_by = 'w1', claim_token = 1,
			lease_until = now() + interval '1 minute', processing_started_at = now() WHERE id IN (6, 7);
		-- Stuck by lease.
		UPDATE outbox_events SET status = 'processing', locked_by = 'w1', claim_token = 1,
			lease_until = now() - interval '1 second', processing_started_at = now() - interval '10 seconds' WHERE id = 8;
		-- Stuck by the max-processing cap, lease still live.
		UPDATE outbox_events SET status = 'processing', locked_by = 'w1', claim_token = 1,
			lease_until = now() + interval '1 minute', processing_started_at = now() - interval '10 minutes' WHERE id = 9;
		UPDATE outbox_events SET status = 'failed', error_class = 'transient', error_reason = 'timeout' WHERE id IN (10, 11, 12);
		UPDATE outbox_events SET status = 'failed', error_class = 'deterministic', error_reason = 'mapping_error',
			projection = 'chronicle' WHERE id = 13;`)
	require.NoError(t, err)
}

func TestSnapshotCounts(t *testing.T) {
	t.Parallel()
	db := harness.NewDatabase(t)
	ctx := context.Background()
	seedStatuses(t, db)

	s, err := outbox.TakeSnapshotWith(ctx, db.Pool, outbox.SnapshotOptions{MaxProcessing: 5 * time.Minute, ExactDone: true})
	require.NoError(t, err)
	require.Equal(t, map[string]int64{"pending": 7, "processing": 4, "done": 5, "failed": 4, "discarded": 0}, s.Counts)
	require.True(t, s.DoneExact)
	require.EqualValues(t, 7, s.Lag)
	require.EqualValues(t, 4, s.InFlight)
	require.EqualValues(t, 2, s.Stuck, "one expired lease, one past the cap")
	// The oldest pending row is id 14, inserted 86 minutes ago.
	require.InDelta(t, (86 * time.Minute).Seconds(), s.OldestPendingAge.Seconds(), 5)
	require.Equal(t, []outbox.ReasonCount{
		{Projection: "search", Reason: "timeout", Count: 3},
		{Projection: "chronicle", Reason: "mapping_error", Count: 1},
	}, s.TopFailedReasons)
	require.Nil(t, s.Leader)

	// A longer cap leaves only the expired lease stuck.
	s, err = outbox.TakeSnapshot(ctx, db.Pool, time.Hour)
	require.NoError(t, err)
	require.EqualValues(t, 1, s.Stuck)
	require.False(t, s.DoneExact)
	require.Len(t, s.Counts, 5)
	require.GreaterOrEqual(t, s.Counts["done"], int64(0))

	// The estimate is the partitions' statistics: the parent has none.
	db.Exec(t, `ANALYZE outbox_events`)
	s, err = outbox.TakeSnapshot(ctx, db.Pool, time.Hour)
	require.NoError(t, err)
	require.Positive(t, s.Counts["done"], "the estimate sums the partitions")
}

func TestSnapshotEmpty(t *testing.T) {
	t.Parallel()
	db := harness.NewDatabase(t)
	s, err := outbox.TakeSnapshot(context.Background(), db.Pool, time.Minute)
	require.NoError(t, err)
	require.Equal(t, map[string]int64{"pending": 0, "processing": 0, "done": 0, "failed": 0, "discarded": 0}, s.Counts)
	require.Zero(t, s.OldestPendingAge)
	require.Empty(t, s.TopFailedReasons)
	require.Nil(t, s.Leader)
}

func TestSnapshotLeader(t *testing.T) {
	t.Parallel()
	// The two names hash to a negative and a positive lock key.
	for _, name := range []string{"wlproj", "a"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := harness.NewDatabase(t)
			ctx := context.Background()
			_, err := db.Pool.Exec(ctx, `INSERT INTO outbox_leader (name, holder, epoch) VALUES ($1, 'worker-a', 7)`, name)
			require.NoError(t, err)

			s, err := outbox.TakeSnapshot(ctx, db.Pool, time.Minute)
			require.NoError(t, err)
			require.NotNil(t, s.Leader)
			require.Equal(t, "worker-a", s.Leader.Holder)
			require.EqualValues(t, 7, s.Leader.Epoch)
			require.False(t, s.Leader.Active, "no session holds the lock")

			// Hold the lock the way the elector does.
			conn, err := pgx.Connect(ctx, db.URL)
			require.NoError(t, err)
			t.Cleanup(func() { conn.Close(context.Background()) })
			_, err = conn.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended($1, 0))`, name)
			require.NoError(t, err)

			s, err = outbox.TakeSnapshot(ctx, db.Pool, time.Minute)
			require.NoError(t, err)
			require.True(t, s.Leader.Active)
			require.WithinDuration(t, time.Now(), s.Leader.AcquiredAt, time.Minute)
		})
	}
}

func TestSnapshotInTx(t *testing.T) {
	t.Parallel()
	db := harness.NewDatabase(t)
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	var q outbox.Querier = tx
	_, err = outbox.TakeSnapshot(ctx, q, time.Minute)
	require.NoError(t, err)
}

// Per projection: the known ones even when idle, any other with pending
// rows, and who paused which, why and since when.
func TestSnapshotByProjection(t *testing.T) {
	t.Parallel()
	db := harness.NewDatabase(t)
	ctx := context.Background()
	seedStatuses(t, db) // 7 pending search rows, the oldest 86 minutes old
	_, err := db.Pool.Exec(ctx, `
		INSERT INTO outbox_events (projection, entity_type, entity_id, op, created_at)
		SELECT 'chronicle', 'book', g::text, 'upsert', now() - interval '10 minutes' FROM generate_series(1, 3) g;
		INSERT INTO outbox_events (projection, entity_type, entity_id, op) VALUES ('retired', 'book', 'x', 'upsert')`)
	require.NoError(t, err)
	_, err = outbox.SetPaused(ctx, db.Pool, outbox.PauseRequest{Projection: "chronicle", Paused: true, By: "alice", Why: "INC-7", Known: []string{"chronicle"}})
	require.NoError(t, err)

	s, err := outbox.TakeSnapshot(ctx, db.Pool, time.Minute)
	require.NoError(t, err)
	require.Nil(t, s.Projections, "only on request: it reads every pending row")

	s, err = outbox.TakeSnapshotWith(ctx, db.Pool, outbox.SnapshotOptions{Projections: []string{"search", "chronicle", "idle"}})
	require.NoError(t, err)
	require.Len(t, s.Projections, 4)
	byName := map[string]outbox.ProjectionLag{}
	for _, p := range s.Projections {
		byName[p.Projection] = p
	}
	require.Equal(t, []string{"chronicle", "idle", "retired", "search"},
		[]string{s.Projections[0].Projection, s.Projections[1].Projection, s.Projections[2].Projection, s.Projections[3].Projection})
	require.EqualValues(t, 7, byName["search"].Pending)
	require.InDelta(t, (86 * time.Minute).Seconds(), byName["search"].OldestPendingAge.Seconds(), 5)
	require.False(t, byName["search"].State.Paused)
	c := byName["chronicle"]
	require.EqualValues(t, 3, c.Pending)
	require.InDelta(t, (10 * time.Minute).Seconds(), c.OldestPendingAge.Seconds(), 5)
	require.True(t, c.State.Paused)
	require.Equal(t, "alice", c.State.ChangedBy)
	require.Equal(t, "INC-7", c.State.Why)
	require.WithinDuration(t, s.TakenAt, c.State.ChangedAt, time.Minute)
	require.Equal(t, outbox.ProjectionLag{Projection: "idle", State: outbox.ProjectionState{Projection: "idle"}}, byName["idle"])
	require.EqualValues(t, 1, byName["retired"].Pending)
}
