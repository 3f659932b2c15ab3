package projection

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/classify"
	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/outbox"
)

type chronicleBundle struct {
	db        harness.DB
	chronicle *Chronicle
}

// chronicleSetup is a migrated database of the test's own and a chronicle
// on it whose payload limit is limit bytes.
func chronicleSetup(t *testing.T, limit int) chronicleBundle {
	t.Helper()
	b := chronicleBundle{db: harness.NewDatabase(t)}
	var err error
	b.chronicle, err = NewChronicle(ChronicleConfig{Pool: b.db.Pool, MaxPayloadBytes: limit})
	require.NoError(t, err)
	return b
}

func chronicleEvent(id int64, entity, op, payload string) outbox.Event {
	scope := "lib-1"
	return outbox.Event{ID: id, Projection: "chronicle", EntityType: "book", EntityID: entity, Op: op,
		Payload: json.RawMessage(payload), ScopeKey: &scope, CreatedAt: time.Now().Add(-time.Duration(id) * time.Minute)}
}

func TestChronicleAppendsEveryEventOnce(t *testing.T) {
	t.Parallel()
	b := chronicleSetup(t, 0)
	ctx := context.Background()
	require.False(t, IsLatestOnly(b.chronicle), "a timeline keeps every event: the ledger must not drop any")

	v := int64(7)
	events := []outbox.Event{
		chronicleEvent(1, "b1", outbox.OpUpsert, `{"title": "draft"}`),
		chronicleEvent(2, "b1", outbox.OpUpsert, `{"title": "final"}`),
		chronicleEvent(3, "b1", outbox.OpDelete, `{}`),
	}
	events[1].EventVersion = &v
	for _, r := range b.chronicle.Handle(ctx, events) {
		require.NoError(t, r.Err)
		require.False(t, r.Superseded, "every version of one entity is appended")
	}
	var op, title, scope string
	var version int64
	var occurred time.Time
	require.NoError(t, b.db.Pool.QueryRow(ctx, `
		SELECT op, version, payload->>'title', scope_key, occurred_at FROM chronicle_events WHERE event_id = 2`).
		Scan(&op, &version, &title, &scope, &occurred))
	require.Equal(t, "upsert", op)
	require.EqualValues(t, 7, version, "the producer's event_version")
	require.Equal(t, "final", title)
	require.Equal(t, "lib-1", scope)
	require.WithinDuration(t, events[1].CreatedAt, occurred, time.Millisecond, "occurred_at is the event's created_at")
	require.Equal(t, 3, b.db.Int(t, `SELECT count(*) FROM chronicle_events`))

	// A resend (a leader died before its ack, or a replay) appends nothing.
	results := b.chronicle.Handle(ctx, append(events, chronicleEvent(4, "b2", outbox.OpUpsert, `{}`)))
	for _, r := range results[:3] {
		require.NoError(t, r.Err)
		require.True(t, r.Superseded, "event %d was there already", r.ID)
	}
	require.False(t, results[3].Superseded)
	require.Equal(t, 4, b.db.Int(t, `SELECT count(*) FROM chronicle_events`))
}

func TestChronicleRefusesWhatItCannotAppend(t *testing.T) {
	t.Parallel()
	b := chronicleSetup(t, 64)
	ctx := context.Background()
	results := b.chronicle.Handle(ctx, []outbox.Event{
		chronicleEvent(1, "ok", outbox.OpUpsert, `{"title": "fits"}`),
		chronicleEvent(2, "big", outbox.OpUpsert, `{"body": "`+strings.Repeat("x", 100)+`"}`),
		chronicleEvent(3, "", outbox.OpUpsert, `{}`),
		// Not JSON: refused by Postgres, not by the handler. The batch fails
		// as a whole; the events are then appended one by one, so only this
		// one fails.
		chronicleEvent(4, "garbled", outbox.OpUpsert, `{not json`),
		chronicleEvent(5, "ok2", outbox.OpUpsert, `{}`),
	})
	reasons := map[int64]string{}
	for _, r := range results {
		if r.Err != nil {
			ce := classify.Classify(r.Err)
			require.Equal(t, classify.Deterministic, ce.Class, "event %d: %v", r.ID, r.Err)
			reasons[r.ID] = ce.Reason
		}
	}
	require.Equal(t, map[int64]string{2: classify.PayloadInvalid, 3: classify.PayloadInvalid, 4: classify.PayloadInvalid}, reasons)
	require.ErrorContains(t, results[1].Err, "the chronicle's limit is 64")
	require.ErrorContains(t, results[3].Err, "postgres 22P02")
	require.Equal(t, []int64{1, 5}, chronicleIDs(t, b.db))
}

func TestChronicleConnectionErrorIsTransient(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(),
		"postgres://nobody@127.0.0.1:"+strconv.Itoa(harness.Port(t))+"/none?connect_timeout=1")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	c, err := NewChronicle(ChronicleConfig{Pool: pool})
	require.NoError(t, err)
	results := c.Handle(context.Background(), []outbox.Event{
		chronicleEvent(1, "a", outbox.OpUpsert, `{}`), chronicleEvent(2, "b", outbox.OpUpsert, `{}`)})
	for _, r := range results {
		ce := classify.Classify(r.Err)
		require.Equal(t, classify.Transient, ce.Class, "%v", r.Err)
		require.Equal(t, classify.Connection, ce.Reason, "%v", r.Err)
	}
}

func TestNewChronicleNamesTheField(t *testing.T) {
	t.Parallel()
	_, err := NewChronicle(ChronicleConfig{})
	require.ErrorContains(t, err, "pool is required")
	_, err = NewChronicle(ChronicleConfig{Pool: &pgxpool.Pool{}, MaxPayloadBytes: -1})
	require.ErrorContains(t, err, "MaxPayloadBytes=-1 is out of range")
}

func chronicleIDs(t *testing.T, db harness.DB) []int64 {
	t.Helper()
	return harness.Column[int64](t, db, `SELECT event_id FROM chronicle_events ORDER BY event_id`)
}

// The ledger's capability is declared by the handler, not by its name.
func TestLatestOnlyIsDeclaredByTheHandler(t *testing.T) {
	t.Parallel()
	reg := Registry{"search": &Search{}, "chronicle": &Chronicle{}}
	require.Equal(t, map[string]bool{"search": true}, reg.LatestOnly())
}

// A chronicle configured with a table of its own appends there, and there
// only: the default table stays empty, and a resend appends nothing.
func TestChronicleWritesItsConfiguredTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := harness.NewDatabase(t)
	db.Exec(t, `CREATE SCHEMA app`)
	db.Exec(t, `CREATE TABLE app.timeline (LIKE chronicle_events INCLUDING ALL)`)
	c, err := NewChronicle(ChronicleConfig{Pool: db.Pool, Table: "app.timeline"})
	require.NoError(t, err)
	events := []outbox.Event{chronicleEvent(1, "b1", outbox.OpUpsert, `{"title": "draft"}`), chronicleEvent(2, "b1", outbox.OpDelete, `{}`)}
	for _, r := range c.Handle(ctx, events) {
		require.NoError(t, r.Err)
		require.False(t, r.Superseded)
	}
	for _, r := range c.Handle(ctx, events) {
		require.True(t, r.Superseded, "a resend appends nothing")
	}
	require.Equal(t, 2, db.Int(t, `SELECT count(*) FROM app.timeline`))
	require.Zero(t, db.Int(t, `SELECT count(*) FROM chronicle_events`), "the default table untouched")
}
