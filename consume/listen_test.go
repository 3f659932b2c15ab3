package consume

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
)

// listenerQuery is the last statement of the loop's listening backend:
// 'LISTEN …' or 'UNLISTEN …'.
func listenerQuery(t *testing.T, b bundle) string {
	t.Helper()
	var q string
	require.NoError(t, b.Pool.QueryRow(context.Background(), `SELECT coalesce(max(query), '') FROM pg_stat_activity
		WHERE datname = current_database() AND query LIKE '%LISTEN `+outbox.NotifyChannel+`'`).Scan(&q))
	return q
}

// While claims come back full enough the loop claims after each cooldown
// anyway, so it stops listening: every insert's NOTIFY would wake the
// listening backend for nothing. Once a claim finds nothing it listens
// again, and a lone insert then wakes it long before the poll would.
func TestListenerQuietWhileBusyAndBackOnIdle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	var first sync.Once
	entered := make(chan struct{})
	got := make(chan time.Time, 1000)
	h := handlerFunc(func(_ context.Context, events []outbox.Event) []projection.Result {
		first.Do(func() { close(entered); <-release })
		results := make([]projection.Result, len(events))
		for i, e := range events {
			results[i] = projection.Result{ID: e.ID}
			got <- time.Now()
		}
		return results
	})
	// The claim after the full one comes a cooldown later, finds nothing and
	// listens again, in-flight batch or not: the longest cooldown leaves a
	// second to see the loop quiet.
	start(t, b, Config{PollInterval: time.Minute, ClaimCooldown: time.Second}, projection.Registry{"search": h})
	var unblock sync.Once
	t.Cleanup(func() { unblock.Do(func() { close(release) }) }) // before the loop's drain, which waits for the handler
	harness.Eventually(t, 5*time.Second, "listening at start", func() bool {
		return listenerQuery(t, b) == "LISTEN "+outbox.NotifyChannel
	})

	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op)
		SELECT 'book', g::text, 'upsert' FROM generate_series(1, $1) g`, quietAfter*3)
	<-entered
	harness.Eventually(t, 5*time.Second, "quiet while a full claim is in flight", func() bool {
		return listenerQuery(t, b) == "UNLISTEN "+outbox.NotifyChannel
	})
	unblock.Do(func() { close(release) })
	harness.Eventually(t, 10*time.Second, "all done", func() bool { return b.Count(t, `status = 'done'`) == quietAfter*3 })
	harness.Eventually(t, 5*time.Second, "listening again once a claim found nothing", func() bool {
		return listenerQuery(t, b) == "LISTEN "+outbox.NotifyChannel
	})
	for len(got) > 0 {
		<-got
	}
	inserted := time.Now()
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', 'lone', 'upsert')`)
	select {
	case at := <-got:
		require.Less(t, at.Sub(inserted), 5*time.Second)
	case <-time.After(10 * time.Second):
		t.Fatal("no NOTIFY woke the loop after it listened again; the one-minute poll would have")
	}
}

// A row inserted after the claim that found nothing and before LISTEN took
// effect sends its NOTIFY to nobody; the wake-up that follows LISTEN still
// has it claimed at once, not at the next poll (a minute away here).
func TestListenerSwitchLosesNoWakeUp(t *testing.T) {
	t.Parallel()
	b := setup(t)
	got := make(chan string, 1000)
	h := funcHandler(func(_ context.Context, e outbox.Event) projection.Result {
		got <- e.EntityID
		return projection.Result{}
	})
	var listens atomic.Int32
	start(t, b, Config{PollInterval: time.Minute, ClaimCooldown: 5 * time.Millisecond}, projection.Registry{"search": h},
		func(l *Loop) {
			l.beforeListen = func() {
				if listens.Add(1) == 2 { // the LISTEN after the burst below
					b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', 'unheard', 'upsert')`)
				}
			}
		})
	harness.Eventually(t, 5*time.Second, "listening at start", func() bool {
		return listenerQuery(t, b) == "LISTEN "+outbox.NotifyChannel
	})
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op)
		SELECT 'book', g::text, 'upsert' FROM generate_series(1, $1) g`, quietAfter*3)
	deadline := time.After(10 * time.Second)
	for {
		select {
		case id := <-got:
			if id == "unheard" {
				require.EqualValues(t, 2, listens.Load())
				return
			}
		case <-deadline:
			t.Fatalf("the row inserted while the listener switched back on waited for the poll (LISTENs: %d)", listens.Load())
		}
	}
}

// Quiet means listening to no channel at all: Postgres wakes every backend
// that listens in the database at each NOTIFY, whatever its channel, so a
// busy leader that kept to the head channel alone was woken by every insert.
func TestQuietListenerListensToNoChannel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	loop, err := NewLoop(Config{}, b.Store, projection.Registry{}, zerolog.Nop())
	require.NoError(t, err)
	conn, err := b.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	defer conn.Conn().Close(ctx) //nolint:errcheck // it listened: not back to the pool
	listening := func() []string {
		rows, err := conn.Query(ctx, `SELECT pg_listening_channels() ORDER BY 1`)
		require.NoError(t, err)
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return names
	}
	require.NoError(t, loop.setListening(ctx, conn.Conn(), true))
	require.ElementsMatch(t, []string{outbox.HeadChannel, outbox.NotifyChannel}, listening())
	require.NoError(t, loop.setListening(ctx, conn.Conn(), false))
	require.Empty(t, listening())
}
