package consume

import (
	"context"
	"testing"
	"time"

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
	b := setup(t)
	h := funcHandler(func(context.Context, outbox.Event) projection.Result { return projection.Result{} })
	start(t, b, Config{PollInterval: 300 * time.Millisecond}, projection.Registry{"search": h})

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
