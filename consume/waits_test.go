package consume

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
)

// waitingHandler is a funcHandler that waits (projection.Waits) while why
// holds a reason, and counts the events it is given.
type waitingHandler struct {
	why    atomic.Pointer[string]
	handed atomic.Int64
}

func (h *waitingHandler) Handle(ctx context.Context, events []outbox.Event) []projection.Result {
	h.handed.Add(int64(len(events)))
	return funcHandler(func(context.Context, outbox.Event) projection.Result { return projection.Result{} }).Handle(ctx, events)
}

func (h *waitingHandler) Waiting() string {
	if why := h.why.Load(); why != nil {
		return *why
	}
	return ""
}

// The events of a projection whose handler waits (a search index not set
// up while its engine is away) are neither read from the queue nor claimed,
// so none is sent or counts an attempt, while another projection drains;
// once it stops waiting they drain. Both for queued rows, as producers
// write them, and for pending rows, which the claim takes (retries,
// replays), from the head and past the cursor.
func TestProjectionThatWaitsIsNeitherReadNorClaimed(t *testing.T) {
	t.Parallel()
	for name, setup := range map[string]func(*testing.T) bundle{"queued": setup, "claimed": setupClaimed} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			waiting := &waitingHandler{}
			why := "its index is not set up yet"
			waiting.why.Store(&why)
			other := funcHandler(func(context.Context, outbox.Event) projection.Result { return projection.Result{} })
			start(t, b, Config{PollInterval: 100 * time.Millisecond, BulkSize: 5}, projection.Registry{"search": waiting, "chronicle": other})

			b.Exec(t, `INSERT INTO outbox_events (projection, entity_type, entity_id, op)
				SELECT p, 'book', g::text, 'upsert' FROM generate_series(1, 20) g, unnest(ARRAY['search', 'chronicle']) p ORDER BY random()`)
			harness.Eventually(t, 10*time.Second, "the other projection drains", func() bool {
				return b.Count(t, `projection = 'chronicle' AND status = 'done'`) == 20
			})
			time.Sleep(500 * time.Millisecond) // five polls, several claims from the head
			require.Zero(t, waiting.handed.Load(), "none of the waiting projection's events was handed to it")
			require.Zero(t, b.Count(t, `projection = 'search' AND (status <> 'pending' OR attempts > 0)`),
				"its events are pending, without an attempt")

			waiting.why.Store(nil)
			harness.Eventually(t, 10*time.Second, "its events drain once it stops waiting", func() bool {
				return b.Count(t, `projection = 'search' AND status = 'done'`) == 20
			})
			require.Zero(t, b.Count(t, `attempts > 0`))
		})
	}
}
