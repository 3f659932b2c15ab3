package harness

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// SourceWriter is an application that keeps a source-of-truth table (the
// rebuild's SoT: entity_type, entity_id, doc, version) and writes its
// outbox events in the same statement, hence the same transaction. It takes
// Insert's parameters, so Produce drives it.
type SourceWriter struct {
	DB Execer
	// Table is the SoT's name, trusted test input.
	Table string
}

// The SoT takes only each document's newest event of the statement: two
// data-modifying CTEs touching one row see the same snapshot, and which of
// them wins is unspecified (an upsert and a later delete of one document in
// one batch could leave the row while the index has the delete).
const sourceWriteSQL = `
WITH ev AS (
  SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::jsonb[], $6::text[])
      AS u(entity_type, entity_id, op, version, payload, scope_key)
), newest AS (
  SELECT DISTINCT ON (entity_type, entity_id) * FROM ev ORDER BY entity_type, entity_id, version DESC
), up AS (
  INSERT INTO %[1]s AS s (entity_type, entity_id, doc, version)
  SELECT entity_type, entity_id, payload, version FROM newest WHERE op = 'upsert'
  ON CONFLICT (entity_type, entity_id) DO UPDATE SET doc = excluded.doc, version = excluded.version
   WHERE s.version < excluded.version
), del AS (
  DELETE FROM %[1]s s USING newest
   WHERE newest.op = 'delete' AND s.entity_type = newest.entity_type AND s.entity_id = newest.entity_id
     AND s.version < newest.version
)
INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload, scope_key)
SELECT entity_type, entity_id, op, version, payload, scope_key FROM ev`

// Exec writes the events given as Insert's parameters; sql is ignored.
func (w SourceWriter) Exec(ctx context.Context, _ string, args ...any) (pgconn.CommandTag, error) {
	return w.DB.Exec(ctx, fmt.Sprintf(sourceWriteSQL, w.Table), args...)
}

// SourceDiff compares an index with a SoT table: every row's document must
// be in the index at the row's version, and nothing else.
func SourceDiff(ctx context.Context, pool *pgxpool.Pool, base, index, table string) ([]string, error) {
	docs, err := versions(ctx, base, index)
	if err != nil {
		return nil, err
	}
	rows, err := pool.Query(ctx, `SELECT entity_type || ':' || entity_id, version FROM `+table)
	if err != nil {
		return nil, err
	}
	var diff []string
	for rows.Next() {
		var id string
		var version int64
		if err := rows.Scan(&id, &version); err != nil {
			return nil, err
		}
		got, ok := docs[id]
		switch {
		case !ok:
			diff = append(diff, fmt.Sprintf("%s: missing, the source has version %d", id, version))
		case got != version:
			diff = append(diff, fmt.Sprintf("%s: version %d, the source has %d", id, got, version))
		}
		delete(docs, id)
	}
	for id, v := range docs {
		diff = append(diff, fmt.Sprintf("%s: at version %d, not in the source", id, v))
	}
	slices.Sort(diff)
	return diff, rows.Err()
}

// SourceMatched fails the test unless index holds exactly table's rows.
func SourceMatched(t testing.TB, pool *pgxpool.Pool, index, table string) {
	t.Helper()
	diff, err := SourceDiff(context.Background(), pool, ElasticURL(t), index, table)
	require.NoError(t, err)
	require.Empty(t, diff, "index %s against source table %s", index, table)
}
