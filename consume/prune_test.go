package consume

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/harness"
)

func TestPrunerDeletesOnlyOldDoneRowsInBatches(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, status, processed_at)
		SELECT 'book', g::text, 'upsert', 'done', now() - interval '2 hours' FROM generate_series(1, 25) g`)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, status, processed_at)
		SELECT 'book', g::text, 'upsert', 'done', now() - interval '10 minutes' FROM generate_series(1, 5) g`)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, status, updated_at, error_reason)
		VALUES ('book', 'f', 'upsert', 'failed', now() - interval '2 hours', 'mapping_error'),
		       ('book', 'p', 'upsert', 'pending', now() - interval '2 hours', NULL)`)
	p, err := NewPruner(PrunerConfig{Retention: time.Hour, Batch: 10, Pause: 1}, b.Store, zerolog.Nop())
	require.NoError(t, err)

	res, err := p.runOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, 25, res.Done, "three batches of at most 10")
	require.Zero(t, b.Count(t, `status = 'done' AND processed_at < now() - interval '1 hour'`))
	require.Equal(t, 5, b.Count(t, `status = 'done'`), "young done rows stay")
	require.Equal(t, 2, b.Count(t, `status IN ('failed', 'pending')`), "only done rows are pruned")
}

func TestPrunerRemovesOnlyLedgerEntriesNoEventCanReopen(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Exec(t, `INSERT INTO outbox_applied (projection, entity_type, entity_id, version, deleted, event_id, applied_at) VALUES
		('search', 'book', 'gone', 3, true, 1, now() - interval '2 hours'),
		('search', 'book', 'failed-upsert', 3, true, 2, now() - interval '2 hours'),
		('search', 'book', 'archived-upsert', 3, true, 3, now() - interval '2 hours'),
		('search', 'book', 'recent', 3, true, 4, now()),
		('search', 'book', 'alive', 3, false, 5, now() - interval '2 hours')`)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, status, error_reason)
		VALUES ('book', 'failed-upsert', 'upsert', 2, 'failed', 'mapping_error')`)
	b.Exec(t, `WITH audit AS (INSERT INTO outbox_replay_audit (replayed_by, reason, selector, event_count, event_ids, action)
		VALUES ('alice', 'old', '{}', 1, '{999}', 'archive') RETURNING id)
		INSERT INTO outbox_dead_letter (id, projection, entity_type, entity_id, op, event_version, payload, status,
		attempts, error_history, replay_count, created_at, updated_at, archive_audit_id)
		SELECT 999, 'search', 'book', 'archived-upsert', 'upsert', 2, '{}', 'failed', 1, '[]', 0, now(), now(), id FROM audit`)
	p, err := NewPruner(PrunerConfig{Retention: time.Hour}, b.Store, zerolog.Nop())
	require.NoError(t, err)

	res, err := p.runOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, res.Ledger)
	left := harness.Column[string](t, b.DB, `SELECT entity_id FROM outbox_applied ORDER BY entity_id`)
	require.Equal(t, []string{"alive", "archived-upsert", "failed-upsert", "recent"}, left,
		"an old delete goes only when no failed or archived event of its document could be replayed")
}

func TestPrunerConfigRefusesAZeroRetention(t *testing.T) {
	t.Parallel()
	_, err := NewPruner(PrunerConfig{Retention: -1}, nil, zerolog.Nop())
	require.ErrorContains(t, err, "Retention=-1ns is out of range")
}
