package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// vfBundle is a database with a source table of books b1..bN at version 1,
// and an index and a ledger that agree with it, as a leader leaves them.
type vfBundle struct {
	db    harness.DB
	base  string
	index string
}

func verifySetup(t *testing.T, books int) vfBundle {
	t.Helper()
	return verifySetupOn(t, harness.NewDatabase(t), books)
}

func verifySetupOn(t *testing.T, db harness.DB, books int) vfBundle {
	t.Helper()
	b := vfBundle{db: db, base: harness.ElasticURL(t), index: harness.NewIndex(t)}
	b.db.Exec(t, `CREATE TABLE search_index (entity_type text NOT NULL, entity_id text NOT NULL, doc jsonb NOT NULL,
		version bigint NOT NULL, PRIMARY KEY (entity_type, entity_id))`)
	b.db.Exec(t, `INSERT INTO search_index SELECT 'book', 'b' || g, jsonb_build_object('kind', 'book', 'title', 'Book ' || g), 1
		FROM generate_series(1, $1) g`, books)
	b.db.Exec(t, `INSERT INTO outbox_ledger (projection, entity_type, entity_id, version, deleted, event_id)
		SELECT 'search', 'book', 'b' || g, 1, false, g FROM generate_series(1, $1) g`, books)
	var bulk strings.Builder
	for g := 1; g <= books; g++ {
		fmt.Fprintf(&bulk, `{"index": {"_id": "book:b%d", "version": 1, "version_type": "external_gte"}}`+"\n"+
			`{"kind": "book", "title": "Book %d"}`+"\n", g, g)
	}
	b.es(t, http.MethodPost, "/"+b.index+"/_bulk?refresh=true", bulk.String())
	return b
}

func (b vfBundle) es(t *testing.T, method, path, body string) {
	t.Helper()
	require.NoError(t, harness.ES(context.Background(), b.base, method, path, []byte(body), nil))
}

// plant leaves one document of each kind: b1 deleted by hand in the
// engine (missing), b2's row at version 5 with no event (stale), x1
// written by hand (extra), b3 deleted in the source and the ledger but
// not in the index (resurrected).
func (b vfBundle) plant(t *testing.T) {
	t.Helper()
	b.es(t, http.MethodPost, "/"+b.index+"/_bulk?refresh=true", `{"delete": {"_id": "book:b1"}}`+"\n")
	b.db.Exec(t, `UPDATE search_index SET version = 5, doc = '{"kind": "book", "title": "Book 2, fifth"}' WHERE entity_id = 'b2'`)
	b.es(t, http.MethodPut, "/"+b.index+"/_doc/book:x1?version=3&version_type=external_gte&refresh=true", `{"kind": "book", "title": "Stray"}`)
	b.db.Exec(t, `DELETE FROM search_index WHERE entity_id = 'b3'`)
	b.db.Exec(t, `UPDATE outbox_ledger SET version = 2, deleted = true WHERE entity_id = 'b3'`)
}

