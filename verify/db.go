package verify

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
)

// querier is the snapshot's transaction or the pool.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// database reads the truth: the source table (its name as Postgres quotes
// it, from rebuild.CheckSource; never the operator's text) or, when table
// is empty, the projection's ledger entries.
type database struct {
	q          querier
	table      string
	projection string
}

// found is what the database holds for one index document.
type found struct {
	key    key
	hasKey bool
	source *SourceRow
	ledger *Entry
}

// lookupSQL reads, for each key an index id could be, its source row and
// ledger entry by primary key; see sourceSQL for its %[1]s and %[2]s.
const lookupSQL = `
SELECT c.i, c.entity_type, c.entity_id, %[1]s, a.version, a.deleted
  FROM unnest($1::int[], $2::text[], $3::text[]) AS c(i, entity_type, entity_id)
  %[2]s
  LEFT JOIN LATERAL outbox_ledger_entry($4, c.entity_type, c.entity_id) a ON true`

// sourceColumns and sourceJoin read the source row; noColumns stands in
// for them without a table.
const (
	sourceColumns = `s.entity_type IS NOT NULL, s.version::bigint`
	sourceJoin    = `LEFT JOIN %s s ON s.entity_type = c.entity_type AND s.entity_id = c.entity_id`
	noColumns     = `false, NULL::bigint`
)

// sourceSQL fills query's %[1]s (whether the source has the row, and its
// version) and %[2]s (the source's join), and %[3]s with extra.
func (db database) sourceSQL(query string, extra ...any) string {
	cols, join := noColumns, ""
	if db.table != "" {
		cols, join = sourceColumns, fmt.Sprintf(sourceJoin, db.table)
	}
	return fmt.Sprintf(query, append([]any{cols, join}, extra...)...)
}

