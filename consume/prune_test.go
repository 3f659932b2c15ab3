package consume

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/projection"
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

	res, err := p.runOnce(context.Background(), 1)
	require.NoError(t, err)
	require.Equal(t, 25, res.Done, "three batches of at most 10")
	require.False(t, res.Ledger.Rotated, "the ledger's partition is younger than half the retention")
	require.Zero(t, b.Count(t, `status = 'done' AND processed_at < now() - interval '1 hour'`))
	require.Equal(t, 5, b.Count(t, `status = 'done'`), "young done rows stay")
	require.Equal(t, 2, b.Count(t, `status IN ('failed', 'pending')`), "only done rows are pruned")
}

// ledgerEntry writes one search ledger entry of book id, applied age ago.
func ledgerEntry(t *testing.T, b bundle, id string, deleted bool, age time.Duration) {
	t.Helper()
	b.Exec(t, `INSERT INTO outbox_ledger (projection, entity_type, entity_id, version, deleted, event_id, applied_at)
		VALUES ('search', 'book', $1, 3, $2, 1, now() - make_interval(secs => $3))`, id, deleted, age.Seconds())
}

// rotateThrice runs the pruner thrice, each time once its ledger's current
// partition has been written for half the retention: every entry written
// before has then been judged once, and carried or dropped with its
// partition. It returns how many were carried.
func rotateThrice(t *testing.T, b bundle, p *Pruner) int64 {
	t.Helper()
	var carried int64
	for range 3 {
		b.Exec(t, `UPDATE outbox_ledger_rotation SET opened_at = opened_at - make_interval(secs => $1)`, p.cfg.Retention.Seconds()/2)
		res, err := p.runOnce(context.Background(), 1)
		require.NoError(t, err)
		require.True(t, res.Ledger.Rotated)
		carried += res.Ledger.Carried
	}
	return carried
}

func ledgerLeft(t *testing.T, b bundle) []string {
	t.Helper()
	return harness.Column[string](t, b.DB, `SELECT entity_id FROM outbox_ledger_entries ORDER BY entity_id`)
}

// The scenario under a short OUTBOX_RETENTION: upsert v5 and
// delete v6 are applied, their done rows pruned; a producer then writes
// upsert v4 (a delayed transaction, a backfill). The engine has forgotten
// the delete by then, so only the ledger's tombstone can refuse v4, and it
// must outlive the done rows.
func TestPrunerKeepsATombstoneForAnOlderUpsertWrittenAfterRetention(t *testing.T) {
	t.Parallel()
	b := setup(t)
	search := &recorder{}
	loop, err := NewLoop(Config{}, b.Store, projection.Registry{"search": latestRecorder{search}}, zerolog.Nop())
	require.NoError(t, err)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version) VALUES
		('book', '1', 'upsert', 5), ('book', '1', 'delete', 6)`)
	res, err := loop.runOnce(context.Background(), 1)
	require.NoError(t, err)
	require.Equal(t, 2, res.Done)
	// Two hours pass.
	b.Exec(t, `UPDATE outbox_events SET processed_at = processed_at - interval '2 hours', created_at = created_at - interval '2 hours'`)
	b.Exec(t, `UPDATE outbox_ledger SET applied_at = applied_at - interval '2 hours'`)

	p, err := NewPruner(PrunerConfig{Retention: time.Hour}, b.Store, zerolog.Nop())
	require.NoError(t, err)
	pruned, err := p.runOnce(context.Background(), 1)
	require.NoError(t, err)
	require.Equal(t, 2, pruned.Done)
	require.Equal(t, int64(1), rotateThrice(t, b, p), "the done rows go, the tombstone stays")

	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version) VALUES ('book', '1', 'upsert', 4)`)
	res, err = loop.runOnce(context.Background(), 1)
	require.NoError(t, err)
	require.Equal(t, BatchResult{Done: 1, Superseded: 1}, res, "upsert v4 is older than the delete the ledger remembers")
	require.Len(t, search.sent, 2, "v4 never sent")
}

func TestPrunerRemovesTombstonesOnlyPastTheirOwnRetention(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ledgerEntry(t, b, "deleted-2h", true, 2*time.Hour)
	ledgerEntry(t, b, "deleted-4h", true, 4*time.Hour)
	p, err := NewPruner(PrunerConfig{Retention: time.Hour, TombstoneRetention: 3 * time.Hour}, b.Store, zerolog.Nop())
	require.NoError(t, err)

	require.Equal(t, int64(1), rotateThrice(t, b, p))
	require.Equal(t, []string{"deleted-2h"}, ledgerLeft(t, b), "past the retention but not the tombstone retention: kept")
}

