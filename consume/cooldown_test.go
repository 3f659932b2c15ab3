package consume

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
)

// After a claim that found less than a full batch, the next claim waits the
// cooldown: events inserted meanwhile, each with its own NOTIFY, are taken
// in one batch instead of one claim each.
func TestClaimCooldownBatchesATrickle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	batches := make(chan int, 100)
	h := handlerFunc(func(_ context.Context, events []outbox.Event) []projection.Result {
		batches <- len(events)
		results := make([]projection.Result, len(events))
		for i, e := range events {
			results[i] = projection.Result{ID: e.ID}
		}
		return results
	})
	start(t, b, Config{PollInterval: time.Minute, ClaimCooldown: time.Second}, projection.Registry{"search": h})
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', '0', 'upsert')`)
	require.Equal(t, 1, <-batches, "the first event is claimed at once")
	for i := 1; i <= 5; i++ {
		time.Sleep(50 * time.Millisecond) // a trickle: each insert's NOTIFY alone
		b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', $1, 'upsert')`, strconv.Itoa(i))
	}
	harness.Eventually(t, 10*time.Second, "all done", func() bool { return b.Count(t, `status = 'done'`) == 6 })
	var sizes []int
	for len(batches) > 0 {
		sizes = append(sizes, <-batches)
	}
	require.Equal(t, []int{5}, sizes, "the five inserts during the cooldown went in one batch")
}

type handlerFunc func(context.Context, []outbox.Event) []projection.Result

func (f handlerFunc) Handle(ctx context.Context, events []outbox.Event) []projection.Result {
	return f(ctx, events)
}
