package migrations_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/outbox"
)

// TestQueuedStorageRollsBack: undoing 00018 (the rollback path the runbook
// gives until it is undone) makes new rows pending again and each queued
// row what its position says: done behind it, pending past it; so a binary
// of before 17 drains what is left, and applying 00018 again queues anew.
func TestQueuedStorageRollsBack(t *testing.T) {
	t.Parallel()
	b := harness.NewOutbox(t)
	b.Lead(t, 1)
	ctx := context.Background()
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) SELECT 'book', g::text, 'upsert' FROM generate_series(1, 5) g`)
	origin, err := b.Store.Origin(ctx)
	require.NoError(t, err)
	events, pos, err := b.Store.ReadQueued(ctx, "search", *origin, 3, true)
	require.NoError(t, err)
	require.Len(t, events, 3)
	_, err = b.Store.SaveCheckpoints(ctx, 1, time.Minute, []outbox.Checkpoint{{Projection: "search", Done: pos, Claimed: pos}})
	require.NoError(t, err)

	db, err := goose.OpenDBWithDriver("pgx", b.URL)
	require.NoError(t, err)
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, os.DirFS("."))
	require.NoError(t, err)
	_, err = p.Down(ctx)
	require.NoError(t, err)
	require.Equal(t, map[string]int{"done": 3, "pending": 2},
		harness.Pairs[string, int](t, b.DB, `SELECT status, count(*) FROM outbox_events GROUP BY status`))
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', 'after', 'upsert')`)
	require.Equal(t, 1, b.Count(t, `entity_id = 'after' AND status = 'pending' AND NOT queued`))

	_, err = p.Up(ctx)
	require.NoError(t, err)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', 'again', 'upsert')`)
	require.Equal(t, 1, b.Count(t, `entity_id = 'again' AND queued`))
}
