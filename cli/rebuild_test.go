package cli

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/projection"
	"github.com/wlproj/wlproj/rebuild"
)

func init() { rebuildBarTo = io.Discard }

// rbBundle is a database with a source table of n books and an index of
// the test's own (a concrete index until the first rebuild).
type rbBundle struct {
	db    harness.DB
	base  string
	alias string
}

func rebuildSetup(t *testing.T, rows int) rbBundle {
	t.Helper()
	b := rbBundle{db: harness.NewDatabase(t), base: harness.ElasticURL(t), alias: harness.NewIndex(t)}
	t.Cleanup(func() { _ = harness.DeleteIndex(context.Background(), b.base, b.alias+"-*") })
	b.db.Exec(t, `CREATE TABLE search_index (entity_type text NOT NULL, entity_id text NOT NULL, doc jsonb NOT NULL,
		version bigint NOT NULL, PRIMARY KEY (entity_type, entity_id))`)
	b.db.Exec(t, `INSERT INTO search_index SELECT 'book', 'b' || g, jsonb_build_object('kind', 'book', 'title', 'Book ' || g), 1
		FROM generate_series(1, $1) g`, rows)
	return b
}

// run runs wlproj rebuild in-process against this database and index.
func (b rbBundle) run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	args = append(append([]string{"rebuild"}, args...),
		"--database-url", b.db.URL, "--elastic-url", b.base, "--elastic-index", b.alias)
	code := Run(args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func (b rbBundle) events(t *testing.T, out string, event string) []map[string]any {
	t.Helper()
	var found []map[string]any
	for _, o := range jsonLines(t, out) {
		if o["event"] == event {
			found = append(found, o)
		}
	}
	return found
}

// TestCmdRebuild: dry run, the first rebuild (a concrete index becomes an
// alias), a second (the old index kept), cleanup, and what is refused after.
func TestCmdRebuild(t *testing.T) {
	t.Parallel()
	b := rebuildSetup(t, 2000)
	harness.Leader(t, harness.StartReplica(t, "r1", harness.ReplicaEnv(b.db.URL, b.base, b.alias, harness.Quick...)))
	who := []string{"--by", "alice", "--why", "mapping v2 (CHG-9)"}

	code, out, errOut := b.run(t, append([]string{"--from-table", "search_index", "--dry-run", "--progress", "bar"}, who...)...)
	require.Zero(t, code, errOut)
	require.Contains(t, out, "source search_index: 2000 rows\n")
	require.Contains(t, out, "would replace the concrete index "+b.alias+" by an alias")
	require.True(t, strings.HasSuffix(out, "dry run: nothing changed\n"), out)
	require.Zero(t, b.db.Int(t, `SELECT count(*) FROM outbox_rebuilds`))

	// Not on a terminal: one JSON object per line.
	code, out, errOut = b.run(t, append([]string{"--from-table", "search_index"}, who...)...)
	require.Zero(t, code, errOut)
	progress := b.events(t, out, "progress")
	require.NotEmpty(t, progress)
	last := progress[len(progress)-1]
	require.Equal(t, []any{"load", 2000.0, 2000.0}, []any{last["phase"], last["done"], last["total"]})
	done := b.events(t, out, "done")
	require.Len(t, done, 1)
	require.Equal(t, true, done[0]["ok"])
	report := done[0]["report"].(map[string]any)
	require.Equal(t, true, report["converted"])
	first := report["rebuild"].(map[string]any)["target_index"].(string)
	require.Contains(t, out, "was a concrete index: replaced it")

	mapping := filepath.Join(harness.Root(t), "testdata", "mapping.json")
	code, out, errOut = b.run(t, append([]string{"--from-table", "search_index", "--mapping", mapping, "--progress", "bar"}, who...)...)
	require.Zero(t, code, errOut)
	require.Contains(t, out, "swapped alias "+b.alias+" from "+first+" to ")
	require.Regexp(t, `rebuild #2 done: 2000 source rows from search_index into \S+ in [\d.]+s`, out)

	// The first cleanup closes the first rebuild (its concrete index went
	// in the swap) and releases the second's old index, which the leader
	// kept writing for a rollback; the next one after AbortGrace deletes it.
	code, out, errOut = b.run(t, append([]string{"--cleanup"}, who...)...)
	require.Zero(t, code, errOut)
	require.Contains(t, out, "rebuild #2: the leader stops writing "+first+" (no rollback to it any more)")
	require.Contains(t, out, "rebuild #1: closed; no index of it was left to delete")
	code, _, errOut = b.run(t, append([]string{"--rollback"}, who...)...)
	require.Equal(t, exitRefused, code, errOut)
	require.Contains(t, errOut, "--cleanup released the old index "+first+" of rebuild #2")
	code, _, errOut = b.run(t, append([]string{"--cleanup"}, who...)...)
	require.Equal(t, exitRefused, code, errOut)
	require.Contains(t, errOut, "index "+first+" of swapped rebuild #2 is kept until")
	b.db.Exec(t, `UPDATE outbox_rebuilds SET released_at = released_at - interval '2 minutes' WHERE id = 2`)
	code, out, errOut = b.run(t, append([]string{"--cleanup"}, who...)...)
	require.Zero(t, code, errOut)
	require.Contains(t, out, "deleted index "+first)
	code, _, errOut = b.run(t, append([]string{"--cleanup"}, who...)...)
	require.Equal(t, exitRefused, code)
	require.Contains(t, errOut, `nothing to clean for projection "search"`)
	code, _, errOut = b.run(t, append([]string{"--abort"}, who...)...)
	require.Equal(t, exitRefused, code)
	require.Contains(t, errOut, `no open rebuild of projection "search" to abort; nothing changed`)

	require.Equal(t, "open,swap,open,swap,release,cleanup,cleanup", strings.Join(b.steps(t), ","))
	require.Equal(t, 1, b.db.Int(t, `SELECT count(*) FROM outbox_replay_audit WHERE action = 'rebuild'
		AND replayed_by = 'alice' AND reason = 'mapping v2 (CHG-9)' AND selector->>'step' = 'swap' AND event_count = 2000
		AND selector->'rebuild'->>'old_index' = $1`, first))
}

// TestCmdRebuildRefusesASwapThatWouldLoseDocuments: exit 3 while the new
// index lacks a document the old one has because the new mapping refused
// its row, the alias as it was and the rebuild open; the same command with
// --allow-refused swaps, exit 0, and the swap's audit row names the
// document.
func TestCmdRebuildRefusesASwapThatWouldLoseDocuments(t *testing.T) {
	t.Parallel()
	b := rebuildSetup(t, 10)
	require.NoError(t, harness.ES(context.Background(), b.base, http.MethodPut, "/"+b.alias+"/_mapping",
		[]byte(`{"properties": {"colour": {"type": "keyword"}}}`), nil), "the old index takes a colour")
	harness.Leader(t, harness.StartReplica(t, "r1", harness.ReplicaEnv(b.db.URL, b.base, b.alias, harness.Quick...)))
	b.db.Exec(t, `UPDATE search_index SET doc = doc || '{"colour": "red"}' WHERE entity_id = 'b3'`)
	b.db.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload)
		SELECT entity_type, entity_id, 'upsert', version, doc FROM search_index`)
	harness.Drained(t, b.db.Pool, 30*time.Second)
	args := []string{"--from-table", "search_index", "--mapping", filepath.Join(harness.Root(t), "testdata", "mapping.json"),
		"--by", "alice", "--why", "mapping v2 (CHG-9)"}

	code, out, errOut := b.run(t, args...)
	require.Equal(t, exitRefused, code, errOut)
	require.Contains(t, errOut, "lacks 1 documents that "+b.alias+" has, because the rebuild refused their rows (book:b3")
	require.Equal(t, false, b.events(t, out, "done")[0]["ok"])
	require.Equal(t, 1, b.db.Int(t, `SELECT count(*) FROM outbox_rebuilds WHERE state = 'open'`))

	code, out, errOut = b.run(t, append(args, "--allow-refused")...)
	require.Zero(t, code, errOut)
	report := b.events(t, out, "done")[0]["report"].(map[string]any)
	require.Equal(t, []any{"book:b3"}, report["lost_ids"])
	require.Equal(t, 1, b.db.Int(t, `SELECT count(*) FROM outbox_replay_audit WHERE action = 'rebuild'
		AND selector->>'step' = 'swap' AND selector->'lost_ids' = '["book:b3"]'`))
	require.Equal(t, 1, b.db.Int(t, `SELECT count(*) FROM outbox_rebuilds WHERE state = 'swapped'`))
}

func (b rbBundle) steps(t *testing.T) []string {
	t.Helper()
	var s string
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT coalesce(string_agg(selector->>'step', ',' ORDER BY id), '')
		FROM outbox_replay_audit WHERE action = 'rebuild'`).Scan(&s))
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// TestCmdRebuildBadInput: exit 2 for what the operator must fix, 3 for a
// refusal; nothing changed either way.
func TestCmdRebuildBadInput(t *testing.T) {
	t.Parallel()
	b := rebuildSetup(t, 5)
	notJSON := filepath.Join(t.TempDir(), "mapping.json")
	require.NoError(t, os.WriteFile(notJSON, []byte("mappings:\n  dynamic: strict\n"), 0o600))
	who := []string{"--by", "alice", "--why", "x"}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--from-table", "search_index"}, exitUsage, "--by and --why are required"},
		{append([]string{}, who...), exitUsage, "--from-table is required"},
		{append([]string{"--from-table", "search_index", "--projection", "chronicle"}, who...), exitUsage,
			`projection "chronicle" cannot be rebuilt`},
		{append([]string{"--from-table", "books"}, who...), exitUsage, `source table "books" does not exist; nothing changed`},
		{append([]string{"--from-table", "search_index", "--mapping", notJSON}, who...), exitUsage, "is not a JSON object; nothing changed"},
		{append([]string{"--from-table", "search_index", "--bulk-size", "0"}, who...), exitUsage, "--bulk-size=0 is out of range [1, 10000]"},
		{append([]string{"--cleanup", "--from-table", "search_index"}, who...), exitUsage, "--cleanup, --abort and --rollback take no other action flag"},
		{append([]string{"--abort", "--rollback"}, who...), exitUsage, "--cleanup, --abort and --rollback take no other action flag"},
		{append([]string{"--rollback"}, who...), exitRefused, `no rebuild of projection "search" to roll back`},
		{append([]string{"--cleanup"}, who...), exitRefused, "nothing to clean"},
	} {
		code, _, errOut := b.run(t, tc.args...)
		require.Equal(t, tc.code, code, "%v: %s", tc.args, errOut)
		require.Contains(t, errOut, tc.want, "%v", tc.args)
	}

	release, ok, err := rebuild.TryLock(context.Background(), b.db.Pool, projection.SearchName)
	require.NoError(t, err)
	require.True(t, ok)
	code, _, errOut := b.run(t, append([]string{"--from-table", "search_index"}, who...)...)
	release()
	require.Equal(t, exitRefused, code, errOut)
	require.Contains(t, errOut, "another rebuild command of projection \"search\" is running")
	require.Contains(t, errOut, "(Postgres backend pid ")

	require.Zero(t, b.db.Int(t, `SELECT count(*) FROM outbox_rebuilds`))
	require.Empty(t, b.steps(t))
}

