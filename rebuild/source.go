package rebuild

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The source table (the SoT) holds one row per document, written by the
// application in the same transaction as the document's outbox event:
//
//	entity_type text    -- with entity_id, the document's _id (type:id)
//	entity_id   text
//	doc         jsonb   -- the document, a JSON object
//	version     bigint  -- the version of the event that wrote the row
//
// A deleted document has no row. The primary key on (entity_type,
// entity_id) lets the load and a resume read in key order.
var sourceColumns = []struct {
	name  string
	types []string
}{
	{"entity_type", []string{"text", "character varying"}},
	{"entity_id", []string{"text", "character varying"}},
	{"doc", []string{"jsonb", "json"}},
	{"version", []string{"bigint", "integer", "smallint"}},
}

// CheckSource is checkSource for the other readers of the source table
// (wlproj verify), so that both accept exactly the same tables.
func CheckSource(ctx context.Context, pool *pgxpool.Pool, table string) (string, error) {
	return checkSource(ctx, pool, table)
}

// checkSource returns the source table's name as Postgres quotes it, or an
// *InputError naming the missing table or column. Only that quoted name,
// never the operator's text, goes into the statements that read the table.
func checkSource(ctx context.Context, pool *pgxpool.Pool, table string) (string, error) {
	if strings.TrimSpace(table) == "" {
		return "", inputf("no source table: give --from-table (the SoT, e.g. search_index)")
	}
	var quoted *string
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1)::text`, table).Scan(&quoted); err != nil {
		return "", inputf("source table %q: %v", table, err)
	}
	if quoted == nil {
		return "", inputf("source table %q does not exist", table)
	}
	rows, err := pool.Query(ctx, `
		SELECT attname, format_type(atttypid, NULL) FROM pg_attribute
		 WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped`, table)
	if err != nil {
		return "", fmt.Errorf("read the columns of %s: %w", *quoted, err)
	}
	have := map[string]string{}
	for rows.Next() {
		var name, typ string
		if err := rows.Scan(&name, &typ); err != nil {
			return "", err
		}
		have[name] = typ
	}
	if err := rows.Err(); err != nil {
		return "", err
	}
	for _, c := range sourceColumns {
		typ, ok := have[c.name]
		if !ok {
			return "", inputf("source table %s has no column %s (it needs entity_type text, entity_id text, doc jsonb, version bigint)", *quoted, c.name)
		}
		if !slices.Contains(c.types, typ) {
			return "", inputf("column %s of source table %s is %s, not %s", c.name, *quoted, typ, strings.Join(c.types, " or "))
		}
	}
	if err := checkKey(ctx, pool, table, *quoted); err != nil {
		return "", err
	}
	return *quoted, nil
}

// checkKey refuses a source table without a primary key (or a unique index
// on NOT NULL columns) on exactly (entity_type, entity_id): the load reads
// in pages after the last key, which would skip a row whose key is NULL or
// the twin of the row before it.
func checkKey(ctx context.Context, pool *pgxpool.Pool, table, quoted string) error {
	var ok bool
	err := pool.QueryRow(ctx, `
		SELECT EXISTS (
		  SELECT FROM pg_index i
		   WHERE i.indrelid = to_regclass($1) AND i.indisunique AND i.indpred IS NULL AND i.indexprs IS NULL
		     AND i.indnatts = 2
		     AND i.indkey[0] = (SELECT attnum FROM pg_attribute
		                         WHERE attrelid = to_regclass($1) AND attname = 'entity_type' AND attnotnull)
		     AND i.indkey[1] = (SELECT attnum FROM pg_attribute
		                         WHERE attrelid = to_regclass($1) AND attname = 'entity_id' AND attnotnull))`, table).Scan(&ok)
	if err != nil {
		return fmt.Errorf("read the indexes of %s: %w", quoted, err)
	}
	if !ok {
		return inputf("source table %s needs a primary key on (entity_type, entity_id), or a unique index on them "+
			"declared NOT NULL: the load reads it in key order, one document per key", quoted)
	}
	return nil
}

// sourceRow is one row of the source table.
type sourceRow struct {
	EntityType, EntityID string
	Doc                  json.RawMessage
	Version              int64
}

// key is a position in the source table's (entity_type, entity_id) order.
type key struct {
	Type, ID string
}

// afterKey is the WHERE clause of a read that resumes after a key; the
// first read has none, so that no row sorts before where it starts.
func afterKey(after *key) (string, []any) {
	if after == nil {
		return "", nil
	}
	return ` WHERE (entity_type, entity_id) > ($1, $2)`, []any{after.Type, after.ID}
}

// sourcePage is the rows one read of the source table returns, and
// countPage the keys one count walks. Each read is a statement of its own,
// so that no snapshot lives longer than one page: a snapshot held for a
// whole load would stop vacuum in the whole database for as long. Reading
// in key-ordered pages also lets Postgres walk the primary key, where one
// ordered read of the whole table would sort it all.
const (
	sourcePage = 2000
	countPage  = 50_000
)

// countSourceSQL counts up to countPage keys after a key (%s is afterKey's
// clause) and returns the last one: count(*) OVER () is taken before the
// outer ORDER BY and LIMIT keep the last row.
const countSourceSQL = `
SELECT count(*) OVER (), entity_type, entity_id
  FROM (SELECT entity_type, entity_id FROM %s%s ORDER BY entity_type, entity_id LIMIT %d) p
 ORDER BY entity_type DESC, entity_id DESC LIMIT 1`

// countSource counts the rows of table after a key, one page of keys per
// statement, for progress and the dry run. Rows written meanwhile may or
// may not be counted.
func countSource(ctx context.Context, db Querier, table string, after *key) (int64, error) {
	var total int64
	for {
		where, args := afterKey(after)
		var n int64
		var last key
		err := db.QueryRow(ctx, fmt.Sprintf(countSourceSQL, table, where, countPage), args...).Scan(&n, &last.Type, &last.ID)
		if errors.Is(err, pgx.ErrNoRows) {
			return total, nil
		}
		if err != nil {
			return total, fmt.Errorf("count %s: %w", table, err)
		}
		total += n
		if n < countPage {
			return total, nil
		}
		after = &last
	}
}

// readSource hands the rows of table after a key to each, in key order. It
// counts them first, for progress. Each page is read whole, and its
// statement over, before each sees its first row: each may wait for the
// engine, and a statement's snapshot lasts until its last row is read.
func readSource(ctx context.Context, db Querier, table string, after *key, counted func(int64), each func(sourceRow) error) error {
	total, err := countSource(ctx, db, table, after)
	if err != nil {
		return err
	}
	counted(total)
	for {
		rows, err := readPage(ctx, db, table, after)
		if err != nil {
			return err
		}
		for _, r := range rows {
			if err := each(r); err != nil {
				return err
			}
		}
		if len(rows) < sourcePage {
			return nil
		}
		after = &key{Type: rows[len(rows)-1].EntityType, ID: rows[len(rows)-1].EntityID}
	}
}

// readPage reads up to sourcePage rows after a key, in one statement.
func readPage(ctx context.Context, db Querier, table string, after *key) ([]sourceRow, error) {
	where, args := afterKey(after)
	rows, err := db.Query(ctx, `SELECT entity_type, entity_id, doc::text, version FROM `+table+where+
		` ORDER BY entity_type, entity_id LIMIT `+strconv.Itoa(sourcePage), args...)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", table, err)
	}
	page, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (sourceRow, error) {
		var r sourceRow
		var doc []byte
		var version *int64
		var typ, id *string
		if err := row.Scan(&typ, &id, &doc, &version); err != nil {
			return r, err
		}
		r.Doc = doc
		if typ != nil {
			r.EntityType = *typ
		}
		if id != nil {
			r.EntityID = *id
		}
		r.Version = -1 // a NULL version is refused as invalid, like a negative one
		if version != nil {
			r.Version = *version
		}
		return r, nil
	})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", table, err)
	}
	return page, nil
}
