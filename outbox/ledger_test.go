package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/outbox"
)

// ledger reads one document's ledger entry, nil when there is none.
func (b bundle) ledger(t *testing.T, entity string) *outbox.Applied {
	t.Helper()
	var a outbox.Applied
	err := b.Pool.QueryRow(context.Background(), `SELECT version, event_id, deleted FROM outbox_ledger_entries
		WHERE projection = 'search' AND entity_type = 'book' AND entity_id = $1`, entity).Scan(&a.Version, &a.EventID, &a.Deleted)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	require.NoError(t, err)
	return &a
}

func (b bundle) claimAndAck(t *testing.T, epoch int64) []outbox.Event {
	t.Helper()
	events := b.claim(t, epoch, 100)
	ids := claimedIDs(events)
	b.ackDone(t, epoch, ids, ids)
	return events
}

func TestLedgerMovesForwardWithTheAckAndNeverBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Lead(t, 1)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version) VALUES
		('book', 'r1', 'upsert', 2), ('book', 'r1', 'delete', 3), ('book', 'r2', 'upsert', NULL)`)
	events := b.claimAndAck(t, 1)
	require.Len(t, events, 3)
	require.Nil(t, events[0].Applied, "nothing applied yet when claimed")
	require.Equal(t, &outbox.Applied{Version: 3, EventID: 2, Deleted: true}, b.ledger(t, "r1"), "the newest of the batch")
	require.Equal(t, &outbox.Applied{Version: 3, EventID: 3}, b.ledger(t, "r2"), "a null version is the outbox id")

	// An older version acked later (say a replay) leaves the ledger alone.
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version) VALUES ('book', 'r1', 'upsert', 2)`)
	events = b.claimAndAck(t, 1)
	require.Equal(t, &outbox.Applied{Version: 3, EventID: 2, Deleted: true}, events[0].Applied, "the claim carries the entry")
	require.True(t, events[0].Stale())
	require.Equal(t, &outbox.Applied{Version: 3, EventID: 2, Deleted: true}, b.ledger(t, "r1"))
}

// The claim reads the ledger only for the projections that keep one (the
// loop passes them from its registry): the chronicle's events, which keep
// every version, come without an entry even when one exists.
func TestClaimReadsTheLedgerOnlyForLatestOnlyProjections(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Lead(t, 1)
	b.Exec(t, `INSERT INTO outbox_ledger (projection, entity_type, entity_id, version, deleted, event_id, applied_at) VALUES
		('search', 'book', 'r1', 7, false, 1, now()), ('chronicle', 'book', 'r1', 7, false, 1, now())`)
	b.Exec(t, `INSERT INTO outbox_events (projection, entity_type, entity_id, op, event_version) VALUES
		('search', 'book', 'r1', 'upsert', 3), ('chronicle', 'book', 'r1', 'upsert', 3)`)
	events, err := b.Store.Claim(context.Background(), 1, 10, time.Minute, []string{"search"})
	require.NoError(t, err)
	require.Len(t, events, 2)
	require.Equal(t, "search", events[0].Projection)
	require.Equal(t, &outbox.Applied{Version: 7, EventID: 1}, events[0].Applied)
	require.Equal(t, "chronicle", events[1].Projection)
	require.Nil(t, events[1].Applied, "the chronicle keeps no ledger: none is read for it")
}

