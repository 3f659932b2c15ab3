package e2e

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/leader"
)

// The rollback to the previous release as the runbook orders it, under a
// steady producer: wlproj migrate --down --to 16 with this release's two
// replicas running, then both restarted onto the previous release, standby
// first. Every event ends done, each document at its newest version; the
// lag and this release's claim errors over the rollback are logged (not
// bounded: nothing drains from the moment the schema is below what this
// release needs until the previous release runs). Then upgraded again
// and verified.
func TestRollbackToPreviousReleaseUnderLoad(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	prev := harness.BinaryOf(t, harness.PreviousRelease)
	c := newCluster(t)
	l := c.run("a", "b")
	standby := map[*harness.Replica]*harness.Replica{c.replicas[0]: c.replicas[1], c.replicas[1]: c.replicas[0]}[l]
	require.NoError(t, harness.WaitStandby(ctx, 20*time.Second, c.db.Pool, standby, leader.LockSessionName(standby.Name)))
	prod := harness.Produce(ctx, c.db.Pool, harness.ProducerConfig{Rate: 200, Next: liveBooks()})
	defer prod.Stop()
	harness.Eventually(t, 30*time.Second, "the leader draining", func() bool { return metric(t, l, processedMetric) > 500 })
	start, err := harness.Now(ctx, c.db.Pool)
	require.NoError(t, err)

	began := time.Now()
	code, out := startMigrate(t, c.db.URL, "--down", "--to", "16", "--by", "e2e", "--why", "the rollback test").wait(t, liveMigrateBound)
	require.Zero(t, code, out)
	t.Logf("wlproj migrate --down --to 16 took %s", time.Since(began).Round(time.Millisecond))
	standby.Stop(15 * time.Second)
	next := c.startBinary(prev, standby.Name)
	errs := metric(t, l, "outbox_claim_errors_total")
	l.Stop(45 * time.Second)
	require.Equal(t, next, c.leader())
	again := c.startBinary(prev, l.Name)
	t.Logf("the previous release leads %s after the rollback began; the leader of this release failed %v claims meanwhile",
		time.Since(began).Round(time.Millisecond), errs)
	time.Sleep(5 * time.Second)
	prod.Stop()
	end, err := harness.Now(ctx, c.db.Pool)
	require.NoError(t, err)
	// Schema 16 has none of the views the harness's drain check reads.
	harness.Eventually(t, 90*time.Second, "the previous release drained", func() bool {
		return c.db.Int(t, `SELECT count(*) FROM outbox_events WHERE status NOT IN ('done', 'failed', 'discarded')`) == 0
	})
	require.EqualValues(t, prod.Committed(), c.db.Int(t, `SELECT count(*) FROM outbox_events WHERE status = 'done'`), "every event done")
	require.Equal(t, 1, c.db.Int(t, `SELECT count(*) FROM outbox_replay_audit WHERE action = 'migrate' AND replayed_by = 'e2e'`))
	lag := rollbackLags(t, c.db, start, end)
	t.Logf("lag over the rollback (%d events): p50 %s, p99 %s, max %s", len(lag), quantile(lag, 0.5), quantile(lag, 0.99), quantile(lag, 1))

	// Upgraded again, as the runbook orders it, then verified: every
	// document at its newest version, the ledger agreeing.
	next.Stop(15 * time.Second)
	endOrphanedWait(t, c.db, next.Name)
	again.Stop(15 * time.Second)
	code, out = startMigrate(t, c.db.URL).wait(t, liveMigrateBound)
	require.Zero(t, code, out)
	c.verify()
}

// rollbackLags is, for each event created in [from, to), its insert to its
// processed_at: on schema 16 every done row has one (set by the previous
// release's ack, or by 00018's undo for a queued row its position passed).
func rollbackLags(t *testing.T, db harness.DB, from, to time.Time) []time.Duration {
	t.Helper()
	ms := harness.Column[float64](t, db, `
		SELECT extract(epoch FROM processed_at - created_at) * 1000 FROM outbox_events
		 WHERE created_at >= $1 AND created_at < $2 AND status = 'done'`, from, to)
	lags := make([]time.Duration, len(ms))
	for i, m := range ms {
		lags[i] = time.Duration(m * float64(time.Millisecond))
	}
	require.NotEmpty(t, lags)
	slices.Sort(lags)
	return lags
}
