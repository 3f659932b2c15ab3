package e2e

// The version contract between binary and schema, as an operator meets it
// mid-upgrade: a replica whose binary needs a newer schema stands aside
// until wlproj migrate, and a binary built before the newest migration
// keeps draining on the schema that migration made, so the documented order
// (migrate, then restart the standby, then the leader) holds.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/leader"
	"github.com/wlproj/wlproj/migrations"
)

// newClusterAt is newCluster on a database migrated only up to version.
func newClusterAt(t *testing.T, version int64) *cluster {
	t.Helper()
	c := &cluster{t: t, db: harness.NewEmptyDatabase(t), index: harness.NewIndex(t)}
	migrate(t, c.db, version)
	c.env = harness.ReplicaEnv(c.db.URL, harness.ElasticURL(t), c.index, harness.Quick...)
	return c
}

// migrate runs wlproj migrate's code up to version (0: every migration).
func migrate(t *testing.T, db harness.DB, version int64) {
	t.Helper()
	res, err := migrations.Run(context.Background(), db.URL, migrations.Expect{Database: db.Name},
		migrations.Config{UpTo: version}, zerolog.Nop())
	require.NoError(t, err)
	if version == 0 {
		version = migrations.HeadVersion()
	}
	require.Equal(t, version, res.Current)
}

// readiness is the /readyz body.
type readiness struct {
	Status string            `json:"status"`
	Checks map[string]string `json:"checks"`
	Schema struct {
		Database string `json:"database"`
		Version  int64  `json:"version"`
		Required int64  `json:"required"`
		Read     bool   `json:"read"`
	} `json:"schema"`
}

func readyz(t *testing.T, r *harness.Replica) (int, readiness) {
	t.Helper()
	code, body, err := r.Get("/readyz")
	require.NoError(t, err)
	var b readiness
	require.NoError(t, json.Unmarshal(body, &b), string(body))
	return code, b
}

func metric(t *testing.T, r *harness.Replica, name string) float64 {
	t.Helper()
	v, ok, err := r.Metric(name)
	require.NoError(t, err)
	require.True(t, ok, "%s exports no %s", r.Name, name)
	return v
}

