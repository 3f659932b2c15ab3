package e2e

// The restore drill of the runbook's "Backups and restore": the
// application's database restored from a real pg_dump taken before the
// index's newest writes, then the SOP (verify names the drift, a rebuild
// from the source table replaces the index), then new writes that reuse
// the versions and ids the lost writes had.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// restoreSource is the application's source-of-truth table, as the
// runbook's rebuild section describes it.
const restoreSource = "search_index"

// restoreDrill is one application database, its index and two replicas.
type restoreDrill struct {
	t        *testing.T
	db       harness.DB
	index    string
	env      []string
	replicas []*harness.Replica
}

func newRestoreDrill(t *testing.T, db harness.DB) *restoreDrill {
	d := &restoreDrill{t: t, db: db, index: harness.NewIndex(t)}
	// The rebuild makes the index's name an alias of <index>-<time>.
	t.Cleanup(func() { _ = harness.DeleteIndex(context.Background(), harness.ElasticURL(t), d.index+"-*") })
	d.db.Exec(t, `CREATE TABLE `+restoreSource+` (entity_type text NOT NULL, entity_id text NOT NULL, doc jsonb NOT NULL,
		version bigint NOT NULL, PRIMARY KEY (entity_type, entity_id))`)
	d.env = harness.ReplicaEnv(d.db.URL, harness.ElasticURL(t), d.index, harness.Quick...)
	return d
}

// start runs the README's topology, two replicas, and waits for a leader.
func (d *restoreDrill) start(names ...string) {
	d.t.Helper()
	for _, name := range names {
		r := harness.StartReplica(d.t, name, d.env)
		harness.Healthy(d.t, r)
		d.replicas = append(d.replicas, r)
	}
	harness.Leader(d.t, d.replicas...)
}

func (d *restoreDrill) stop() {
	for _, r := range d.replicas {
		r.Stop(10 * time.Second)
	}
	d.replicas = nil
}

// write commits events as the application does: each source row with its
// event, in one transaction. A title marks which write a document shows.
func (d *restoreDrill) write(title string, events ...harness.Event) {
	d.t.Helper()
	for i := range events {
		doc, err := json.Marshal(map[string]any{"kind": "book", "title": fmt.Sprintf("%s %s v%d", events[i].EntityID, title, events[i].Version)})
		require.NoError(d.t, err)
		events[i].EntityType, events[i].Payload, events[i].ScopeKey = "book", doc, "lib-1"
	}
	require.NoError(d.t, harness.Insert(context.Background(), harness.SourceWriter{DB: d.db.Pool, Table: restoreSource}, events))
	harness.Drained(d.t, d.db.Pool, 60*time.Second)
}

func upsert(id string, version int64) harness.Event {
	return harness.Event{EntityID: id, Op: "upsert", Version: version}
}

func remove(id string, version int64) harness.Event {
	return harness.Event{EntityID: id, Op: "delete", Version: version}
}

// pgTool is a client program of the stack's Postgres version.
func pgTool(t *testing.T, name string) string {
	if dir := harness.StackEnv(t)["STACK_PG_BINDIR"]; dir != "" {
		return filepath.Join(dir, name)
	}
	return name
}

func runTool(t *testing.T, name string, args ...string) {
	t.Helper()
	out, err := exec.Command(pgTool(t, name), args...).CombinedOutput()
	require.NoError(t, err, "%s %v: %s", name, args, out)
}

// backup is the operator's nightly pg_dump, custom format.
func (d *restoreDrill) backup() string {
	file := filepath.Join(d.t.TempDir(), "wlproj.dump")
	runTool(d.t, "pg_dump", "--format=custom", "--file", file, "--dbname", d.db.URL)
	return file
}

// restore drops the database and restores the backup under the same name,
// on the same cluster (the positions keep their system identifier: no
// queue rebase), as the runbook says: every replica stopped first.
func (d *restoreDrill) restore(file string) {
	d.t.Helper()
	ctx := context.Background()
	admin := harness.AdminDatabaseURL(d.t)
	require.NoError(d.t, harness.DropDatabase(ctx, admin, d.db.Name))
	_, err := harness.CreateEmptyDatabase(ctx, admin, d.db.Name)
	require.NoError(d.t, err)
	runTool(d.t, "pg_restore", "--exit-on-error", "--no-owner", "--dbname", d.db.URL, file)
}

