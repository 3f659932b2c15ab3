package replica

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// tablesFile is a projections file whose chronicle appends to timeline and
// whose books projection rebuilds from source.
func tablesFile(t *testing.T, timeline, source string) Specs {
	specs, _ := tablesFileAt(t, timeline, source)
	return specs
}

// tablesFileAt is tablesFile with the file's path.
func tablesFileAt(t *testing.T, timeline, source string) (Specs, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "projections.yaml")
	require.NoError(t, os.WriteFile(path, []byte(`
projections:
  books:
    kind: search
    engine: {urls: [http://127.0.0.1:1]}
    index: books
    source_table: `+source+`
  timeline:
    kind: chronicle
    table: `+timeline+`
`), 0o600))
	specs, err := LoadProjections(path, os.Getenv)
	require.NoError(t, err)
	return specs, path
}

// Each table a projections file names is checked at start: missing, a
// column short, or (the chronicle's) without a unique event_id, it is
// refused naming the projection, the key and the table.
func TestStartChecksTheFilesTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := harness.NewDatabase(t)
	db.Exec(t, `CREATE SCHEMA app`)
	db.Exec(t, `CREATE TABLE app.timeline (LIKE chronicle_events INCLUDING ALL)`)
	db.Exec(t, `CREATE TABLE app.loose_timeline (LIKE chronicle_events)`)
	db.Exec(t, `CREATE TABLE books_source (entity_type text, entity_id text, doc jsonb, version bigint)`)
	db.Exec(t, `CREATE TABLE books_docless (entity_type text, entity_id text, version bigint)`)
	var path string
	check := func(timeline, source string) error {
		var specs Specs
		specs, path = tablesFileAt(t, timeline, source)
		return checkTables(ctx, db.Pool, specs, true, zerolog.Nop())
	}

	require.NoError(t, check("app.timeline", "books_source"))
	err := check("app.timelines", "books_source")
	require.EqualError(t, err, path+`:10: projection "timeline": table: table app.timelines does not exist in the outbox's database`)
	var bad *ProjectionsError
	require.ErrorAs(t, err, &bad, "a bad file, as the file's other errors")
	require.EqualError(t, check("app.timeline", "books_docless"),
		path+`:7: projection "books": source_table: table books_docless lacks column(s) doc (it needs entity_type, entity_id, doc, version)`)
	require.EqualError(t, check("app.loose_timeline", "books_source"),
		path+`:10: projection "timeline": table: table app.loose_timeline has no unique index on event_id alone (a resend must append nothing)`)
	require.NoError(t, checkTables(ctx, db.Pool, tablesFile(t, "app.timelines", "nope"), false, zerolog.Nop()),
		"the environment's defaults are not checked here")
}

// A database that does not answer is no bad table: the replica starts and
// waits for it, as it does without a file.
func TestStartWithoutTheDatabaseSkipsTheTablesCheck(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://127.0.0.1:1/none?connect_timeout=1")
	require.NoError(t, err)
	defer pool.Close()
	require.NoError(t, checkTables(context.Background(), pool, tablesFile(t, "app.timeline", "books_source"), true, zerolog.Nop()))
}