// TestStatusShowsRebuildConfirmation: wlproj status shows the rebuild the
// leader writes both indexes of, and says so loudly when the current
// leader's epoch has not confirmed it: a swap would be refused.
func TestStatusShowsRebuildConfirmation(t *testing.T) {
	t.Parallel()
	db := harness.NewDatabase(t)
	db.Exec(t, `INSERT INTO outbox_leader (name, holder, epoch) VALUES ('L', 'w2', 8)`)
	db.Exec(t, `INSERT INTO outbox_rebuilds (projection, alias, target_index, old_index, source_table, mode, started_by, reason,
		dual_write_at, dual_write_by, dual_write_epoch, dual_write_leader, dual_write_seen_at, dual_write_since)
		VALUES ('search', 'books', 'books-new', 'books-old', 'search_index', 'bulk', 'alice', 'test',
		        now(), 'w1', 7, 'L', now(), now())`)
	status := func(args ...string) string {
		var stdout, stderr bytes.Buffer
		code := Run(append([]string{"status", "--database-url", db.URL}, args...), &stdout, &stderr)
		require.Zero(t, code, stderr.String())
		return stdout.String()
	}
	require.Contains(t, status(), "rebuild #1 of search (open): writing books-new and books-old: NOT CONFIRMED: "+
		"the current leader (epoch 8, worker w2) has not confirmed; the last confirmation was epoch 7 by w1\n")
	j := jsonLines(t, status("--json"))[0]["rebuilds"].([]any)[0].(map[string]any)
	require.Equal(t, false, j["confirmed"])
	require.Equal(t, 8.0, j["leader_epoch"])

	db.Exec(t, `UPDATE outbox_rebuilds SET dual_write_by = 'w2', dual_write_epoch = 8, dual_write_seen_at = now()`)
	require.Regexp(t, `rebuild #1 of search \(open\): writing books-new and books-old: confirmed by the leader \(epoch 8, worker w2\) \S+ ago\n`, status())
	j = jsonLines(t, status("--json"))[0]["rebuilds"].([]any)[0].(map[string]any)
	require.Equal(t, true, j["confirmed"])
}
