package consume

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
)

// A new term's start, as a takeover needs it: the loop reads while the
// term's preparation (the search index's set-up) runs, its first read is of
// queued rows, not a claim from the head, and nothing goes to a projection
// before the preparation is done. Started reports the first batch once,
// after it was processed.
func TestTermReadsQueuedRowsFirstWhilePreparingAndSendsAfter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', 'queued', 'upsert')`)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, status) VALUES ('book', 'claimed', 'upsert', 'pending')`)
	var mu sync.Mutex
	var sent []string
	h := funcHandler(func(_ context.Context, e outbox.Event) projection.Result {
		mu.Lock()
		defer mu.Unlock()
		sent = append(sent, e.EntityID)
		return projection.Result{}
	})
	sentSoFar := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), sent...)
	}
	loop, err := NewLoop(Config{Concurrency: 1, PollInterval: 20 * time.Millisecond}, b.Store, projection.Registry{"search": h}, zerolog.Nop())
	require.NoError(t, err)
	release := make(chan struct{})
	var started atomic.Int32
	term := TermStart{
		Prepare: func(ctx context.Context) { <-release },
		Started: func() { started.Add(1) },
	}
	drain, done := make(chan struct{}), make(chan struct{})
	go func() { defer close(done); loop.RunWith(context.Background(), 1, drain, term) }()
	t.Cleanup(func() { close(drain); <-done })

	harness.Eventually(t, 5*time.Second, "the queued row read and shown in flight while the term prepares", func() bool {
		return b.Count(t, `entity_id = 'queued' AND status = 'processing'`) == 1
	})
	require.Empty(t, sentSoFar(), "nothing sent before the preparation is done")
	require.Zero(t, started.Load())

	close(release)
	harness.Drained(t, b.Pool, 10*time.Second)
	require.Equal(t, []string{"queued", "claimed"}, sentSoFar(), "the queued read came first (one bulk at a time)")
	require.EqualValues(t, 1, started.Load(), "the term's start reported once")
}

// A leader that starts from a position its predecessor saved mid-batch
// first reads the rest of that batch, fewer than a full batch since it
// ends at the old snapshot: that read is marked in-batch, which spares it
// Run's cooldown, so the events written since wait for none (before,
// every takeover whose first read was such a rest waited 50 ms more). The
// read after it takes a new snapshot and is not.
func TestReadOnInBatchSkipsTheCooldown(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sent := &sentSet{sent: map[string]int{}}
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op)
	           SELECT 'book', 'old' || g, 'upsert' FROM generate_series(1, 3) g`)
	first, err := NewLoop(Config{BulkSize: 2}, b.Store, projection.Registry{"search": sent.handler()}, zerolog.Nop())
	require.NoError(t, err)
	_, err = first.runOnce(context.Background(), 1)
	require.NoError(t, err)
	require.Equal(t, 2, b.Count(t, `status = 'done'`), "the predecessor confirmed 2 of the batch's 3")

	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', 'new', 'upsert')`)
	next, err := NewLoop(Config{BulkSize: 100}, b.Store, projection.Registry{"search": sent.handler()}, zerolog.Nop())
	require.NoError(t, err)
	f, err := next.claim(context.Background(), 1)
	require.NoError(t, err)
	require.Len(t, f.events, 1, "the rest of the predecessor's batch")
	require.True(t, next.readRest, "read on in the old batch, the term's first from a saved position: no cooldown after it")
	f, err = next.claim(context.Background(), 1)
	require.NoError(t, err)
	require.Equal(t, "new", f.events[0].EntityID)
	require.False(t, next.readRest, "a new snapshot's read that found less than a batch: the cooldown applies")
}

// A term's first read from a drained position its predecessor saved is
// the rest of older work too (what the predecessor sent after its last
// checkpoint comes again, dropped by the ledger): no cooldown after it.
// A first term, with no saved position, keeps the cooldown (the trickle's
// batching: TestClaimCooldownBatchesATrickle).
func TestFirstReadFromASavedPositionSkipsTheCooldown(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sent := &sentSet{sent: map[string]int{}}
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', 'a', 'upsert')`)
	first, err := NewLoop(Config{}, b.Store, projection.Registry{"search": sent.handler()}, zerolog.Nop())
	require.NoError(t, err)
	f, err := first.claim(context.Background(), 1)
	require.NoError(t, err)
	require.NotNil(t, f)
	require.False(t, first.readRest, "no predecessor: the cooldown applies")
	_, err = first.handle(context.Background(), 1, f)
	require.NoError(t, err)
	first.checkpoint(context.Background(), 1, true)

	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', 'b', 'upsert')`)
	next, err := NewLoop(Config{}, b.Store, projection.Registry{"search": sent.handler()}, zerolog.Nop())
	require.NoError(t, err)
	_, err = next.claim(context.Background(), 1)
	require.NoError(t, err)
	require.True(t, next.readRest, "the term's first read from the saved position")
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', 'c', 'upsert')`)
	_, err = next.claim(context.Background(), 1)
	require.NoError(t, err)
	require.False(t, next.readRest, "its next read is not")
}
