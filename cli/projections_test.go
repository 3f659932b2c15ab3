package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

const projectionsSecret = "pw-Never-Printed-7"

// projectionsFile writes a file of two search projections and the
// chronicle, with books' password by environment variable.
func projectionsFile(t *testing.T, booksIndex string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "projections.yaml")
	require.NoError(t, os.WriteFile(path, []byte(`
projections:
  books:
    kind: search
    engine: {urls: [http://127.0.0.1:1], username: wlproj, password_env: WLPROJ_TEST_BOOKS_PW}
    index: `+booksIndex+`
  blocks:
    kind: search
    engine: {urls: [http://127.0.0.1:2]}
    index: blocks
  timeline:
    kind: chronicle
`), 0o600))
	return path
}

func TestProjectionsCheckAndList(t *testing.T) {
	t.Setenv("WLPROJ_TEST_BOOKS_PW", projectionsSecret)
	path := projectionsFile(t, "books")
	t.Setenv("DATABASE_URL", "")
	code, out, errs := runCLI(t, "projections", "check", "--projections-file", path)
	require.Zero(t, code, errs)
	require.Regexp(t, `projections.yaml: 3 projections \(blocks, books, timeline\), hash [0-9a-f]{16}\n`, out)
	require.Contains(t, out, "tables: not checked, no DATABASE_URL given", "says it did not look at the database")

	code, out, errs = runCLI(t, "projections", "list", "--projections-file", path)
	require.Zero(t, code, errs)
	require.Contains(t, out, "basic wlproj, password from env WLPROJ_TEST_BOOKS_PW")
	require.Regexp(t, `\nblocks +search +blocks +http://127.0.0.1:2 +none`, out)
	require.NotContains(t, out, projectionsSecret)

	// Listing needs no secret: the CLI of an operator without it.
	t.Setenv("WLPROJ_TEST_BOOKS_PW", "")
	code, out, errs = runCLI(t, "projections", "list", "--projections-file", path, "--json")
	require.Zero(t, code, errs)
	require.Equal(t, 3, strings.Count(out, "\n"), out)
	code, _, errs = runCLI(t, "projections", "check", "--projections-file", path)
	require.Equal(t, 2, code)
	require.Contains(t, errs, `projection "books": engine.password_env: the environment variable WLPROJ_TEST_BOOKS_PW is not set or empty`)
}

// sourceFile writes a projections file whose books projection verifies and
// rebuilds from source, on line 7.
func sourceFile(t *testing.T, source string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "projections.yaml")
	require.NoError(t, os.WriteFile(path, []byte(`
projections:
  books:
    kind: search
    engine: {urls: [http://127.0.0.1:1]}
    index: books
    source_table: `+source+`
`), 0o600))
	return path
}

// check reads the tables the file names in the database, as run does, and
// refuses a missing one naming file, line and key, as run does too; it
// says when it did not look.
func TestProjectionsCheckReadsTheDatabaseAsRunDoes(t *testing.T) {
	db := harness.NewDatabase(t)
	path := sourceFile(t, "missing_source")
	want := path + `:7: projection "books": source_table: table missing_source does not exist in the outbox's database`
	code, _, errs := runCLI(t, "projections", "check", "--projections-file", path, "--database-url", db.URL)
	require.Equal(t, 2, code, errs)
	require.Contains(t, errs, want)
	code, _, errs = runCLI(t, "run", "--projections-file", path, "--database-url", db.URL)
	require.Equal(t, 2, code, errs)
	require.Contains(t, errs, want)

	db.Exec(t, `CREATE TABLE missing_source (entity_type text, entity_id text, doc jsonb, version bigint)`)
	code, out, errs := runCLI(t, "projections", "check", "--projections-file", path, "--database-url", db.URL)
	require.Zero(t, code, errs)
	require.Contains(t, out, "tables: 1 checked in the database")

	code, out, errs = runCLI(t, "projections", "check", "--projections-file", path, "--database-url", "postgres://127.0.0.1:1/none?connect_timeout=1")
	require.Equal(t, 1, code, out)
	require.Contains(t, errs, "tables not checked: the database did not answer")
}

// A bad projections file stops run before anything connects, naming the
// file, the projection and the key, and shows no secret.
func TestRunRefusesABadProjectionsFile(t *testing.T) {
	t.Setenv("WLPROJ_TEST_BOOKS_PW", projectionsSecret)
	path := projectionsFile(t, "Books")
	code, out, errs := runCLI(t, "run", "--database-url", "postgres://127.0.0.1:1/none", "--projections-file", path)
	require.Equal(t, 2, code, errs)
	require.Contains(t, errs, path+`:6: projection "books": index: "Books" is not an index name`)
	require.NotContains(t, out+errs, projectionsSecret)
}

// pause knows the file's projections: it pauses one of them, and refuses
// a name the file does not have.
func TestPauseKnowsTheFilesProjections(t *testing.T) {
	b := pauseBundle{db: harness.NewDatabase(t)}
	path := projectionsFile(t, "books")
	code, _, errs := b.run(t, "pause", "--projections-file", path, "--projection", "search", "--by", "ada", "--why", "test")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errs, `unknown projection "search"; this wlproj knows blocks, books, timeline; nothing changed`)
	b.unchanged(t)
	code, out, errs := b.run(t, "pause", "--projections-file", path, "--projection", "blocks", "--by", "ada", "--why", "test")
	require.Zero(t, code, errs)
	require.Contains(t, out, "paused blocks")
}

// rebuild and verify take a search projection of the file; any other name
// is refused before anything connects.
func TestRebuildAndVerifyTakeTheFilesSearchProjections(t *testing.T) {
	t.Setenv("WLPROJ_TEST_BOOKS_PW", projectionsSecret)
	path := projectionsFile(t, "books")
	for _, args := range [][]string{
		{"rebuild", "--by", "ada", "--why", "t", "--from-table", "src"},
		{"verify"},
	} {
		for name, want := range map[string]string{
			"timeline": `projection "timeline" is not a search projection of ` + path + ` (its search projections: blocks, books)`,
			"search":   `projection "search" is not a search projection of `,
		} {
			code, out, errs := runCLI(t, append(args, "--database-url", "postgres://127.0.0.1:1/none", "--projections-file", path, "--projection", name)...)
			require.Equal(t, 2, code, "%v %s: %s", args, name, errs)
			require.Contains(t, errs, want)
			require.Empty(t, out)
		}
	}
	// Without a source table in the file or --from-table, rebuild has nothing to load.
	code, _, errs := runCLI(t, "rebuild", "--by", "ada", "--why", "t", "--database-url", "postgres://127.0.0.1:1/none",
		"--projections-file", path, "--projection", "books")
	require.Equal(t, 2, code)
	require.Contains(t, errs, "--from-table is required")
}

// Help does not claim the built-in names when a file may name others, and
// says what a projections file makes of --elastic-index.
func TestHelpSaysWhatTheProjectionsFileChanges(t *testing.T) {
	words := func(s string) string { return strings.Join(strings.Fields(s), " ") } // help wraps its lines
	code, out, errs := runCLI(t, "pause", "--help")
	require.Zero(t, code, errs)
	require.NotContains(t, words(out), "one of chronicle, search.")
	require.Contains(t, words(out), "--projection=NAME The projection: one the projections file names, or without a file chronicle or search.")

	code, out, errs = runCLI(t, "run", "--help")
	require.Zero(t, code, errs)
	require.Contains(t, words(out), `--elastic-index="search" Index the search projection writes to; ignored with a projections file`)
}
