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