func TestFencedAckMovesNoLedgerEntry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Lead(t, 1)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version) VALUES ('book', 'r1', 'upsert', 5)`)
	events := b.claim(t, 1, 10)
	b.Lead(t, 2)
	require.Empty(t, b.ackDone(t, 1, []int64{events[0].ID}, []int64{events[0].ID}))
	require.Nil(t, b.ledger(t, "r1"), "a deposed leader's late write changes nothing")
}

func TestStaleOrdersByVersionThenOutboxID(t *testing.T) {
	t.Parallel()
	v := func(n int64) *int64 { return &n }
	applied := &outbox.Applied{Version: 5, EventID: 10}
	for _, c := range []struct {
		name  string
		e     outbox.Event
		stale bool
	}{
		{"no entry", outbox.Event{ID: 1, EventVersion: v(1)}, false},
		{"older version", outbox.Event{ID: 11, EventVersion: v(4), Applied: applied}, true},
		{"newer version", outbox.Event{ID: 9, EventVersion: v(6), Applied: applied}, false},
		{"same version, the applied event", outbox.Event{ID: 10, EventVersion: v(5), Applied: applied}, true},
		{"same version, an earlier row", outbox.Event{ID: 9, EventVersion: v(5), Applied: applied}, true},
		{"same version, a later row", outbox.Event{ID: 11, EventVersion: v(5), Applied: applied}, false},
		{"null version is the id", outbox.Event{ID: 4, Applied: applied}, true},
	} {
		require.Equal(t, c.stale, c.e.Stale(), c.name)
	}
}

// The ledger's rotation carries its needed entries next to millions of done
// rows: each page must probe outbox_events' open rows by document
// (outbox_events_open_doc_idx), never the done rows, and the ledger by
// key; the backlog's entries, carried once before the pages, are probed by
// key too.
func TestLedgerCarryPlansReadOnlyTheBacklog(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, status, processed_at)
		SELECT 'book', (g % 20000)::text, 'upsert', g, 'done', now() - interval '2 hours' FROM generate_series(1, 100000) g`)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, status)
		SELECT 'book', (g * 7)::text, 'upsert', 200000 + g, s
		  FROM generate_series(1, 200) g, unnest(ARRAY['pending', 'processing', 'failed', 'discarded']) s`)
	b.Exec(t, `INSERT INTO outbox_ledger (slot, projection, entity_type, entity_id, version, deleted, event_id, applied_at)
		SELECT g % 3, 'search', 'book', (g % 20000)::text, g, g % 2 = 0, g, now() - interval '2 hours' FROM generate_series(0, 59999) g`)
	b.Exec(t, `ANALYZE outbox_events`)
	b.Exec(t, `ANALYZE outbox_ledger`)
	for name, sql := range map[string]string{"carry-out-of-0": outbox.CarryLedgerSQL(0), "carry-out-of-1": outbox.CarryLedgerSQL(1),
		"backlog-out-of-0": outbox.CarryBacklogSQL(0)} {
		tx, err := b.Pool.Begin(context.Background())
		require.NoError(t, err)
		_, err = tx.Exec(context.Background(), outbox.CarryPlan[0])
		require.NoError(t, err)
		rows, err := tx.Query(context.Background(), "EXPLAIN "+sql, carryArgs)
		require.NoError(t, err)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		require.NoError(t, tx.Rollback(context.Background()))
		plan := strings.Join(lines, "\n")
		requireNoSeqScan(t, b, plan, "%s: the done rows or the whole ledger are read", name)
		require.Regexp(t, `outbox_ledger_\d_projection_entity_type_entity_id_version_ev_idx`, plan, name)
		if strings.HasPrefix(name, "carry") {
			require.Regexp(t, `Index Only Scan using outbox_events_\d_open_doc_idx`, plan, "%s: one probe by document", name)
			require.NotContains(t, plan, "outbox_queue_backlog", "%s: the backlog is read once a rotation, not per page", name)
		}
	}
}

// carryArgs are the carry's arguments from the first key on, slot 2
// current and slot 0 carried, with a retention of an hour and tombstones
// kept three.
var carryArgs = pgx.NamedArgs{"cur": 2, "page": 1000, "p": "", "t": "", "i": "",
	"retention_secs": 3600.0, "tombstone_secs": 10800.0}

// rotationDue makes the ledger's current partition slot, written for a
// day.
func (b bundle) rotationDue(t *testing.T, slot int) {
	t.Helper()
	b.Exec(t, `UPDATE outbox_ledger_rotation SET slot = $1, opened_at = now() - interval '1 day'`, slot)
}

// TestLedgerRotationCarriesOnlyTheNewestNeededEntries: reopening partition
// 0 keeps a young tombstone there (copied into the current partition), but
// not an entry another partition has a newer one of, nor an old live one;
// each document's entry is then what it was, or none.
func TestLedgerRotationCarriesOnlyTheNewestNeededEntries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Lead(t, 1)
	b.Exec(t, `INSERT INTO outbox_ledger (slot, projection, entity_type, entity_id, version, deleted, event_id, applied_at) VALUES
		(0, 'search', 'book', 'superseded', 1, true, 1, now() - interval '10 minutes'),
		(2, 'search', 'book', 'superseded', 2, false, 2, now() - interval '1 minute'),
		(0, 'search', 'book', 'tombstone', 5, true, 5, now() - interval '2 hours'),
		(0, 'search', 'book', 'tombstone', 4, false, 4, now() - interval '3 hours'),
		(0, 'search', 'book', 'old-live', 7, false, 7, now() - interval '2 hours')`)
	b.rotationDue(t, 2)
	r, err := b.Store.RotateLedger(context.Background(), 1, time.Hour, 3*time.Hour, 1)
	require.NoError(t, err)
	require.Equal(t, outbox.LedgerRotation{Rotated: true, Slot: 0, Carried: 1}, r)
	require.Equal(t, &outbox.Applied{Version: 2, EventID: 2}, b.ledger(t, "superseded"))
	require.Equal(t, &outbox.Applied{Version: 5, EventID: 5, Deleted: true}, b.ledger(t, "tombstone"))
	require.Nil(t, b.ledger(t, "old-live"), "a live entry past the retention with no event left goes")
	require.Equal(t, []string{"2 superseded", "2 tombstone"}, harness.Column[string](t, b.DB,
		`SELECT slot || ' ' || entity_id FROM outbox_ledger ORDER BY entity_id`), "partition 0 was emptied, the carried row is in 2")
	require.Equal(t, 0, b.Int(t, `SELECT slot FROM outbox_ledger_rotation`))
	b.Exec(t, `INSERT INTO outbox_ledger (projection, entity_type, entity_id, version, deleted, event_id) VALUES ('search', 'book', 'new', 1, false, 9)`)
	require.Equal(t, 1, b.Int(t, `SELECT count(*) FROM outbox_ledger_0 WHERE entity_id = 'new'`), "new entries go to the reopened partition")
}

// TestLedgerRotationOfADeposedLeaderChangesNothing: a leader deposed while
// it carried reopens no partition (its carried copies are the same entries
// again, which change no document's entry).
func TestLedgerRotationOfADeposedLeaderChangesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Lead(t, 1)
	b.Exec(t, `INSERT INTO outbox_ledger (slot, projection, entity_type, entity_id, version, deleted, event_id, applied_at)
		VALUES (0, 'search', 'book', 'old-live', 7, false, 7, now() - interval '2 hours')`)
	b.rotationDue(t, 2)
	b.Lead(t, 2)
	r, err := b.Store.RotateLedger(context.Background(), 1, time.Hour, 3*time.Hour, 100)
	require.NoError(t, err)
	require.False(t, r.Rotated)
	require.Equal(t, 2, b.Int(t, `SELECT slot FROM outbox_ledger_rotation`))
	require.Equal(t, &outbox.Applied{Version: 7, EventID: 7}, b.ledger(t, "old-live"), "partition 0 was not emptied")
}

// TestLedgerRotationNeverQueuesBehindAReader: a session reading the
// partition to be reopened (a long lookup, an operator's query, a dump)
// holds its lock: the rotation gives up at once instead of queueing every
// lookup behind its request, and the next round reopens it.
func TestLedgerRotationNeverQueuesBehindAReader(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Lead(t, 1)
	b.rotationDue(t, 2)
	ctx := context.Background()
	tx, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, `SELECT count(*) FROM outbox_ledger_0`)
	require.NoError(t, err)
	start := time.Now()
	r, err := b.Store.RotateLedger(ctx, 1, time.Hour, 3*time.Hour, 100)
	require.NoError(t, err)
	require.False(t, r.Rotated)
	require.Contains(t, r.Held, "a lock another session holds on outbox_ledger_0")
	require.Less(t, time.Since(start), 3*time.Second, "a few tries a tenth of a second apart, never queued behind the reader")
	require.Equal(t, 2, b.Int(t, `SELECT slot FROM outbox_ledger_rotation`), "nothing changed")
	require.NoError(t, tx.Rollback(ctx))
	r, err = b.Store.RotateLedger(ctx, 1, time.Hour, 3*time.Hour, 100)
	require.NoError(t, err)
	require.True(t, r.Rotated)
}

// TestAckReadsTheLedgerPartitionOnce: the ack names the partition of its
// entries once per statement, not once per row through the column's
// default, and the partition's lookup is by key under the ack's own
// settings (sequential scans off): a disabled scan's cost JIT-compiled it
// on every call, 15 ms a row, and the drill's soak fell behind.
func TestAckReadsTheLedgerPartitionOnce(t *testing.T) {
	t.Parallel()
	b, origin := queuedBundle(t)
	ctx := context.Background()
	b.insert(t, 50)
	events, _ := b.read(t, origin, 50)
	ids := claimedIDs(events)
	tx, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, `SET LOCAL track_functions = 'all'`)
	require.NoError(t, err)
	for _, s := range outbox.ByKeyPlan {
		_, err := tx.Exec(ctx, s)
		require.NoError(t, err)
	}
	rows, err := tx.Query(ctx, outbox.AckQueuedSQL, pgx.NamedArgs{"ids": ids, "applied": ids, "owner": b.Store.Owner,
		"epoch": 1, "leader": b.Store.LeaderName})
	require.NoError(t, err)
	acked, err := pgx.CollectRows(rows, pgx.RowToMap)
	require.NoError(t, err)
	require.Len(t, acked, 50)
	var calls int
	require.NoError(t, tx.QueryRow(ctx, `SELECT calls FROM pg_stat_xact_user_functions WHERE funcname = 'outbox_ledger_slot'`).Scan(&calls))
	require.Equal(t, 1, calls, "50 entries, one read of the partition")

	var body string
	require.NoError(t, tx.QueryRow(ctx, `SELECT prosrc FROM pg_proc WHERE proname = 'outbox_ledger_slot'`).Scan(&body))
	plan, err := pgx.CollectRows(must(tx.Query(ctx, "EXPLAIN "+body)), pgx.RowTo[string])
	require.NoError(t, err)
	require.NotContains(t, strings.Join(plan, "\n"), "Seq Scan", "the rotation's row is read by its key")
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
