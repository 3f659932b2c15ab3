package verify

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/consume"
	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/projection"
)

var who = RepairRequest{By: "alice", Why: "drift found by verify (INC-7)"}

func (f fixture) repair(t *testing.T, cfg Config, req RepairRequest) RepairReport {
	t.Helper()
	rep, err := Repair(context.Background(), cfg, req)
	require.NoError(t, err)
	return rep
}

// changes is what a repair could change: the events and the audit rows.
func (f fixture) changes(t *testing.T) [2]int {
	return [2]int{f.Count(t, `true`), f.Int(t, `SELECT count(*) FROM outbox_replay_audit`)}
}

// Each kind planted, a dry run that changes nothing, the repair through
// the loop, and a second verify that is clean; one audit row.
func TestVerifyRepairPutsEveryKindRight(t *testing.T) {
	t.Parallel()
	f := setup(t, 200)
	f.plant(t)
	// Resurrected at a version above the ledger's delete (2): the delete
	// must be sent at the index's version to win.
	f.produce(t, `SELECT 'book', 'b4', 'delete', 2::bigint, '{}'::jsonb`)
	f.drain(t)
	f.es(t, http.MethodPut, "/"+f.index+"/_doc/book:b4?version=7&version_type=external_gte&refresh=true", `{"kind": "book"}`)
	cfg := f.config("search_index")

	before := f.changes(t)
	dry := req(who, func(r *RepairRequest) { r.DryRun = true })
	rep := f.repair(t, cfg, dry)
	require.Equal(t, counts(1, 1, 1, 2), rep.Queued)
	require.Equal(t, before, f.changes(t), "a dry run changes nothing")

	rep = f.repair(t, cfg, who)
	require.Equal(t, counts(1, 1, 1, 2), rep.Counts)
	require.Equal(t, counts(1, 1, 1, 2), rep.Queued)
	require.Empty(t, rep.Unrepairable)
	type event struct {
		Op      string
		Version int64
		Title   *string
	}
	got := map[string]event{}
	rows, err := f.Pool.Query(context.Background(), `
		SELECT entity_id, op, event_version, payload->>'title' FROM outbox_events
		 WHERE repair AND id BETWEEN $1 AND $2`, rep.FirstEventID, rep.LastEventID)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		var e event
		require.NoError(t, rows.Scan(&id, &e.Op, &e.Version, &e.Title))
		got[id] = e
	}
	require.NoError(t, rows.Err())
	title := "Book 2, fifth"
	require.Equal(t, map[string]event{
		"b1": {Op: "upsert", Version: 1, Title: ptr("Book 1")},
		"b2": {Op: "upsert", Version: 5, Title: &title},
		"x1": {Op: "delete", Version: 3},
		"b3": {Op: "delete", Version: 2},
		"b4": {Op: "delete", Version: 7},
	}, got)

	var by, why string
	var count int
	var ids []int64
	var selector map[string]any
	require.NoError(t, f.Pool.QueryRow(context.Background(), `
		SELECT replayed_by, reason, event_count, event_ids, selector FROM outbox_replay_audit WHERE id = $1 AND action = 'repair'`,
		rep.AuditID).Scan(&by, &why, &count, &ids, &selector))
	require.Equal(t, [2]string{who.By, who.Why}, [2]string{by, why})
	require.Equal(t, 5, count)
	require.Len(t, ids, 5)
	require.Equal(t, map[string]any{"missing": 1.0, "stale": 1.0, "extra": 1.0, "resurrected": 2.0}, selector["queued"])
	require.Equal(t, before[1]+1, f.changes(t)[1], "one audit row")

	f.drain(t)
	again := f.verify(t, cfg)
	require.Zero(t, again.Drift(), "%+v", again.Samples)
	require.Equal(t, 1, f.Int(t, `SELECT count(*) FROM outbox_ledger_entries WHERE entity_id = 'x1' AND deleted AND version = 3`),
		"the stray document's delete is in the ledger")
}

func req(r RepairRequest, change func(*RepairRequest)) RepairRequest {
	change(&r)
	return r
}

func ptr[T any](v T) *T { return &v }

// The cap refuses the whole repair, as replay's does; Yes lifts it.
func TestVerifyRepairKeepsToItsCap(t *testing.T) {
	t.Parallel()
	f := setup(t, 100)
	f.plant(t)
	before := f.changes(t)
	_, err := Repair(context.Background(), f.config("search_index"), req(who, func(r *RepairRequest) { r.Max = 3 }))
	var refused *RefusedError
	require.ErrorAs(t, err, &refused)
	require.EqualValues(t, 4, refused.Queued)
	require.Equal(t, before, f.changes(t), "refused: nothing queued, nothing audited")

	rep := f.repair(t, f.config("search_index"), req(who, func(r *RepairRequest) { r.Max, r.Yes = 3, true }))
	require.EqualValues(t, 4, rep.QueuedTotal())
	require.NotZero(t, rep.AuditID)

	for _, bad := range []RepairRequest{{Why: "x"}, {By: "x"}, {By: "x", Why: " "}} {
		_, err := Repair(context.Background(), f.config("search_index"), bad)
		var field *bounds.FieldError
		require.ErrorAs(t, err, &field)
	}
}

// Without a source table there is no document to send: missing and stale
// are reported as such, resurrected is deleted.
func TestVerifyRepairWithoutATableDeletesOnly(t *testing.T) {
	t.Parallel()
	f := setup(t, 100)
	f.plant(t)
	rep := f.repair(t, f.config(""), who)
	require.Equal(t, counts(0, 0, 0, 1), rep.Queued)
	require.Equal(t, map[string]int64{NoSource: 1}, rep.Unrepairable, "b1 is missing")
	f.drain(t)
	again := f.verify(t, f.config(""))
	require.Equal(t, counts(1, 0, 0, 0), again.Counts)
}