// run runs wlproj verify in-process against this database and index.
func (b vfBundle) run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	args = append(append([]string{"verify"}, args...),
		"--database-url", b.db.URL, "--elastic-url", b.base, "--elastic-index", b.index)
	code := Run(args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// changes is what an action could have changed: events and audit rows.
func (b vfBundle) changes(t *testing.T) string {
	return fmt.Sprint(b.db.Int(t, `SELECT count(*) FROM outbox_events`), b.db.Int(t, `SELECT count(*) FROM outbox_replay_audit`))
}

func TestVerifyCmdCleanThenDrift(t *testing.T) {
	t.Parallel()
	b := verifySetup(t, 100)

	code, out, errOut := b.run(t, "--from-table", "search_index")
	require.Zero(t, code, errOut)
	require.Contains(t, out, "against the source table search_index: 100 documents in ")
	require.Contains(t, out, "clean: the index holds what the source table search_index says\n")

	b.plant(t)
	code, out, errOut = b.run(t, "--from-table", "search_index")
	require.Equal(t, exitDrift, code, out)
	require.Regexp(t, `(?m)^  missing\s+1\s+book:b1$`, out)
	require.Regexp(t, `(?m)^  stale\s+1\s+book:b2$`, out)
	require.Regexp(t, `(?m)^  extra\s+1\s+book:x1$`, out)
	require.Regexp(t, `(?m)^  resurrected\s+1\s+book:b3$`, out)
	require.Contains(t, out, "drift: 4 documents")
	require.Contains(t, errOut, "drift: 4 documents differ from the source table search_index")

	code, out, _ = b.run(t, "--from-table", "search_index", "--json", "--sample", "1")
	require.Equal(t, exitDrift, code)
	var got struct {
		Checked, Missing, Stale, Extra, Resurrected int64
		Samples                                     map[string][]string
	}
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	require.EqualValues(t, 101, got.Checked)
	require.Equal(t, []int64{1, 1, 1, 1}, []int64{got.Missing, got.Stale, got.Extra, got.Resurrected})
	require.Equal(t, map[string][]string{"missing": {"book:b1"}, "stale": {"book:b2"}, "extra": {"book:x1"},
		"resurrected": {"book:b3"}, "ahead": {}}, got.Samples)
	require.Equal(t, 1, strings.Count(out, "\n"), "one JSON object")

	// The ledger alone: b2's row is not the ledger's business, x1 cannot
	// be told from a pruned entry.
	code, out, _ = b.run(t)
	require.Equal(t, exitDrift, code)
	require.Regexp(t, `(?m)^  missing\s+1\s+book:b1$`, out)
	require.Regexp(t, `(?m)^  stale\s+0\s*$`, out)
	require.Regexp(t, `(?m)^  extra\s+-\s+\(needs --from-table`, out)
	require.Regexp(t, `(?m)^  resurrected\s+1\s+book:b3$`, out)
}

// Bad input: exit 2, the problem named, nothing read or changed.
func TestVerifyCmdRefusesBadInput(t *testing.T) {
	t.Parallel()
	b := verifySetup(t, 3)
	b.db.Exec(t, `CREATE TABLE no_key (entity_type text, entity_id text, doc jsonb, version bigint)`)
	before := b.changes(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--from-table", "nope"}, `source table "nope" does not exist`},
		{[]string{"--from-table", "no_key"}, `needs a primary key on (entity_type, entity_id)`},
		{[]string{"--projection", "nope"}, `unknown projection "nope" (known: chronicle, search)`},
		{[]string{"--projection", "chronicle"}, `projection "chronicle" has no search index to verify`},
		{[]string{"--sample", "0"}, `--sample`},
		{[]string{"--rate", "-1"}, `--rate`},
	} {
		code, out, errOut := b.run(t, tc.args...)
		require.Equal(t, exitUsage, code, "%v: %s%s", tc.args, out, errOut)
		require.Contains(t, errOut, tc.want, tc.args)
		require.Empty(t, out, tc.args)
	}
	require.Equal(t, before, b.changes(t))

	// An engine that does not answer is an error, not drift.
	var stdout, stderr bytes.Buffer
	code := Run([]string{"verify", "--database-url", b.db.URL, "--elastic-url", "http://127.0.0.1:1",
		"--elastic-index", b.index, "--elastic-timeout", "1"}, &stdout, &stderr)
	require.Equal(t, exitFailure, code, stderr.String())
}

// The repair as an operator runs it: refused without --by/--why, a dry
// run, the cap, then the repair, which a real leader applies; the second
// verify is clean, and the audit has one row.
func TestVerifyCmdRepair(t *testing.T) {
	t.Parallel()
	b := verifySetup(t, 100)
	b.plant(t)
	harness.DeletesForgotten(t, b.index) // b1's hand delete, as a minute later
	table := []string{"--from-table", "search_index"}
	who := []string{"--by", "alice", "--why", "drift after the restore (INC-7)"}
	before := b.changes(t)

	code, _, errOut := b.run(t, append(table, "--repair")...)
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "--by and --why are required")
	code, _, errOut = b.run(t, append(table, "--by", "alice")...)
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "go with --repair")

	code, out, _ := b.run(t, append(append(table, "--repair", "--dry-run"), who...)...)
	require.Equal(t, exitDrift, code, out)
	require.Contains(t, out, "dry run: would queue 4 repair events (missing 1, stale 1, extra 1, resurrected 1); nothing changed\n")

	code, out, errOut = b.run(t, append(append(table, "--repair", "--max", "3"), who...)...)
	require.Equal(t, exitRefused, code, out)
	require.Contains(t, errOut, "repair refused, nothing changed: 4 documents would be repaired, more than --max 3")
	require.Equal(t, before, b.changes(t), "neither the dry run nor the refusal changed anything")

	code, out, _ = b.run(t, append(append(table, "--repair", "--json"), who...)...)
	require.Equal(t, exitDrift, code, out)
	var got struct {
		Repair struct {
			Queued  map[string]int64
			AuditID int64 `json:"audit_id"`
		}
	}
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	require.Equal(t, map[string]int64{"missing": 1, "stale": 1, "extra": 1, "resurrected": 1, "ahead": 0}, got.Repair.Queued)
	require.Equal(t, 1, b.db.Int(t, `SELECT count(*) FROM outbox_replay_audit WHERE action = 'repair' AND replayed_by = 'alice'
		AND event_count = 4 AND id = $1`, got.Repair.AuditID))
	require.Equal(t, 4, b.db.Count(t, `repair`))

	harness.Leader(t, harness.StartReplica(t, "r1", harness.ReplicaEnv(b.db.URL, b.base, b.index, harness.Quick...)))
	harness.Drained(t, b.db.Pool, 30*time.Second)
	code, out, errOut = b.run(t, table...)
	require.Zero(t, code, out+errOut)
	require.Contains(t, out, "clean: ")
}

