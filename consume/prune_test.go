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

// The outbox rotates as its retention passes: the partition the rows were
// written to goes whole, by TRUNCATE, once two half-retentions later it is
// the oldest, and the rows still needed move out of it first, in pages:
// retrying, failed, discarded, and done within the retention.
func TestPrunerRotatesTheOutboxKeepingWhatIsNeeded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old := `now() - interval '2 hours'`
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, status, processed_at, created_at)
		SELECT 'book', g::text, 'upsert', 'done', `+old+`, `+old+` FROM generate_series(1, 25) g`)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, status, processed_at, created_at)
		SELECT 'book', 'y' || g, 'upsert', 'done', now() - interval '10 minutes', `+old+` FROM generate_series(1, 12) g`)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, status, updated_at, error_reason, created_at) VALUES
		('book', 'f', 'upsert', 'failed', `+old+`, 'mapping_error', `+old+`),
		('book', 'p', 'upsert', 'pending', `+old+`, NULL, `+old+`),
		('book', 'd', 'upsert', 'discarded', `+old+`, 'mapping_error', `+old+`)`)
	before := harness.Pairs[int64, string](t, b.DB, `SELECT id, row_to_json(e)::jsonb - 'slot' FROM outbox_events e WHERE status <> 'done' OR entity_id LIKE 'y%'`)
	p, err := NewPruner(PrunerConfig{Retention: time.Hour, Batch: 10}, b.Store, zerolog.Nop())
	require.NoError(t, err)
	res, err := p.runOnce(context.Background(), 1)
	require.NoError(t, err)
	require.False(t, res.Events.Rotated, "the current partition is younger than half the retention")

	var moved int64
	for i := range 3 {
		res := ageAndRun(t, b, p)
		require.True(t, res.Events.Rotated, "rotation %d", i)
		require.Equal(t, (2+i)%3, res.Events.Slot)
		moved += res.Events.Carried
	}
	require.Equal(t, int64(15), moved, "two pages of 10")
	require.Zero(t, b.Int(t, `SELECT count(*) FROM outbox_events WHERE status = 'done' AND processed_at < now() - interval '1 hour'`))
	after := harness.Pairs[int64, string](t, b.DB, `SELECT id, row_to_json(e)::jsonb - 'slot' FROM outbox_events e`)
	require.Equal(t, before, after, "the rows still needed are moved as they were, ids included")
	require.Equal(t, map[int]int{0: 15}, harness.Pairs[int, int](t, b.DB, `SELECT slot, count(*) FROM outbox_events GROUP BY slot`))
}

// A due partition waits while it holds an event in flight or one a
// projection has not passed (here one no leader has read: a paused
// projection's), and goes once they are done.
func TestPrunerRotationWaitsForEventsNotPassed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, created_at)
		SELECT 'book', g::text, 'upsert', now() - interval '2 hours' FROM generate_series(1, 5) g`)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, status, created_at, lease_until)
		VALUES ('book', 'c', 'upsert', 'processing', now() - interval '2 hours', now() + interval '1 minute')`)
	p, err := NewPruner(PrunerConfig{Retention: time.Hour}, b.Store, zerolog.Nop())
	require.NoError(t, err)
	ageAndRun(t, b, p)
	ageAndRun(t, b, p)
	res := ageAndRun(t, b, p)
	require.False(t, res.Events.Rotated)
	require.Regexp(t, `^event \d+, processing$`, res.Events.Held)
	b.Exec(t, `UPDATE outbox_events SET status = 'done', processed_at = now() - interval '2 hours' WHERE entity_id = 'c'`)

	res = ageAndRun(t, b, p)
	require.False(t, res.Events.Rotated)
	require.Regexp(t, `^event \d+, which projection search has not passed yet$`, res.Events.Held)
	require.Equal(t, 5, b.Count(t, `status = 'pending'`), "nothing went")

	loop, err := NewLoop(Config{}, b.Store, projection.Registry{"search": latestRecorder{&recorder{}}}, zerolog.Nop())
	require.NoError(t, err)
	done, err := loop.runOnce(context.Background(), 1)
	require.NoError(t, err)
	require.Equal(t, 5, done.Done)
	res = ageAndRun(t, b, p)
	require.True(t, res.Events.Rotated, "passed: the partition goes")
	require.Zero(t, b.Int(t, `SELECT count(*) FROM outbox_events`))
}

// ageAndRun makes both rotations' current partitions half a retention
// older, and runs one round of the pruner.
func ageAndRun(t *testing.T, b bundle, p *Pruner) PruneResult {
	t.Helper()
	for _, table := range []string{"outbox_events_rotation", "outbox_ledger_rotation"} {
		b.Exec(t, `UPDATE `+table+` SET opened_at = opened_at - make_interval(secs => $1)`, p.cfg.Retention.Seconds()/2)
	}
	res, err := p.runOnce(context.Background(), 1)
	require.NoError(t, err)
	return res
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
		res := ageAndRun(t, b, p)
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
	require.Equal(t, int64(1), rotateThrice(t, b, p), "the done rows go, the tombstone stays")
	require.Zero(t, b.Int(t, `SELECT count(*) FROM outbox_events`), "the done rows went with their partition")

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
	p, err := NewPruner(PrunerConfig{Retention: time.Hour, TombstoneRetention: 3 * time.Hour, Batch: 10},
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
		// Queued, and no position has passed it: the backlog, which the
		// rotation reads once before its pages.
		"queued": event("queued"),
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

// A row another transaction is changing (an operator's replay holding it
// FOR UPDATE) is not moved under it: the carry passes over it, and the
// partition is not emptied while that transaction holds it (the rotation
// waits for the next round). Once the replay commits, the next round moves
// the row as the replay left it, and empties the partition.
func TestPrunerRotationPassesOverARowBeingChanged(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, status, error_reason, created_at, updated_at)
		VALUES ('book', 'f', 'upsert', 'failed', 'mapping_error', now() - interval '2 hours', now() - interval '2 hours')`)
	p, err := NewPruner(PrunerConfig{Retention: time.Hour}, b.Store, zerolog.Nop())
	require.NoError(t, err)
	ageAndRun(t, b, p)
	ageAndRun(t, b, p)

	replay, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	defer replay.Rollback(ctx) //nolint:errcheck
	_, err = replay.Exec(ctx, `SELECT id FROM outbox_events WHERE entity_id = 'f' FOR UPDATE`)
	require.NoError(t, err)
	b.Exec(t, `UPDATE outbox_events_rotation SET opened_at = opened_at - interval '30 minutes'`)
	res, err := p.runOnce(ctx, 1)
	require.NoError(t, err)
	require.False(t, res.Events.Rotated)
	require.Contains(t, res.Events.Held, "a lock another session holds on outbox_events_1")
	require.Zero(t, res.Events.Carried, "the row being changed is passed over")
	require.Equal(t, 1, b.Int(t, `SELECT count(*) FROM outbox_events WHERE entity_id = 'f' AND status = 'failed' AND slot = 1`))

	_, err = replay.Exec(ctx, `UPDATE outbox_events SET status = 'pending', error_reason = NULL WHERE entity_id = 'f'`)
	require.NoError(t, err)
	require.NoError(t, replay.Commit(ctx))
	res = ageAndRun(t, b, p)
	require.True(t, res.Events.Rotated)
	require.Equal(t, int64(1), res.Events.Carried)
	require.Equal(t, 1, b.Int(t, `SELECT count(*) FROM outbox_events WHERE entity_id = 'f' AND status = 'pending' AND slot = 0`),
		"moved as the replay left it")
}
