package e2e

// The upgrade from the previous release (harness.PreviousRelease, schema
// 16: it claims pending rows and writes outbox_applied) to this binary,
// under a steady producer, in the runbook's order (runbook.md, "Upgrade
// from the previous release"): restart the standby onto this binary (it
// sits out: the schema is older than it needs), wlproj migrate to head
// while the old leader drains, then restart the leader once the new
// standby is ready. New rows stay pending, which the old leader claims,
// until this binary leads and takes the ledger; so something drains
// throughout, and the lag stays what it is on a quiet day.

import (
	"context"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/leader"
	"github.com/wlproj/wlproj/migrations"
)

// upgradeLagBound is the bound on the lag's p99 over the upgrade.
const upgradeLagBound = 5 * time.Second

func TestUpgradeFromPreviousReleaseUnderLoad(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	prev := harness.BinaryOf(t, harness.PreviousRelease)
	db := harness.NewEmptyDatabase(t)
	out, err := exec.Command(prev, "migrate", "--database-url", db.URL, "--expect-db", db.Name).CombinedOutput()
	require.NoError(t, err, "the previous release's migrate: %s", out)
	require.EqualValues(t, harness.PreviousReleaseSchema, version(t, db))
	c := &cluster{t: t, db: db, index: harness.NewIndex(t)}
	c.env = harness.ReplicaEnv(db.URL, harness.ElasticURL(t), c.index, harness.Quick...)
	c.startBinary(prev, "a")
	c.startBinary(prev, "b")
	oldLeader := c.leader()
	oldStandby := map[*harness.Replica]*harness.Replica{c.replicas[0]: c.replicas[1], c.replicas[1]: c.replicas[0]}[oldLeader]
	require.NoError(t, harness.WaitStandby(ctx, 20*time.Second, db.Pool, oldStandby, leader.LockSessionName(oldStandby.Name)))

	prod := harness.Produce(ctx, db.Pool, harness.ProducerConfig{Rate: 200, Next: liveBooks()})
	defer prod.Stop()
	harness.Eventually(t, 30*time.Second, "the old leader draining", func() bool {
		return db.Int(t, `SELECT count(*) FROM outbox_events WHERE status = 'done'`) > 500
	})
	start, err := harness.Now(ctx, db.Pool)
	require.NoError(t, err)

	newLeader, steps := upgradeAsTheRunbookSays(t, c, oldLeader, oldStandby)
	time.Sleep(10 * time.Second) // the new leader under the producer
	prod.Stop()
	end, err := harness.Now(ctx, db.Pool)
	require.NoError(t, err)
	rep := c.settle(90 * time.Second)
	require.EqualValues(t, prod.Committed(), rep.Done, "every event produced is done")
	require.Equal(t, newLeader.Name, positionSavedBy(t, c), "this binary's leader read the queued rows")
	require.Positive(t, db.Count(t, `queued AND created_at > $1`, start), "new rows are queued once this binary leads")

	lag := upgradeLags(t, db, start, end)
	require.NotEmpty(t, lag)
	t.Logf("lag over the upgrade (%d events from %s to %s): p50 %s, p99 %s, max %s",
		len(lag), start.Format(time.TimeOnly), end.Format(time.TimeOnly), quantile(lag, 0.5), quantile(lag, 0.99), quantile(lag, 1))
	for i, s := range steps {
		until := end
		if i+1 < len(steps) {
			until = steps[i+1].at
		}
		if l := upgradeLags(t, db, s.at, until); len(l) > 0 {
			t.Logf("  from %s (%s): %d events, lag p50 %s, p99 %s, max %s",
				s.name, s.at.Format("15:04:05.000"), len(l), quantile(l, 0.5), quantile(l, 0.99), quantile(l, 1))
			require.LessOrEqual(t, quantile(l, 0.99), upgradeLagBound, "lag p99 from %s on", s.name)
		}
	}
	require.LessOrEqual(t, quantile(lag, 0.99), upgradeLagBound, "lag p99 over the upgrade")
	require.Zero(t, db.Int(t, `SELECT count(*) FROM (SELECT 1 FROM outbox_ledger WHERE entity_type = 'book'
	                             GROUP BY projection, entity_id, version HAVING count(*) > 1) twice`),
		"a version of a document applied twice")
	require.Zero(t, db.Int(t, `SELECT count(*) FROM (SELECT version < max(version) OVER (PARTITION BY projection, entity_id ORDER BY applied_at, version
	                                                  ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS back
	                               FROM outbox_ledger WHERE entity_type = 'book') l WHERE back`),
		"a document's applied version went back")
}

