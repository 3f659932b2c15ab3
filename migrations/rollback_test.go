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

// TestQueuedStorageRollsBack: undoing 00018 (after 00019; the rollback path the runbook
// gives until it is undone) makes new rows pending again and each queued
// row what its position says: done behind it, pending past it; so a binary
// of before 17 drains what is left. Applying them again queues anew once a
// binary that reads queued rows has led (it takes the ledger first).
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
	_, err = p.DownTo(ctx, 17)
	require.NoError(t, err)
	require.Equal(t, map[string]int{"done": 3, "pending": 2},
		harness.Pairs[string, int](t, b.DB, `SELECT status, count(*) FROM outbox_events GROUP BY status`))
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', 'after', 'upsert')`)
	require.Equal(t, 1, b.Count(t, `entity_id = 'after' AND status = 'pending' AND NOT queued`))

	_, err = p.Up(ctx)
	require.NoError(t, err)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', 'pending', 'upsert')`)
	require.Equal(t, 1, b.Count(t, `entity_id = 'pending' AND status = 'pending' AND NOT queued`),
		"pending until a binary that reads queued rows leads")
	_, _, err = b.Store.LoadQueue(ctx)
	require.NoError(t, err)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', 'again', 'upsert')`)
	require.Equal(t, 1, b.Count(t, `entity_id = 'again' AND queued`))
}

// TestLedgerRollsBack: undoing 00019 merges each document's newest ledger
// entry, by (version, event_id), into outbox_applied, never moving an
// entry there backwards; a binary of before 19 then judges by it.
func TestLedgerRollsBack(t *testing.T) {
	t.Parallel()
	b := harness.NewOutbox(t)
	asUpgraded(t, b)
	b.Exec(t, `INSERT INTO outbox_applied (projection, entity_type, entity_id, version, deleted, event_id)
	           VALUES ('search', 'book', 'old', 9, false, 90)`)
	b.Exec(t, `INSERT INTO outbox_ledger (projection, entity_type, entity_id, version, deleted, event_id) VALUES
	             ('search', 'book', 'a', 1, false, 10), ('search', 'book', 'a', 3, true, 30), ('search', 'book', 'a', 2, false, 20),
	             ('search', 'book', 'b', 5, false, 50), ('search', 'book', 'b', 5, false, 51),
	             ('search', 'book', 'old', 4, false, 40)`)
	p := provider(t, b.URL)
	_, err := p.DownTo(context.Background(), 18)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"a": "3 t 30", "b": "5 f 51", "old": "9 f 90"},
		harness.Pairs[string, string](t, b.DB, `SELECT entity_id, version || ' ' || left(deleted::text, 1) || ' ' || event_id
		                                          FROM outbox_applied`))
	require.Zero(t, b.Int(t, `SELECT count(*) FROM pg_class WHERE relname LIKE 'outbox_ledger%'`))
}

// TestLedgerTakesOlderBinariesWrites: on 19, what a binary of before it
// writes to outbox_applied (its ack's upsert) lands in outbox_ledger too,
// so the next leader judges by it; once a binary of 19 has led, those
// writes are refused, so a binary that reads outbox_applied cannot ack.
func TestLedgerTakesOlderBinariesWrites(t *testing.T) {
	t.Parallel()
	b := harness.NewOutbox(t)
	asUpgraded(t, b)
	upsert := `INSERT INTO outbox_applied AS a (projection, entity_type, entity_id, version, deleted, event_id)
	           VALUES ('search', 'book', '1', $1, false, $1)
	           ON CONFLICT (projection, entity_type, entity_id) DO UPDATE SET version = excluded.version, event_id = excluded.event_id`
	b.Exec(t, upsert, 1)
	b.Exec(t, upsert, 2)
	require.Equal(t, 2, b.Int(t, `SELECT version FROM outbox_ledger_entry('search', 'book', '1')`))
	_, _, err := b.Store.LoadQueue(context.Background())
	require.NoError(t, err)
	_, err = b.DB.Pool.Exec(context.Background(), upsert, 3)
	require.ErrorContains(t, err, "a binary of 19 has led: upgrade this replica")
	require.Equal(t, 2, b.Int(t, `SELECT version FROM outbox_ledger_entry('search', 'book', '1')`))
}

// asUpgraded makes b's database one upgraded from before 19 on which no
// binary of 19 has led yet: a database migrated from nothing is switched
// at once (no older binary ever wrote outbox_applied there).
func asUpgraded(t *testing.T, b harness.Outbox) {
	t.Helper()
	b.Exec(t, `UPDATE outbox_ledger_rotation SET log_only = false`)
}

