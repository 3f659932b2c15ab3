package harness

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSourceWriterTakesEachDocumentsNewestEvent: one statement holding
// several events of a document leaves the SoT as the newest of them says,
// and every event reaches the outbox.
func TestSourceWriterTakesEachDocumentsNewestEvent(t *testing.T) {
	t.Parallel()
	db := NewDatabase(t)
	db.Exec(t, `CREATE TABLE sot (entity_type text, entity_id text, doc jsonb, version bigint, PRIMARY KEY (entity_type, entity_id))`)
	db.Exec(t, `INSERT INTO sot VALUES ('book', 'kept', '{}', 1), ('book', 'gone', '{}', 1)`)
	w := SourceWriter{DB: db.Pool, Table: "sot"}
	doc := json.RawMessage(`{"title": "t"}`)
	require.NoError(t, Insert(context.Background(), w, []Event{
		{EntityType: "book", EntityID: "kept", Op: "delete", Version: 2, Payload: doc},
		{EntityType: "book", EntityID: "kept", Op: "upsert", Version: 3, Payload: doc},
		{EntityType: "book", EntityID: "gone", Op: "upsert", Version: 2, Payload: doc},
		{EntityType: "book", EntityID: "gone", Op: "delete", Version: 3, Payload: doc},
		{EntityType: "book", EntityID: "new", Op: "upsert", Version: 4, Payload: doc},
		{EntityType: "book", EntityID: "new", Op: "delete", Version: 5, Payload: doc},
		{EntityType: "book", EntityID: "twice", Op: "upsert", Version: 6, Payload: doc},
		{EntityType: "book", EntityID: "twice", Op: "upsert", Version: 7, Payload: doc},
	}))
	var rows []string
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		`SELECT array_agg(entity_id || '@' || version ORDER BY entity_id) FROM sot`).Scan(&rows))
	require.Equal(t, []string{"kept@3", "twice@7"}, rows)
	require.Equal(t, 8, db.Int(t, `SELECT count(*) FROM outbox_events`))
}

// TestSourceDiff names a missing document, one at another version and one
// the source does not hold; a matching index gives no difference.
func TestSourceDiff(t *testing.T) {
	t.Parallel()
	c := verifyCase{db: NewDatabase(t), index: NewIndex(t)}
	c.db.Exec(t, `CREATE TABLE sot (entity_type text, entity_id text, doc jsonb, version bigint)`)
	c.db.Exec(t, `INSERT INTO sot VALUES ('book', 'same', '{}', 2), ('book', 'older', '{}', 5), ('book', 'missing', '{}', 1)`)
	c.doc(t, "same", 2)
	c.doc(t, "older", 4)
	c.doc(t, "extra", 1)
	diff, err := SourceDiff(context.Background(), c.db.Pool, ElasticURL(t), c.index, "sot")
	require.NoError(t, err)
	require.Equal(t, []string{
		"book:extra: at version 1, not in the source",
		"book:missing: missing, the source has version 1",
		"book:older: version 4, the source has 5",
	}, diff)

	c.db.Exec(t, `DELETE FROM sot WHERE entity_id = 'missing'`)
	c.db.Exec(t, `UPDATE sot SET version = 4 WHERE entity_id = 'older'`)
	c.db.Exec(t, `INSERT INTO sot VALUES ('book', 'extra', '{}', 1)`)
	SourceMatched(t, c.db.Pool, c.index, "sot")
}
