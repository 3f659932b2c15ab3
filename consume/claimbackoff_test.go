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

// A claim that keeps failing is retried after a growing wait, not at every
// NOTIFY: while a producer inserts 100 rows a second for 2 s onto a schema
// the claim does not fit, the loop tries a handful of times (100 ms, 200,
// 400, 800 ms...), where before it tried once per insert; once the schema
// fits again, the next try (at most claimBackoffMax later) drains. Not
// parallel: claimErrorsTotal is the process's.
func TestFailingClaimBacksOff(t *testing.T) {
	b := setup(t)
	done := make(chan int64, 1000)
	h := funcHandler(func(_ context.Context, e outbox.Event) projection.Result {
		done <- e.ID
		return projection.Result{}
	})
	b.Exec(t, `ALTER TABLE outbox_events RENAME COLUMN traceparent TO traceparent_gone`)
	tries := delta(claimErrorsTotal, func() {
		start(t, b, Config{PollInterval: time.Minute}, projection.Registry{"search": h})
		for range 200 {
			b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', '1', 'upsert')`)
			time.Sleep(10 * time.Millisecond)
		}
	})
	require.Positive(t, tries)
	require.LessOrEqual(t, tries, uint64(8), "a failing claim retried at the insert rate")

	b.Exec(t, `ALTER TABLE outbox_events RENAME COLUMN traceparent_gone TO traceparent`)
	harness.Eventually(t, claimBackoffMax+5*time.Second, "drained once the claim fits again", func() bool {
		return len(done) == 200
	})
}

func TestClaimBackoffDoublesToItsCapAndResets(t *testing.T) {
	t.Parallel()
	var b claimBackoff
	var got []time.Duration
	for range 8 {
		got = append(got, b.next())
	}
	require.Equal(t, []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond,
		1600 * time.Millisecond, 2 * time.Second, 2 * time.Second, 2 * time.Second}, got)
	b.reset()
	require.Equal(t, claimBackoffFirst, b.next())
}
