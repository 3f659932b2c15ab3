package migrations

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestFilesFollowConvention checks every migration file against the
// convention at the top of migrate.go, so a new file that would block the
// application's writes fails here before it reaches a database.
func TestFilesFollowConvention(t *testing.T) {
	t.Parallel()
	files, err := loadFiles(embedded)
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		require.NoError(t, checkConvention(f))
	}
}

// TestConventionRefusesBlockingStatements: the checker catches each way a
// migration could block producers or fail on rerun; today's v15 files (in
// testdata) break it.
func TestConventionRefusesBlockingStatements(t *testing.T) {
	t.Parallel()
	for name, src := range map[string]string{
		"plain index on outbox_events":       "-- +goose Up\nCREATE INDEX x ON outbox_events (id);\n",
		"concurrent without IF NOT EXISTS":   "-- +goose NO TRANSACTION\n-- +goose Up\nCREATE INDEX CONCURRENTLY x ON outbox_events (id);\n",
		"concurrent in a transaction":        "-- +goose Up\nCREATE INDEX CONCURRENTLY IF NOT EXISTS x ON outbox_events (id);\n",
		"alter with others in a transaction": "-- +goose Up\nALTER TABLE outbox_events ADD COLUMN a text;\nCREATE TABLE t (a int);\n",
		"not idempotent add column":          "-- +goose NO TRANSACTION\n-- +goose Up\nALTER TABLE outbox_events ADD COLUMN a text;\n",
		"not idempotent drop constraint":     "-- +goose NO TRANSACTION\n-- +goose Up\nALTER TABLE outbox_events DROP CONSTRAINT c;\n",
		"not idempotent create table":        "-- +goose NO TRANSACTION\n-- +goose Up\nCREATE TABLE t (a int);\n",
		"a DO block without its locks":       "-- +goose Up\n-- +goose StatementBegin\nDO $$ BEGIN PERFORM 1; END $$;\n-- +goose StatementEnd\n",
	} {
		f, err := parseFile(src)
		require.NoError(t, err, name)
		f.Name = name
		require.Error(t, checkConvention(f), name)
	}

	for _, ok := range []string{
		"-- +goose Up\nALTER TABLE outbox_events ADD COLUMN a text;\n",
		"-- +goose Up\nCREATE TABLE t (a int);\nCREATE INDEX t_a ON t (a);\n",
		"-- +goose NO TRANSACTION\n-- +goose Up\nCREATE INDEX CONCURRENTLY IF NOT EXISTS x ON outbox_events (id);\n",
	} {
		f, err := parseFile(ok)
		require.NoError(t, err)
		require.NoError(t, checkConvention(f), ok)
	}

	old, err := loadFiles(os.DirFS("testdata/v15"))
	require.NoError(t, err)
	var broken []string
	for _, f := range old {
		if checkConvention(f) != nil {
			broken = append(broken, f.Name)
		}
	}
	require.Equal(t, []string{"00002_replay_audit_by_time.sql", "00003_payload_out_of_line.sql", "00004_applied_ledger.sql", "00005_dead_letter.sql",
		"00008_console.sql", "00011_ledger_live_idx.sql"}, broken)
}

func TestParseSplitsStatements(t *testing.T) {
	t.Parallel()
	f, err := parseFile(`-- +goose NO TRANSACTION
-- +goose Up
-- a comment
CREATE TABLE t (
    a int -- trailing;
);
-- +wlproj locks none
-- +goose StatementBegin
DO $$ BEGIN PERFORM 1; END $$;
-- +goose StatementEnd
-- +wlproj requires-extension pg_trgm
CREATE INDEX CONCURRENTLY IF NOT EXISTS i ON t (a);

-- +goose Down
DROP TABLE t;
`)
	require.NoError(t, err)
	require.True(t, f.NoTx)
	require.Len(t, f.Up, 3)
	require.Equal(t, "CREATE TABLE t (\n    a int -- trailing;\n);", f.Up[0].SQL)
	require.Equal(t, "none", f.Up[1].Locks)
	require.Equal(t, "pg_trgm", f.Up[2].RequiresExtension)
	require.Equal(t, []statement{{SQL: "DROP TABLE t;"}}, f.Down)

	_, err = parseFile("-- +goose Up\n-- +wlproj frobnicate\nSELECT 1;\n")
	require.ErrorContains(t, err, "unknown directive")
}
