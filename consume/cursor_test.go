package consume

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
)

// The loop claims past the last row it claimed, so rows that fall due
// behind that point are taken by its regular claim from the head: a
// producer's transaction that commits late (its rows' next_retry_at is its
// start), and rows of a projection it has no handler for (failed
// unknown_projection, which only the head claim lists).
func TestRowsBehindTheCursorAreClaimedFromTheHead(t *testing.T) {
	t.Parallel()
	b := setupClaimed(t)
	h := funcHandler(func(context.Context, outbox.Event) projection.Result { return projection.Result{} })
	start(t, b, Config{PollInterval: 300 * time.Millisecond, UnknownWait: time.Millisecond}, projection.Registry{"search": h})

	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) SELECT 'book', g::text, 'upsert' FROM generate_series(1, 50) g`)
	harness.Eventually(t, 10*time.Second, "the first rows done", func() bool {
		return b.Count(t, `status = 'done'`) == 50
	})
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, next_retry_at, created_at)
		VALUES ('book', 'late', 'upsert', now() - interval '1 hour', now() - interval '1 hour')`)
	b.Exec(t, `INSERT INTO outbox_events (projection, entity_type, entity_id, op) VALUES ('ghost', 'book', 'g', 'upsert')`)
	harness.Eventually(t, 10*time.Second, "the late row done, the unknown projection's failed", func() bool {
		return b.Count(t, `entity_id = 'late' AND status = 'done'`) == 1 &&
			b.Count(t, `projection = 'ghost' AND status = 'failed' AND error_reason = 'unknown_projection'`) == 1
	})
}

// A backlog that falls due behind the cursor (here a producer's transaction
// of 200 rows that commits late) drains at the loop's rate once the head
// claim finds it, not one batch per poll interval: a head claim that comes
// back full is followed by another.
func TestBacklogBehindTheCursorDrainsAtFullRate(t *testing.T) {
	t.Parallel()
	b := setupClaimed(t)
	h := funcHandler(func(context.Context, outbox.Event) projection.Result { return projection.Result{} })
	poll := 2 * time.Second
	start(t, b, Config{BulkSize: 10, PollInterval: poll}, projection.Registry{"search": h})

	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', 'first', 'upsert')`)
	harness.Eventually(t, 10*time.Second, "the cursor past the first row", func() bool {
		return b.Count(t, `status = 'done'`) == 1
	})
	inserted := time.Now()
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, next_retry_at, created_at)
		SELECT 'book', 'late-' || g, 'upsert', now() - interval '1 hour', now() - interval '1 hour'
		  FROM generate_series(1, 200) g`)
	// One batch of 10 per poll interval would take 40 s.
	harness.Eventually(t, 4*poll, "200 rows behind the cursor done", func() bool {
		return b.Count(t, `status = 'done'`) == 201
	})
	t.Logf("200 rows behind the cursor drained in %s (poll interval %s, bulk 10)", time.Since(inserted), poll)
}

// A resume asks the leader, busy or idle, to claim from the head at once:
// the resumed projection's events are behind the cursor, which the other
// projection's events moved on while it was paused.
func TestResumeClaimsFromTheHeadAtOnce(t *testing.T) {
	t.Parallel()
	b := setupClaimed(t)
	ok := funcHandler(func(context.Context, outbox.Event) projection.Result { return projection.Result{} })
	known := []string{"search", "chronicle"}
	start(t, b, Config{BulkSize: 10, PollInterval: time.Minute}, projection.Registry{"search": ok, "chronicle": ok})
	ctx := context.Background()
	_, err := outbox.SetPaused(ctx, b.Pool, outbox.PauseRequest{Projection: "search", Paused: true, By: "t", Why: "test", Known: known})
	require.NoError(t, err)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) SELECT 'book', g::text, 'upsert' FROM generate_series(1, 200) g`)
	b.Exec(t, `INSERT INTO outbox_events (projection, entity_type, entity_id, op) VALUES ('chronicle', 'book', 'c', 'upsert')`)
	harness.Eventually(t, 10*time.Second, "the chronicle's event done past the paused ones", func() bool {
		return b.Count(t, `projection = 'chronicle' AND status = 'done'`) == 1
	})

	resumed := time.Now()
	_, err = outbox.SetPaused(ctx, b.Pool, outbox.PauseRequest{Projection: "search", Paused: false, By: "t", Why: "test", Known: known})
	require.NoError(t, err)
	// Without the head request the first of them waits a whole minute.
	harness.Eventually(t, 10*time.Second, "the resumed events done", func() bool {
		return b.Count(t, `projection = 'search' AND status = 'done'`) == 200
	})
	t.Logf("200 resumed events drained in %s (poll interval 1m, bulk 10)", time.Since(resumed))
}