// lockWaits is the migrate's log lines about a statement that gave up
// waiting for a lock, for the test's log.
func lockWaits(out string) string {
	var waits []string
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "gave up waiting for a lock") {
			waits = append(waits, line)
		}
	}
	return strings.Join(waits, "\n")
}

// step is one step of the upgrade and when it began, by the database's
// clock (as created_at and applied_at are).
type step struct {
	name string
	at   time.Time
}

// upgradeAsTheRunbookSays restarts the standby onto this binary, migrates
// to head, and restarts the leader once the new standby is ready; it
// returns this binary's leader and when each step began.
func upgradeAsTheRunbookSays(t *testing.T, c *cluster, oldLeader, oldStandby *harness.Replica) (*harness.Replica, []step) {
	t.Helper()
	var steps []step
	begin := func(name string) {
		at, err := harness.Now(context.Background(), c.db.Pool)
		require.NoError(t, err)
		steps = append(steps, step{name, at})
	}
	begin("restart the standby")
	oldStandby.Stop(15 * time.Second)
	// That release's standby waits for the lock in one statement, which
	// can outlive it: the runbook ends it, or 00017's index build waits.
	endOrphanedWait(t, c.db, oldStandby.Name)
	standby := c.startBinary(harness.Binary(t), oldStandby.Name)
	code, body := readyz(t, standby)
	require.Equal(t, http.StatusServiceUnavailable, code, "this binary sits out on schema 16: %+v", body)

	begin("wlproj migrate")
	migrateStart := time.Now()
	code, out := startMigrate(t, c.db.URL).wait(t, liveMigrateBound)
	require.Zero(t, code, out)
	t.Logf("wlproj migrate 16 → %d took %s; its lock waits:\n%s", migrations.HeadVersion(), time.Since(migrateStart).Round(time.Millisecond), lockWaits(out))
	require.True(t, oldLeader.IsLeader(), "the old leader led through the migration")
	require.Zero(t, c.db.Count(t, `queued`), "nothing queued while the old binary leads")

	begin("wait for the standby's /readyz")
	harness.Eventually(t, 15*time.Second, "the new standby ready", func() bool {
		code, _ := readyz(t, standby)
		return code == http.StatusOK
	})
	begin("restart the leader")
	oldLeader.Stop(45 * time.Second)
	require.Equal(t, standby, c.leader())
	again := c.startBinary(harness.Binary(t), oldLeader.Name)
	require.NoError(t, harness.WaitStandby(context.Background(), 20*time.Second, c.db.Pool, again, leader.LockSessionName(again.Name)))
	begin("this binary leads")
	return standby, steps
}

// upgradeLags is, for each search event created in [from, to), how long
// until its document reached its version: the first ledger entry at or
// past it (the old binary's writes to outbox_applied are copied there from
// 00019 on), or its processed_at (a claimed row's ack, before 00019 too),
// whichever came first. Sorted.
func upgradeLags(t *testing.T, db harness.DB, from, to time.Time) []time.Duration {
	t.Helper()
	ms := harness.Column[float64](t, db, `
		SELECT extract(epoch FROM least(e.processed_at, l.applied_at) - e.created_at) * 1000
		  FROM outbox_events e
		  LEFT JOIN LATERAL (SELECT min(applied_at) AS applied_at FROM outbox_ledger l
		                      WHERE l.projection = e.projection AND l.entity_type = e.entity_type
		                        AND l.entity_id = e.entity_id AND l.version >= e.event_version) l ON true
		 WHERE e.projection = 'search' AND e.created_at >= $1 AND e.created_at < $2`, from, to)
	lags := make([]time.Duration, len(ms))
	for i, m := range ms {
		lags[i] = time.Duration(m * float64(time.Millisecond))
	}
	slices.Sort(lags)
	return lags
}

// quantile is the q-quantile of sorted lags (nearest rank).
func quantile(sorted []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)].Round(time.Millisecond)
}
