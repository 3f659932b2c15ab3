package harness

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A copy of the template must be what migrating would have left: every
// row a migration writes with the moment it ran (a time, transaction or
// snapshot) is at least as new in a copy made after a fresh migration as
// in that migration. Goose's own table is left out: its times say when
// the template was migrated, and nothing reads them.
func TestTemplateCopyIsAFreshMigration(t *testing.T) {
	ctx := context.Background()
	_, err := migratedTemplate(ctx, AdminDatabaseURL(t))
	require.NoError(t, err)
	fresh := newDatabase(t, CreateDatabase)
	copied := NewDatabase(t)
	columns := momentColumns(t, fresh.Pool)
	require.NotEmpty(t, columns, "no column of a migration's moment found: the test proves nothing")
	checked := 0
	for _, c := range columns {
		was, is := c.newest(t, fresh.Pool), c.newest(t, copied.Pool)
		if was == nil {
			assert.Nil(t, is, "%s has rows in a copy and none after a fresh migration", c)
			continue
		}
		require.NotNil(t, is, "%s has rows after a fresh migration and none in a copy", c)
		assert.GreaterOrEqual(t, *is, *was, "%s in a copy is older than in the fresh migration before it: add its row to volatileRows", c)
		checked++
	}
	assert.GreaterOrEqual(t, checked, len(volatileRows), "fewer columns with rows than volatileRows resets")
}

// momentColumn is a column of a time, transaction id or snapshot type.
type momentColumn struct{ table, column, kind string }

func (c momentColumn) String() string { return c.table + "." + c.column }

// newest is the column's newest value as a number (seconds, or a
// transaction id: a snapshot's xmin), nil when the table has no rows.
func (c momentColumn) newest(t *testing.T, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) *float64 {
	t.Helper()
	col := pgx.Identifier{c.column}.Sanitize()
	expr := map[string]string{
		"timestamp with time zone":    "extract(epoch FROM max(%s))::float8",
		"timestamp without time zone": "extract(epoch FROM max(%s))::float8",
		"xid8":                        "max(%s::text::numeric)::float8",
		"pg_snapshot":                 "max(pg_snapshot_xmin(%s)::text::numeric)::float8",
	}[c.kind]
	require.NotEmpty(t, expr, "no comparison for %s's type %s", c, c.kind)
	var v *float64
	q := "SELECT " + fmt.Sprintf(expr, col) + " FROM " + pgx.Identifier{c.table}.Sanitize()
	require.NoError(t, pool.QueryRow(context.Background(), q).Scan(&v), q)
	return v
}

// momentColumns lists the columns of those types in the schema's tables
// (partitioned parents, not their partitions), goose's left out.
func momentColumns(t *testing.T, pool interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) []momentColumn {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
SELECT c.relname, a.attname, format_type(a.atttypid, NULL)
  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND NOT c.relispartition
   AND c.relname <> 'goose_db_version' AND a.attnum > 0 AND NOT a.attisdropped
   AND a.atttypid IN ('timestamptz'::regtype, 'timestamp'::regtype, 'xid8'::regtype, 'pg_snapshot'::regtype)
 ORDER BY 1, 2`)
	require.NoError(t, err)
	cols, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (momentColumn, error) {
		var c momentColumn
		return c, r.Scan(&c.table, &c.column, &c.kind)
	})
	require.NoError(t, err)
	return cols
}