func provider(t *testing.T, url string) *goose.Provider {
	db, err := goose.OpenDBWithDriver("pgx", url)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	p, err := goose.NewProvider(goose.DialectPostgres, db, os.DirFS("."))
	require.NoError(t, err)
	return p
}

// TestEventsRotationRollsBack: undoing 00021 makes partition 0 the one
// table outbox_events again, with every row of every partition in it, its
// own indexes' names, its trigger and the views over it; applying it again
// partitions it again, and new rows go to the current partition.
func TestEventsRotationRollsBack(t *testing.T) {
	t.Parallel()
	b := harness.NewOutbox(t)
	insert := `INSERT INTO outbox_events (entity_type, entity_id, op) SELECT 'book', g::text, 'upsert' FROM generate_series(1, 3) g`
	b.Exec(t, insert)
	b.Exec(t, `UPDATE outbox_events_rotation SET slot = 2`)
	b.Exec(t, insert)
	b.Exec(t, `UPDATE outbox_events SET status = 'failed', error_reason = 'r', last_error = 'boom'
	            WHERE id = (SELECT max(id) FROM outbox_events)`)
	require.Equal(t, map[int]int{1: 3, 2: 3}, harness.Pairs[int, int](t, b.DB, `SELECT slot, count(*) FROM outbox_events GROUP BY slot`))
	p := provider(t, b.URL)
	_, err := p.DownTo(context.Background(), 20)
	require.NoError(t, err)

	require.Zero(t, b.Int(t, `SELECT count(*) FROM pg_class WHERE relname ~ '^outbox_events_[0-9]|^outbox_events_rotation$'`))
	require.Zero(t, b.Int(t, `SELECT count(*) FROM pg_partitioned_table WHERE partrelid = 'outbox_events'::regclass`), "outbox_events is one table again")
	require.Equal(t, 6, b.Int(t, `SELECT count(*) FROM outbox_events`))
	require.Equal(t, 1, b.Count(t, `status = 'failed' AND last_error = 'boom'`), "the views read the table")
	require.Equal(t, 1, b.Int(t, `SELECT count(*) FROM pg_indexes WHERE tablename = 'outbox_events' AND indexname = 'outbox_events_queued_idx'`))
	require.Equal(t, 1, b.Int(t, `SELECT count(*) FROM pg_trigger WHERE tgrelid = 'outbox_events'::regclass AND tgname = 'outbox_events_notify'`))
	b.Exec(t, insert)
	require.Equal(t, 8, b.Count(t, `queued`))

	_, err = p.Up(context.Background())
	require.NoError(t, err)
	require.Equal(t, map[int]int{0: 9}, harness.Pairs[int, int](t, b.DB, `SELECT slot, count(*) FROM outbox_events GROUP BY slot`))
	b.Exec(t, insert)
	require.Equal(t, map[int]int{0: 9, 1: 3}, harness.Pairs[int, int](t, b.DB, `SELECT slot, count(*) FROM outbox_events GROUP BY slot`))
	require.Equal(t, 12, b.Count(t, `true`), "the views read every partition")
}

// TestEventsRotationRefusesWhatWouldNotFollow: a trigger of the table's own
// or a foreign key to it would not see or accept the rows of the new
// partitions: 00021 refuses, naming them, and changes nothing.
func TestEventsRotationRefusesWhatWouldNotFollow(t *testing.T) {
	t.Parallel()
	b := harness.NewOutbox(t)
	p := provider(t, b.URL)
	_, err := p.DownTo(context.Background(), 20)
	require.NoError(t, err)
	b.Exec(t, `CREATE FUNCTION audit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$`)
	b.Exec(t, `CREATE TRIGGER audit_events AFTER INSERT ON outbox_events FOR EACH ROW EXECUTE FUNCTION audit()`)
	b.Exec(t, `CREATE TABLE receipts (event_id bigint REFERENCES outbox_events (id))`)

	_, err = p.Up(context.Background())
	require.ErrorContains(t, err, "migration 00021 cannot partition outbox_events: it has ")
	require.ErrorContains(t, err, "trigger audit_events")
	require.ErrorContains(t, err, "foreign key receipts_event_id_fkey of receipts")
	require.Zero(t, b.Int(t, `SELECT count(*) FROM pg_partitioned_table WHERE partrelid = 'outbox_events'::regclass`))
	require.Zero(t, b.Int(t, `SELECT count(*) FROM pg_attribute WHERE attrelid = 'outbox_events'::regclass AND attname = 'slot'`))

	b.Exec(t, `DROP TABLE receipts`)
	b.Exec(t, `DROP TRIGGER audit_events ON outbox_events`)
	_, err = p.Up(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, b.Int(t, `SELECT count(*) FROM pg_partitioned_table WHERE partrelid = 'outbox_events'::regclass`))
}