// reconnect replaces the pool, whose sessions the restore ended.
func (d *restoreDrill) reconnect() {
	d.t.Helper()
	var err error
	d.db.Pool, err = pgxpool.New(context.Background(), d.db.URL)
	require.NoError(d.t, err)
	d.t.Cleanup(d.db.Pool.Close)
}

// wlproj runs the binary as the runbook's SOP does and returns its output
// and exit code.
func (d *restoreDrill) wlproj(args ...string) (string, int) {
	d.t.Helper()
	cmd := exec.Command(harness.Binary(d.t), args...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+d.db.URL, "ELASTIC_URL="+harness.ElasticURL(d.t), "ELASTIC_INDEX="+d.index)
	out, err := cmd.Output()
	if exit := (*exec.ExitError)(nil); errors.As(err, &exit) {
		d.t.Logf("wlproj %v exited %d: %s", args, exit.ExitCode(), exit.Stderr)
		return string(out), exit.ExitCode()
	}
	require.NoError(d.t, err, "wlproj %v", args)
	return string(out), 0
}

// verifyReport is what the drill reads of `wlproj verify --json`.
type verifyReport struct {
	Missing, Stale, Extra, Resurrected, Ahead int64
	Samples                                   map[string][]string
}

func (d *restoreDrill) verify() (verifyReport, int) {
	d.t.Helper()
	out, code := d.wlproj("verify", "--from-table", restoreSource, "--json")
	var rep verifyReport
	require.NoError(d.t, json.Unmarshal([]byte(out), &rep), "verify --json: %s", out)
	return rep, code
}

// matched fails unless the index holds exactly the source table: each
// row's document at the row's version with the row's content, nothing else.
func (d *restoreDrill) matched(when string) {
	d.t.Helper()
	diff := d.diff()
	require.Empty(d.t, diff, "%s: the index against the restored database", when)
}

func (d *restoreDrill) diff() []string {
	d.t.Helper()
	ctx := context.Background()
	diff, err := harness.SourceDiff(ctx, d.db.Pool, harness.ElasticURL(d.t), d.index, restoreSource)
	require.NoError(d.t, err)
	titles := harness.Pairs[string, string](d.t, d.db,
		`SELECT entity_type || ':' || entity_id, doc->>'title' FROM `+restoreSource)
	var page struct {
		Hits struct {
			Hits []struct {
				ID     string `json:"_id"`
				Source struct {
					Title string `json:"title"`
				} `json:"_source"`
			} `json:"hits"`
		} `json:"hits"`
	}
	require.NoError(d.t, harness.ES(ctx, harness.ElasticURL(d.t), http.MethodPost, "/"+d.index+"/_search",
		[]byte(`{"size": 1000, "query": {"match_all": {}}}`), &page))
	for _, h := range page.Hits.Hits {
		if want, ok := titles[h.ID]; ok && want != h.Source.Title {
			diff = append(diff, fmt.Sprintf("%s: title %q, the source has %q", h.ID, h.Source.Title, want))
		}
	}
	slices.Sort(diff)
	return diff
}

// TestProjectionRestoredFromBackupIsRebuilt is the restore drill: backup,
// more writes, restore, the SOP, then the index equals the restored
// database, and writes that reuse the lost writes' versions flow.
func TestProjectionRestoredFromBackupIsRebuilt(t *testing.T) {
	t.Parallel()
	d := newRestoreDrill(t, harness.NewDatabase(t))
	d.run(func() func() {
		file := d.backup()
		return func() { d.restore(file) }
	})
}

// TestProjectionRestoredToAPointInTimeIsRebuilt is the drill with a
// point-in-time restore of a cluster of the test's own: a base backup,
// archived WAL, recovery to a restore point taken where the other drill
// takes its pg_dump.
func TestProjectionRestoredToAPointInTimeIsRebuilt(t *testing.T) {
	t.Parallel()
	pg := harness.StartPGAlone(t)
	archive := pg.ArchiveWAL(t)
	d := newRestoreDrill(t, pg.NewDatabase(t, pg.URL([]string{pg.Primary.Addr()})))
	base := pg.BaseBackup(t)
	d.run(func() func() {
		pg.RestorePoint(t, "drill")
		return func() { pg.RecoverTo(t, base, archive, "drill") }
	})
}