// lookup finds each hit's key, source row and ledger entry. An id that is
// no entity's (keyOf) has no key.
func (db database) lookup(ctx context.Context, page []hit) ([]found, error) {
	out := make([]found, len(page))
	var is []int32
	var types, ids []string
	for i, h := range page {
		if k, ok := keyOf(h.ID); ok {
			out[i].key, out[i].hasKey = k, true
			is, types, ids = append(is, int32(i)), append(types, k.Type), append(ids, k.ID)
		}
	}
	if len(is) == 0 {
		return out, nil
	}
	rows, err := db.q.Query(ctx, db.sourceSQL(lookupSQL), is, types, ids, db.projection)
	if err != nil {
		return nil, fmt.Errorf("look up index documents in the database: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var i int32
		var k key
		var inSource bool
		var sourceVersion, ledgerVersion *int64
		var deleted *bool
		if err := rows.Scan(&i, &k.Type, &k.ID, &inSource, &sourceVersion, &ledgerVersion, &deleted); err != nil {
			return nil, fmt.Errorf("look up index documents in the database: %w", err)
		}
		if !inSource && ledgerVersion == nil {
			continue
		}
		f := found{key: k, hasKey: true}
		if inSource {
			f.source = &SourceRow{Version: orMinus1(sourceVersion)}
		}
		if ledgerVersion != nil {
			f.ledger = &Entry{Version: *ledgerVersion, Deleted: *deleted}
		}
		out[i] = f
	}
	return out, rows.Err()
}

func orMinus1(v *int64) int64 {
	if v == nil {
		return -1
	}
	return *v
}

// keyRow is one document of the truth, in key order.
type keyRow struct {
	key     key
	version int64
}

// keys reads up to n documents of the truth after a key, in key order:
// the source table walks its primary key, the ledger its own (projection,
// entity_type, entity_id). Pages after a key, like the rebuild's load, let
// Postgres walk the index where one ordered read would sort the table.
func (db database) keys(ctx context.Context, after *key, n int) ([]keyRow, error) {
	where, args := "", []any{}
	sql := `SELECT entity_type, entity_id, version::bigint FROM %s%s ORDER BY entity_type, entity_id LIMIT ` + strconv.Itoa(n)
	if db.table == "" {
		where, args = ` WHERE projection = $1 AND NOT deleted`, append(args, db.projection)
		if after != nil {
			where += ` AND (entity_type, entity_id) > ($2, $3)`
		}
	} else if after != nil {
		where = ` WHERE (entity_type, entity_id) > ($1, $2)`
	}
	if after != nil {
		args = append(args, after.Type, after.ID)
	}
	table := "outbox_ledger_entries"
	if db.table != "" {
		table = db.table
	}
	rows, err := db.q.Query(ctx, fmt.Sprintf(sql, table, where), args...)
	if err != nil {
		return nil, fmt.Errorf("read the keys of %s: %w", table, err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (keyRow, error) {
		var k keyRow
		var v *int64
		err := r.Scan(&k.key.Type, &k.key.ID, &v)
		k.version = orMinus1(v)
		return k, err
	})
}

// current is what the database holds of one document now.
type current struct {
	source   *SourceRow
	ledger   *Entry
	inFlight bool
}

// currentSQL reads the documents' source rows (with their docs when $4)
// and ledger entries as they are now, and which of them have an event
// pending or processing, in one statement: one snapshot, so that an event
// is either in flight or applied (its ack moved the ledger) in what it
// returns. The in-flight read is two arms, one per status, so that each
// walks its partial index and costs as little as the backlog; queued rows
// no position has passed are the third.
const currentSQL = `
WITH c AS (SELECT * FROM unnest($1::text[], $2::text[]) AS c(entity_type, entity_id)),
busy AS (
  SELECT e.entity_type, e.entity_id FROM outbox_events e JOIN c USING (entity_type, entity_id)
   WHERE e.status = 'pending' AND e.projection = $3
  UNION
  SELECT e.entity_type, e.entity_id FROM outbox_events e JOIN c USING (entity_type, entity_id)
   WHERE e.status = 'processing' AND e.projection = $3
  UNION
  SELECT b.entity_type, b.entity_id FROM outbox_queue_backlog b JOIN c USING (entity_type, entity_id)
   WHERE b.projection = $3
)
SELECT c.entity_type, c.entity_id, %[1]s, CASE WHEN $4 THEN %[3]s END, a.version, a.deleted,
       EXISTS (SELECT 1 FROM busy b WHERE b.entity_type = c.entity_type AND b.entity_id = c.entity_id)
  FROM c
  %[2]s
  LEFT JOIN LATERAL outbox_ledger_entry($3, c.entity_type, c.entity_id) a ON true`

// current reads the keys' documents as they are now.
func (db database) current(ctx context.Context, keys []key, docs bool) (map[key]current, error) {
	out := make(map[key]current, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	types, ids := make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		types[i], ids[i] = k.Type, k.ID
	}
	doc := "NULL::text"
	if db.table != "" {
		doc = "s.doc::text"
	}
	rows, err := db.q.Query(ctx, db.sourceSQL(currentSQL, doc), types, ids, db.projection, docs)
	if err != nil {
		return nil, fmt.Errorf("read the suspects from the database: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var k key
		var c current
		var inSource bool
		var sourceVersion, ledgerVersion *int64
		var body *string
		var deleted *bool
		if err := rows.Scan(&k.Type, &k.ID, &inSource, &sourceVersion, &body, &ledgerVersion, &deleted, &c.inFlight); err != nil {
			return nil, fmt.Errorf("read the suspects from the database: %w", err)
		}
		if inSource {
			c.source = &SourceRow{Version: orMinus1(sourceVersion)}
			if body != nil {
				c.source.Doc = []byte(*body)
			}
		}
		if ledgerVersion != nil {
			c.ledger = &Entry{Version: *ledgerVersion, Deleted: *deleted}
		}
		out[k] = c
	}
	return out, rows.Err()
}

// same reports whether two reads of a document found the same source row
// version and the same ledger entry: nothing was applied to it in between.
func (c current) same(o current) bool {
	switch {
	case (c.source == nil) != (o.source == nil) || (c.ledger == nil) != (o.ledger == nil):
		return false
	case c.source != nil && c.source.Version != o.source.Version:
		return false
	case c.ledger != nil && *c.ledger != *o.ledger:
		return false
	}
	return true
}
