package consume

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// The review's reproduction through the loop: book 1 at v1; a delete v2 and
// an upsert v3 the strict mapping refuses, committed together. The delete
// is applied and moves the ledger, v3 fails with its reason, and the book is
// gone, as it is when the two arrive in two batches.
func TestLoopDeleteSurvivesARefusedNewerEventInTheSameBatch(t *testing.T) {
	t.Parallel()
	f := newEngineFixture(t)
	f.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload)
		VALUES ('book', '1', 'upsert', 1, '{"title": "Dune"}')`)
	require.Equal(t, BatchResult{Done: 1}, f.round(t))
	f.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload) VALUES
		('book', '1', 'delete', 2, '{}'),
		('book', '1', 'upsert', 3, '{"title": "Dune", "isbn": "x"}')`)
	require.Equal(t, BatchResult{Done: 1, Failed: 1}, f.round(t))

	require.False(t, f.present(t, "book:1"), "the delete is the newest event that could be applied")
	require.Equal(t, []string{"mapping_error"}, harness.Column[string](t, f.DB, `SELECT error_reason FROM outbox_events WHERE event_version = 3`))
	require.Equal(t, 1, f.Count(t, `status = 'done' AND event_version = 2`))
	require.Equal(t, 2, f.Int(t, `SELECT version FROM outbox_ledger_entries WHERE entity_id = '1' AND deleted`),
		"the ledger holds the delete")
}

// A producer that writes a document's version twice: the second event fails
// as version_reused instead of overwriting the first's content at the same
// version, whether the two meet in one batch or the first is in the ledger.
func TestLoopRefusesAReusedVersion(t *testing.T) {
	t.Parallel()
	f := newEngineFixture(t)
	f.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload)
		VALUES ('book', '1', 'upsert', 5, '{"title": "First"}')`)
	require.Equal(t, BatchResult{Done: 1}, f.round(t))
	f.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload)
		VALUES ('book', '1', 'upsert', 5, '{"title": "Second"}')`)
	require.Equal(t, BatchResult{Failed: 1}, f.round(t), "the ledger holds v5 from another event")
	require.Equal(t, []string{"version_reused"}, harness.Column[string](t, f.DB, `SELECT error_reason FROM outbox_events WHERE payload->>'title' = 'Second'`))

	f.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload) VALUES
		('book', '2', 'upsert', 7, '{"title": "A"}'), ('book', '2', 'upsert', 7, '{"title": "B"}')`)
	require.Equal(t, BatchResult{Done: 1, Failed: 1}, f.round(t))
	require.Equal(t, []string{"version_reused"}, harness.Column[string](t, f.DB, `SELECT error_reason FROM outbox_events WHERE payload->>'title' = 'B'`))
	require.Equal(t, 7, f.Int(t, `SELECT version FROM outbox_ledger_entries WHERE entity_id = '2'`))
}

// A repair (wlproj verify --repair) of a document the ledger counts as
// applied: the index lost it behind wlproj's back, so the repair at the
// ledger's own version must be sent, and an older one must not.
func TestLoopSendsARepairAtTheLedgersVersion(t *testing.T) {
	t.Parallel()
	f := newEngineFixture(t)
	f.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload)
		VALUES ('book', '1', 'upsert', 3, '{"title": "Dune"}')`)
	require.Equal(t, BatchResult{Done: 1}, f.round(t))
	// Deleted by hand: the engine's tombstone (v4) outranks v3 until it is
	// forgotten, as it is after gc_deletes.
	f.es(t, "DELETE", "/"+f.index+"/_doc/book:1", "")
	harness.DeletesForgotten(t, f.index)
	require.False(t, f.present(t, "book:1"))

	f.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload, repair) VALUES
		('book', '1', 'upsert', 2, '{"title": "Older"}', true),
		('book', '1', 'upsert', 3, '{"title": "Dune"}', true)`)
	require.Equal(t, BatchResult{Done: 2, Superseded: 1}, f.round(t), "the older repair is stale, the one at v3 is sent")
	require.True(t, f.present(t, "book:1"), "the repair put the book back")
	require.Equal(t, 3, f.Int(t, `SELECT version FROM outbox_ledger_entries WHERE entity_id = '1'`))
}

// The interleaving at the point a repair is applied: book 1 deleted
// at v2 and re-created at v3, and a repair delete at v3 (queued by a
// verify that judged it on reads from before the re-creation) claimed
// after the ledger moved to live v3. Sent, external_gte would take it and
// the live book would be gone for good; it is dropped unsent. Nor does a
// repair delete go out beside the producer's upsert of its version in the
// same batch (book 2), which the handler would otherwise send second.
func TestLoopNeverSendsARepairDeleteOfALiveDocument(t *testing.T) {
	t.Parallel()
	f := newEngineFixture(t)
	f.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload) VALUES
		('book', '1', 'upsert', 1, '{"title": "Dune"}'), ('book', '2', 'upsert', 1, '{"title": "Emma"}')`)
	require.Equal(t, BatchResult{Done: 2}, f.round(t))
	f.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version) VALUES
		('book', '1', 'delete', 2), ('book', '2', 'delete', 2)`)
	require.Equal(t, BatchResult{Done: 2}, f.round(t))
	f.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload)
		VALUES ('book', '1', 'upsert', 3, '{"title": "Dune again"}')`)
	require.Equal(t, BatchResult{Done: 1}, f.round(t))

	f.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, repair) VALUES ('book', '1', 'delete', 3, true)`)
	sent := f.proxy.Requests()
	require.Equal(t, BatchResult{Done: 1, Superseded: 1}, f.round(t), "the ledger says live at v3")
	require.Equal(t, sent, f.proxy.Requests(), "dropped without sending it")
	require.True(t, f.present(t, "book:1"), "the re-created book stays")

	f.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload, repair) VALUES
		('book', '2', 'delete', 3, '{}', true), ('book', '2', 'upsert', 3, '{"title": "Emma again"}', false)`)
	require.Equal(t, BatchResult{Done: 2, Superseded: 1}, f.round(t))
	require.True(t, f.present(t, "book:2"), "the producer's upsert of the repair's version wins")
	for id, want := range map[string]string{"1": "3 false", "2": "3 false"} {
		require.Equal(t, want, harness.Column[string](t, f.DB, `SELECT version || ' ' || deleted FROM outbox_ledger_entries WHERE entity_id = $1`, id)[0],
			"book %s: the ledger says live at v3", id)
	}
}