func TestPrunerRemovesLiveEntriesPastRetentionInPages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Exec(t, `INSERT INTO outbox_ledger (projection, entity_type, entity_id, version, deleted, event_id, applied_at)
		SELECT 'search', 'book', 'old-' || g, 3, false, g, now() - interval '2 hours' FROM generate_series(1, 25) g`)
	ledgerEntry(t, b, "young", false, 30*time.Minute)
	p, err := NewPruner(PrunerConfig{Retention: time.Hour, TombstoneRetention: 3 * time.Hour, Batch: 10, Pause: 1},
		b.Store, zerolog.Nop())
	require.NoError(t, err)

	require.Equal(t, int64(1), rotateThrice(t, b, p), "the carry reads pages of 10 documents")
	require.Equal(t, []string{"young"}, ledgerLeft(t, b))
	require.Zero(t, b.Int(t, `SELECT count(*) FROM outbox_ledger WHERE entity_id LIKE 'old-%'`))
}

// An entry stays, tombstone or live, while an event of its document could
// still be sent: the leader judges that event by it.
func TestPrunerKeepsLedgerEntriesWhileAnEventCouldBeSent(t *testing.T) {
	t.Parallel()
	event := func(status string) string {
		return `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, status, error_reason)
			SELECT 'book', id, 'upsert', 2, '` + status + `', 'mapping_error' FROM unnest(ARRAY['tomb', 'live']) id`
	}
	for status, write := range map[string]string{
		"pending":    event("pending"),
		"processing": event("processing"),
		"failed":     event("failed"),
		"discarded":  event("discarded"),
		"archived": `WITH audit AS (INSERT INTO outbox_replay_audit (replayed_by, reason, selector, event_count, event_ids, action)
			VALUES ('alice', 'old', '{}', 2, '{998,999}', 'archive') RETURNING id)
			INSERT INTO outbox_dead_letter (id, projection, entity_type, entity_id, op, event_version, payload, status,
			attempts, error_history, replay_count, created_at, updated_at, archive_audit_id)
			SELECT 997 + u.i, 'search', 'book', u.doc, 'upsert', 2, '{}', 'failed', 1, '[]', 0, now(), now(), audit.id
			  FROM audit, unnest(ARRAY['tomb', 'live']) WITH ORDINALITY AS u(doc, i)`,
	} {
		t.Run(status, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ledgerEntry(t, b, "tomb", true, 4*time.Hour)
			ledgerEntry(t, b, "live", false, 4*time.Hour)
			ledgerEntry(t, b, "tomb-alone", true, 4*time.Hour)
			ledgerEntry(t, b, "live-alone", false, 4*time.Hour)
			b.Exec(t, write)
			p, err := NewPruner(PrunerConfig{Retention: time.Hour, TombstoneRetention: 3 * time.Hour}, b.Store, zerolog.Nop())
			require.NoError(t, err)

			require.Equal(t, int64(2), rotateThrice(t, b, p))
			require.Equal(t, []string{"live", "tomb"}, ledgerLeft(t, b), "only the entries of documents without a %s event go", status)
		})
	}
}

func TestPrunerConfigRefusesATombstoneRetentionBelowRetention(t *testing.T) {
	t.Parallel()
	_, err := NewPruner(PrunerConfig{Retention: 48 * time.Hour, TombstoneRetention: 24 * time.Hour}, nil, zerolog.Nop())
	require.EqualError(t, err, "TombstoneRetention=24h0m0s must not be below Retention=48h0m0s")
	_, err = NewPruner(PrunerConfig{Retention: 3000 * time.Hour}, nil, zerolog.Nop())
	require.EqualError(t, err, "TombstoneRetention=2160h0m0s must not be below Retention=3000h0m0s",
		"the default does not stretch silently to a longer retention")
	p, err := NewPruner(PrunerConfig{}, nil, zerolog.Nop())
	require.NoError(t, err)
	require.Equal(t, 90*24*time.Hour, p.cfg.TombstoneRetention)
}

func TestPrunerConfigRefusesAZeroRetention(t *testing.T) {
	t.Parallel()
	_, err := NewPruner(PrunerConfig{Retention: -1}, nil, zerolog.Nop())
	require.ErrorContains(t, err, "Retention=-1ns is out of range")
}