// A document deleted by hand leaves a tombstone one version above its own
// for index.gc_deletes (60 s): a repair sent within that window is
// refused as a version conflict and the document stays missing; the
// second run, once the engine forgot the delete, puts it back.
func TestVerifyRepairOfAFreshHandDeleteTakesASecondRun(t *testing.T) {
	t.Parallel()
	f := setup(t, 50)
	f.deleteByHand(t, "b5")
	cfg := f.config("search_index")

	rep := f.repair(t, cfg, who)
	require.Equal(t, counts(1, 0, 0, 0), rep.Queued)
	f.drain(t)
	require.Equal(t, counts(1, 0, 0, 0), f.verify(t, cfg).Counts, "the tombstone refused the repair")

	harness.DeletesForgotten(t, f.index)
	rep = f.repair(t, cfg, who)
	require.Equal(t, counts(1, 0, 0, 0), rep.Queued)
	f.drain(t)
	require.Zero(t, f.verify(t, cfg).Drift())
	var doc struct {
		Version int64 `json:"_version"`
		Source  json.RawMessage
	}
	require.NoError(t, harness.ES(context.Background(), f.base, http.MethodGet, "/"+f.index+"/_doc/book:b5", nil, &doc))
	require.EqualValues(t, 1, doc.Version)
}

// A document the source table lacks while the ledger says it is live (the
// application deleted its row without an event, or the table is behind
// the outbox) is extra, but no repair deletes it: the ledger's applied
// upsert is the newer word, and the leader would drop such a delete
// unsent. It is reported as unrepairable, ledger_live; a stray document
// the ledger never heard of is deleted.
func TestVerifyRepairDeletesNothingTheLedgerSaysIsLive(t *testing.T) {
	t.Parallel()
	f := setup(t, 20)
	f.Exec(t, `DELETE FROM search_index WHERE entity_id = 'b5'`)
	f.es(t, http.MethodPut, "/"+f.index+"/_doc/book:x1?version=3&version_type=external_gte&refresh=true", `{"kind": "book"}`)

	rep := f.repair(t, f.config("search_index"), who)
	require.Equal(t, counts(0, 0, 2, 0), rep.Counts)
	require.Equal(t, counts(0, 0, 1, 0), rep.Queued)
	require.Equal(t, map[string]int64{LedgerLive: 1}, rep.Unrepairable)
	f.drain(t)
	require.Equal(t, counts(0, 0, 1, 0), f.verify(t, f.config("search_index")).Counts, "b5 stays, x1 is gone")
}

// Repair events fall due at their transaction's start; when the leader
// claims an event committed meanwhile, they are behind its claim cursor.
// The repair asks for a claim from the head, so they are applied at once,
// not a poll interval (here a minute) later.
func TestVerifyRepairIsAppliedAtOnceBehindTheCursor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t, 20)
	f.deleteByHand(t, "b1")
	loop, err := consume.NewLoop(consume.Config{PollInterval: time.Minute}, f.Store, projection.Registry{"search": f.search}, zerolog.Nop())
	require.NoError(t, err)
	drain, done := make(chan struct{}), make(chan struct{})
	go func() { defer close(done); loop.Run(ctx, 1, drain) }()
	t.Cleanup(func() { close(drain); <-done })

	// The repair's transaction inserts its event, then waits on the audit
	// table while the application's event commits and is claimed.
	lock, err := f.Pool.Begin(ctx)
	require.NoError(t, err)
	defer lock.Rollback(ctx) //nolint:errcheck
	_, err = lock.Exec(ctx, `LOCK TABLE outbox_replay_audit IN SHARE MODE`)
	require.NoError(t, err)
	repaired := make(chan error, 1)
	go func() { _, err := Repair(ctx, f.config("search_index"), who); repaired <- err }()
	harness.Eventually(t, 20*time.Second, "the repair's transaction waiting on the audit table", func() bool {
		return f.Int(t, `SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'outbox_replay_audit'::regclass`) == 1
	})
	f.produce(t, `SELECT 'book', 'b2', 'upsert', 2::bigint, '{"kind": "book", "title": "second"}'::jsonb`)
	harness.Eventually(t, 10*time.Second, "the application's event done", func() bool {
		return f.Count(t, `entity_id = 'b2' AND event_version = 2 AND status = 'done'`) == 1
	})
	require.NoError(t, lock.Rollback(ctx))
	committed := time.Now()
	require.NoError(t, <-repaired)

	harness.Eventually(t, 10*time.Second, "the repair event done", func() bool {
		return f.Count(t, `repair AND status = 'done'`) == 1
	})
	t.Logf("the repair event behind the cursor was applied %s after its commit (poll interval 1m)", time.Since(committed))
}

// An ahead document has a source row: the fallback of repairOf, a delete
// at the index's version, would remove a live document, and an upsert at
// the row's older version is refused by the engine. Neither is queued.
func TestVerifyRepairLeavesTheIndexAheadToARebuild(t *testing.T) {
	t.Parallel()
	_, why := repairOf(Drift{Kind: Ahead, ID: "book:b1", EntityType: "book", EntityID: "b1", IndexVersion: 3,
		Source: &SourceRow{Version: 1, Doc: []byte(`{}`)}, Ledger: &Entry{Version: 1}})
	require.Equal(t, IndexAhead, why)
}