// run is the drill; backup takes the backup and returns how to restore it.
func (d *restoreDrill) run(backup func() (restore func())) {
	t := d.t
	d.start("a", "b")

	// Before the backup: b1..b8 written, b1..b4 updated, b7 and b8 deleted.
	var first []harness.Event
	for i := 1; i <= 8; i++ {
		first = append(first, upsert(fmt.Sprintf("b%d", i), 1))
	}
	d.write("before the backup", first...)
	d.write("before the backup", upsert("b1", 2), upsert("b2", 2), upsert("b3", 2), upsert("b4", 2), remove("b7", 2), remove("b8", 2))
	d.matched("before the backup")
	restore := backup()

	// After the backup, lost with the restore: b1, b2 and b4 updated (the index
	// ahead), b3 deleted (the index lacks it), b7 re-created (the restored
	// ledger says deleted) and n1, n2 new (the database never had them).
	d.write("lost", upsert("b1", 3), upsert("b2", 3), upsert("b2", 4), remove("b3", 3), upsert("b4", 3), upsert("b4", 5),
		upsert("b7", 3), upsert("n1", 1), upsert("n1", 2), upsert("n2", 1))
	d.matched("before the restore")

	d.stop()
	d.db.Pool.Close()
	restore()
	d.reconnect()
	d.start("a2", "b2")
	// The application is back and writes on from what the database holds:
	// b2's version 3 and n1's version 1 again, both below the index's.
	d.write("after the restore", upsert("b2", 3), upsert("n1", 1))

	// wlproj notices: verify names each way the index is ahead.
	rep, code := d.verify()
	require.Equal(t, 4, code, "verify exits 4 on drift: %+v", rep)
	require.Equal(t, []string{"book:b1", "book:b2", "book:b4", "book:n1"}, rep.Samples["ahead"], "updated after the backup, or reused below the index")
	require.Equal(t, []string{"book:b3"}, rep.Samples["missing"], "deleted after the backup")
	require.Equal(t, []string{"book:b7"}, rep.Samples["resurrected"], "re-created after the backup, deleted in the backup")
	require.Equal(t, []string{"book:n2"}, rep.Samples["extra"], "written after the backup only")
	require.NotEmpty(t, d.diff(), "before the SOP the index is ahead of the restored database")

	// The SOP: rebuild from the source table into a fresh index, swap the alias.
	out, code := d.wlproj("rebuild", "--projection", "search", "--from-table", restoreSource,
		"--by", "e2e", "--why", "restore drill", "--progress", "json")
	require.Zero(t, code, "rebuild: %s", out)
	rep, code = d.verify()
	require.Zero(t, code, "verify after the rebuild: %+v", rep)
	d.matched("after the SOP")

	// New writes flow, the reused versions and ids among them: b4's 3 and
	// 4 (the old index held 5: the engine would refuse them there), n1's 2,
	// b7 re-created at 3 and n2 at 1 again, b3 deleted again at 3, a new n3.
	d.write("after the SOP", upsert("b4", 3), upsert("b4", 4), upsert("n1", 2), upsert("b7", 3), upsert("n2", 1),
		remove("b3", 3), upsert("n3", 1))
	d.matched("after new writes")
	rep, code = d.verify()
	require.Zero(t, code, "verify after new writes: %+v", rep)
	// Every event against the index: nothing lost, regressed or
	// resurrected. b2's event of version 3, written before the SOP, was
	// refused by the old index (it held 4) and left the ledger at 2 while
	// the rebuild loaded 3 from the source: a ledger behind drops less,
	// never more, and b2's next event moves it.
	verdict, err := harness.Verify(context.Background(), d.db.Pool, harness.ElasticURL(t), d.index)
	require.NoError(t, err)
	require.Equal(t, []string{"book:b2: want ledger at 3 upsert, found 2 upsert"}, verdict.LedgerMismatch, verdict.String())
	verdict.LedgerMismatch = nil
	require.True(t, verdict.OK(), verdict.String())
}