// Queued events of a projection the loop has no handler for wait unread for
// UnknownWait (a leader that knows it may take over: a rolling restart
// adding it), while the known ones drain; then they fail as
// unknown_projection.
func TestUnknownProjectionWaitsBeforeFailing(t *testing.T) {
	t.Parallel()
	b := setup(t) // queued rows, as producers write them
	h := funcHandler(func(context.Context, outbox.Event) projection.Result { return projection.Result{} })
	const wait = 2 * time.Second
	start(t, b, Config{PollInterval: 100 * time.Millisecond, UnknownWait: wait}, projection.Registry{"search": h})

	inserted := time.Now()
	b.Exec(t, `INSERT INTO outbox_events (projection, entity_type, entity_id, op) VALUES ('ghost', 'book', 'g', 'upsert')`)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) SELECT 'book', g::text, 'upsert' FROM generate_series(1, 20) g`)
	harness.Eventually(t, 10*time.Second, "the known projection drains past it", func() bool {
		return b.Count(t, `projection = 'search' AND status = 'done'`) == 20
	})
	time.Sleep(time.Until(inserted.Add(wait / 2)))
	var status string
	var attempts int
	require.NoError(t, b.Pool.QueryRow(context.Background(), `SELECT status, attempts FROM outbox_event_states WHERE projection = 'ghost'`).
		Scan(&status, &attempts))
	require.Equal(t, "pending", status, "unread while it waits")
	require.Zero(t, attempts)
	harness.Eventually(t, 10*time.Second, "failed once the wait is over", func() bool {
		return b.Count(t, `projection = 'ghost' AND status = 'failed' AND error_reason = 'unknown_projection'`) == 1
	})
	require.GreaterOrEqual(t, time.Since(inserted), wait)
}

// Events of a projection the loop does not know are read once, then left
// unread until the newest of them is UnknownWait old: the loop does not
// fetch the same batch at every poll only to leave it again. A row aged
// meanwhile shows it: read again before then, it would be failed at once.
func TestUnknownProjectionIsNotReadAgainWhileItWaits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const wait = time.Hour
	h := funcHandler(func(context.Context, outbox.Event) projection.Result { return projection.Result{} })
	l, err := NewLoop(Config{UnknownWait: wait}, b.Store, projection.Registry{"search": h}, zerolog.Nop())
	require.NoError(t, err)
	b.Exec(t, `INSERT INTO outbox_events (projection, entity_type, entity_id, op) VALUES ('ghost', 'book', 'g', 'upsert')`)
	l.refreshQueues(ctx) // the term's start: the loop's own projections
	l.refreshQueues(ctx) // its next claim: the others producers name
	now := time.Now()
	events, err := l.readQueued(ctx, now)
	require.NoError(t, err)
	require.Empty(t, events, "left unread while it waits")

	b.Exec(t, `UPDATE outbox_events SET created_at = now() - interval '2 hours' WHERE projection = 'ghost'`)
	events, err = l.readQueued(ctx, now.Add(time.Minute))
	require.NoError(t, err)
	require.Empty(t, events, "not read again before the wait is over")
	events, err = l.readQueued(ctx, now.Add(wait+time.Second))
	require.NoError(t, err)
	require.Len(t, events, 1, "read again once it is over, and now old enough to fail")
}