// Two replicas of a binary that needs one migration more than the database
// has: neither is ready nor leads, each says which versions and which
// command, and exports both; nothing is claimed. After wlproj migrate,
// without a restart, one leads and drains everything.
func TestReplicasOnAnOlderSchemaDoNotLead(t *testing.T) {
	t.Parallel()
	behind := migrations.RequiredVersion - 1
	c := newClusterAt(t, behind)
	c.produce(500, 2)
	a, b := c.start("a"), c.start("b")

	for _, r := range []*harness.Replica{a, b} {
		code, body := readyz(t, r)
		require.Equal(t, http.StatusServiceUnavailable, code, "%+v", body)
		check := body.Checks["schema"]
		require.Contains(t, check, fmt.Sprintf("schema version %d, this binary needs %d or newer", behind, migrations.RequiredVersion), check)
		require.Contains(t, check, "wlproj migrate --expect-db "+c.db.Name, check)
		require.Equal(t, behind, body.Schema.Version)
		require.Equal(t, migrations.RequiredVersion, body.Schema.Required)
		require.Equal(t, float64(behind), metric(t, r, "outbox_schema_version"))
		require.Equal(t, float64(migrations.RequiredVersion), metric(t, r, "outbox_schema_required_version"))
		require.Zero(t, metric(t, r, "outbox_ready"))
	}
	time.Sleep(3 * time.Second) // three ticks of the elector, and a schema read
	for _, r := range []*harness.Replica{a, b} {
		h, err := r.Health()
		require.NoError(t, err)
		require.Equal(t, harness.RoleStandby, h.Role, "%s is alive and does not lead", r.Name)
	}
	require.Zero(t, c.db.Int(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
	                             AND application_name LIKE 'wlproj-leader:%'`), "no replica campaigns")
	require.Zero(t, c.db.Int(t, `SELECT count(*) FROM outbox_leader`), "no epoch taken")
	// On outbox_events itself, whatever the schema: rows are inserted
	// pending before 18 and queued since, and a queued row is read once a
	// leader saves a position (outbox_positions, since 17).
	require.Equal(t, 1000, c.db.Int(t, `SELECT count(*) FROM outbox_events WHERE status IN ('pending', 'queued') AND attempts = 0`),
		"nothing claimed")
	if behind >= 17 {
		require.Zero(t, c.db.Int(t, `SELECT count(*) FROM outbox_positions`), "nothing read")
	}

	migrate(t, c.db, 0)
	harness.Leader(t, a, b)
	for _, r := range []*harness.Replica{a, b} {
		harness.Eventually(t, 15*time.Second, r.Name+" ready after the migration", func() bool {
			code, _ := readyz(t, r)
			return code == http.StatusOK
		})
		require.Equal(t, float64(migrations.HeadVersion()), metric(t, r, "outbox_schema_version"))
	}
	require.EqualValues(t, 1000, c.settle(60*time.Second).Done)
}

// The upgrade as the runbook orders it, with the binary of the commit
// before the newest migration as the running release: its leader keeps
// draining while wlproj migrate brings the schema to head and after, then
// the standby and the leader are restarted on this binary, one at a time.
// Who drained is told by each process's outbox_processed_total and by the
// position's saved_by: a queued row that succeeds keeps no locked_by.
//
// That release's standby waits for the lock in one statement, whose
// snapshot CREATE INDEX CONCURRENTLY waits for (the migration failed after
// MIGRATE_LOCK_WAIT naming wlproj-leader:b), so it is stopped before the
// migration, as the runbook says for an upgrade from such a release.
func TestUpgradeOrderOldBinaryRunsOnNewSchema(t *testing.T) {
	t.Parallel()
	old := binaryBeforeNewestMigration(t)
	t.Logf("the running release: %s, built from %s, schema %d", old.path, old.commit[:12], old.schema)
	c := newClusterAt(t, old.schema)
	oa, ob := c.startBinary(old.path, "a"), c.startBinary(old.path, "b")
	oldLeader := c.leader()
	oldStandby := map[*harness.Replica]*harness.Replica{oa: ob, ob: oa}[oldLeader]
	c.produce(2000, 5)

	oldStandby.Stop(15 * time.Second)
	endOrphanedWait(t, c.db, oldStandby.Name)
	migrate(t, c.db, 0) // while the old leader drains the backlog
	c.produce(2000, 1)  // on the head schema
	rep := c.settle(90 * time.Second)
	require.EqualValues(t, 12000, rep.Done)
	require.True(t, oldLeader.IsLeader(), "the old binary led throughout")
	require.Equal(t, 2000, c.db.Int(t, `SELECT count(*) FROM outbox_events WHERE event_version = 6 AND status = 'queued'`),
		"what was produced on the head schema is queued")
	require.EqualValues(t, 12000, metric(t, oldLeader, processedMetric),
		"the old binary drained what was produced on the head schema, and everything before")
	require.Equal(t, oldLeader.Name, positionSavedBy(t, c))

	standby := c.startBinary(harness.Binary(t), oldStandby.Name)
	harness.Eventually(t, 15*time.Second, "the new standby ready", func() bool {
		code, _ := readyz(t, standby)
		return code == http.StatusOK
	})
	oldLeader.Stop(45 * time.Second)
	require.Equal(t, standby, c.leader())
	again := c.startBinary(harness.Binary(t), oldLeader.Name)
	before := metric(t, standby, processedMetric)
	c.produce(2000, 1)
	rep = c.settle(60 * time.Second)
	require.EqualValues(t, 14000, rep.Done)
	require.GreaterOrEqual(t, metric(t, standby, processedMetric)-before, 2000.0, "the new leader drained the last batch")
	require.Zero(t, metric(t, again, processedMetric), "the restarted replica stood by")
	require.Equal(t, standby.Name, positionSavedBy(t, c))
}

// positionSavedBy is the replica that last saved the search projection's
// position: the leader that read and acked its queued rows.
func positionSavedBy(t *testing.T, c *cluster) string {
	t.Helper()
	names := harness.Column[string](t, c.db, `SELECT saved_by FROM outbox_positions WHERE projection = 'search'`)
	require.Len(t, names, 1, "the search projection's position")
	return names[0]
}

// endOrphanedWait does what the runbook says after stopping such a standby:
// its lock session can outlive it, since Postgres does not notice a client
// gone while the backend waits for a lock (its snapshot with it); one left
// after a few seconds is terminated.
func endOrphanedWait(t *testing.T, db harness.DB, worker string) {
	t.Helper()
	const orphan = `application_name = $1 AND wait_event = 'advisory'`
	left := func() int {
		return db.Int(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND `+orphan, leader.LockSessionName(worker))
	}
	deadline := time.Now().Add(3 * time.Second)
	for left() > 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if left() > 0 {
		t.Logf("the stopped standby's lock wait outlived it: terminating it, as the runbook says")
		db.Exec(t, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND `+orphan,
			leader.LockSessionName(worker))
	}
}

// A leader whose schema changes under it (a column its reads of queued and
// claimed rows select renamed by hand) stays ready, since its schema version did not move; its claim
// errors are what shows it, for OutboxLeaderErrors.
func TestClaimErrorsCountedWhenTheSchemaChangesUnderTheLeader(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	l := c.run("a")
	c.db.Exec(t, `ALTER TABLE outbox_events RENAME COLUMN traceparent TO traceparent_gone`)
	c.produce(10, 1)
	harness.Eventually(t, 20*time.Second, "claim errors counted", func() bool {
		return metric(t, l, "outbox_claim_errors_total") >= 3
	})
	require.Equal(t, 10, c.count(`status = 'pending'`), "nothing claimed")
	c.db.Exec(t, `ALTER TABLE outbox_events RENAME COLUMN traceparent_gone TO traceparent`)
	c.settle(30 * time.Second)
}

// startBinary is start with another build of wlproj.
func (c *cluster) startBinary(bin, name string) *harness.Replica {
	c.t.Helper()
	r, err := harness.Start(bin, name, c.env, nil)
	require.NoError(c.t, err)
	c.t.Cleanup(func() {
		r.Stop(10 * time.Second)
		if c.t.Failed() {
			c.t.Logf("logs of %s (%s):\n%s", r.Name, bin, r.Logs()[max(0, len(r.Logs())-4000):])
		}
	})
	c.replicas = append(c.replicas, r)
	harness.Healthy(c.t, r)
	return r
}

// oldBinary is wlproj as built from the commit before a migration file
// was added, and the newest migration that commit carries.
type oldBinary struct {
	path, commit string
	schema       int64
}

// binaryBeforeNewestMigration is the running release of an upgrade to head.
func binaryBeforeNewestMigration(t *testing.T) oldBinary {
	t.Helper()
	return binaryBeforeMigration(t, migrations.HeadVersion())
}

// binaryBeforeMigration finds the commit before the one that added
// migration version in the checkout's history and builds it. Without the
// history (a shallow clone, the file not committed yet) the test is
// skipped, saying why.
func binaryBeforeMigration(t *testing.T, version int64) oldBinary {
	t.Helper()
	root := harness.Root(t)
	git := func(args ...string) (string, error) {
		out, err := exec.Command("git", append([]string{"-C", root}, args...)...).Output()
		return strings.TrimSpace(string(out)), err
	}
	files, err := filepath.Glob(filepath.Join(root, "migrations", fmt.Sprintf("%05d_*.sql", version)))
	require.NoError(t, err)
	require.Len(t, files, 1, "the file of migration %d", version)
	file := "migrations/" + filepath.Base(files[0])
	if shallow, err := git("rev-parse", "--is-shallow-repository"); err != nil || shallow != "false" {
		t.Skipf("no full git history here (shallow %q, %v): the binary from before %s cannot be built", shallow, err, file)
	}
	added, err := git("log", "--diff-filter=A", "--format=%H", "-1", "--", file)
	if err != nil || added == "" {
		t.Skipf("no commit in this checkout's history adds %s (%v): the binary from before it cannot be built", file, err)
	}
	parent, err := git("rev-parse", "--verify", added+"^")
	if err != nil {
		t.Skipf("the commit adding %s has no parent here: %v", file, err)
	}
	names, err := git("ls-tree", "--name-only", parent, "migrations/")
	require.NoError(t, err)
	old := oldBinary{commit: parent}
	for _, name := range strings.Fields(names) {
		if v, err := strconv.ParseInt(strings.SplitN(filepath.Base(name), "_", 2)[0], 10, 64); err == nil && strings.HasSuffix(name, ".sql") {
			old.schema = max(old.schema, v)
		}
	}
	require.Less(t, old.schema, version)
	old.path = harness.BinaryOf(t, parent)
	return old
}

// A replica started on a database not yet migrated makes no index: the
// index is made once the schema is what the binary needs, as the runbook's
// order (migrate, then start) has it, not before the migration an operator
// may still be deciding on.
func TestReplicasOnAnOlderSchemaMakeNoIndexUntilMigrated(t *testing.T) {
	t.Parallel()
	c := &cluster{t: t, db: harness.NewEmptyDatabase(t), index: harness.NewIndexName(t)}
	migrate(t, c.db, migrations.RequiredVersion-1)
	c.env = harness.ReplicaEnv(c.db.URL, harness.ElasticURL(t), c.index, harness.Quick...)
	a := c.start("a")
	exists := func() bool {
		err := harness.ES(context.Background(), harness.ElasticURL(t), http.MethodHead, "/"+c.index, nil, nil)
		var status *harness.StatusError
		if errors.As(err, &status) && status.Code == http.StatusNotFound {
			return false
		}
		require.NoError(t, err)
		return true
	}
	harness.Eventually(t, 10*time.Second, "a's schema read", func() bool {
		code, body := readyz(t, a)
		return code == http.StatusServiceUnavailable && body.Schema.Read
	})
	time.Sleep(2 * time.Second) // four rounds of the index keeper's first wait
	require.False(t, exists(), "an index before the migration")

	migrate(t, c.db, 0)
	harness.Eventually(t, 15*time.Second, "the index once migrated", exists)
}