// The scheduled verify as deployed: a replica logged in as the runtime role
// of deploy/sql/roles.sql, with SELECT on the source table, finds a
// resurrected document, deletes it (OUTBOX_VERIFY_AUTO_REPAIR), audits
// that, keeps the run for the console and exports the gauges.
func TestVerifyScheduledByTheLeaderAsTheRuntimeRole(t *testing.T) {
	t.Parallel()
	owner, runtime := harness.Roles(t, "vf")
	db := harness.NewDatabase(t)
	out, err := harness.ApplyRoles(t, db.URL, db.Name, owner, runtime)
	require.NoError(t, err, out)
	b := verifySetupOn(t, db, 50)
	db.Exec(t, `GRANT SELECT ON search_index TO `+pgx.Identifier{runtime}.Sanitize())
	db.Exec(t, `DELETE FROM search_index WHERE entity_id = 'b3'`)
	db.Exec(t, `UPDATE outbox_ledger SET version = 2, deleted = true WHERE entity_id = 'b3'`)

	r := harness.StartReplica(t, "vf1", harness.ReplicaEnv(db.Login(t, runtime, harness.RuntimePassword), b.base, b.index,
		append(harness.Quick, "OUTBOX_VERIFY_INTERVAL=1h", "OUTBOX_VERIFY_FROM_TABLE=search_index",
			"OUTBOX_VERIFY_AUTO_REPAIR=true")...))
	harness.Leader(t, r)
	harness.Eventually(t, 30*time.Second, "the first scheduled run recorded", func() bool {
		return db.Int(t, `SELECT count(*) FROM outbox_verify_runs`) == 1
	})
	require.Equal(t, 1, db.Int(t, `SELECT count(*) FROM outbox_verify_runs WHERE projection = 'search' AND checked = 50
		AND resurrected = 1 AND repaired = 1 AND missing + stale + extra = 0 AND source_table = 'search_index'`))
	require.Equal(t, 1, db.Int(t, `SELECT count(*) FROM outbox_replay_audit WHERE action = 'repair' AND replayed_by = 'verify-auto'`))
	// The run is recorded, then its gauges set: wait for them.
	var scrape string
	harness.Eventually(t, 10*time.Second, "the run's gauges exported", func() bool {
		var err error
		scrape, err = r.Scrape()
		_, ok, _ := harness.ParseMetric(scrape, `outbox_verify_checked_documents{projection="search"}`)
		return err == nil && ok
	})
	for name, want := range map[string]float64{
		`outbox_verify_drift_documents{projection="search",kind="resurrected"}`: 0,
		`outbox_verify_checked_documents{projection="search"}`:                  50,
		`outbox_verify_repaired_total{projection="search"}`:                     1,
	} {
		got, ok, err := harness.ParseMetric(scrape, name)
		require.NoError(t, err)
		require.True(t, ok, name)
		require.Equal(t, want, got, name)
	}
	require.NotContains(t, r.Logs(), "permission denied")

	code, out, errOut := b.run(t, "--from-table", "search_index")
	require.Zero(t, code, out+errOut)
}
