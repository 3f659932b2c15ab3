package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/outbox"
)

// ledger reads one document's ledger entry, nil when there is none.
func (b bundle) ledger(t *testing.T, entity string) *outbox.Applied {
	t.Helper()
	var a outbox.Applied
	err := b.Pool.QueryRow(context.Background(), `SELECT version, event_id, deleted FROM outbox_applied
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
	b.Exec(t, `INSERT INTO outbox_applied (projection, entity_type, entity_id, version, deleted, event_id, applied_at) VALUES
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

// The ledger pruner runs every 10 s next to millions of done rows: each
// batch must read the backlog through outbox_events' partial indexes (one
// per status), never the done rows.
func TestLedgerPrunePlansReadOnlyTheBacklog(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, status, processed_at)
		SELECT 'book', (g % 20000)::text, 'upsert', g, 'done', now() - interval '2 hours' FROM generate_series(1, 100000) g`)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, status)
		SELECT 'book', (g * 7)::text, 'upsert', 200000 + g, s
		  FROM generate_series(1, 200) g, unnest(ARRAY['pending', 'processing', 'failed', 'discarded']) s`)
	b.Exec(t, `INSERT INTO outbox_applied (projection, entity_type, entity_id, version, deleted, event_id, applied_at)
		SELECT 'search', 'book', g::text, g, g % 2 = 0, g, now() - interval '2 hours' FROM generate_series(0, 19999) g`)
	b.Exec(t, `ANALYZE outbox_events`)
	b.Exec(t, `ANALYZE outbox_applied`)
	for name, sql := range map[string]string{"tombstones": outbox.PruneTombstonesSQL, "live": outbox.PruneLiveSQL} {
		rows, err := b.Pool.Query(context.Background(), "EXPLAIN "+sql, pgx.NamedArgs{"retention_secs": 3600.0, "batch": 1000})
		require.NoError(t, err)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		plan := strings.Join(lines, "\n")
		require.NotContains(t, plan, "Seq Scan on outbox_events", "%s: the done rows are read\n%s", name, plan)
		require.NotContains(t, plan, "Seq Scan on outbox_applied", "%s: the whole ledger is read\n%s", name, plan)
		for _, idx := range []string{"processing", "discarded"} {
			require.Contains(t, plan, "outbox_events_"+idx+"_idx", "%s\n%s", name, plan)
		}
		require.Regexp(t, `outbox_events_(pending|due)_idx`, plan, "%s: the pending rows' index", name)
	}
}
