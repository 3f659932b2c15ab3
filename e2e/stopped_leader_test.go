package e2e

import (
	"context"
	"net/http"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/faultproxy"
	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/leader"
)

// state is everything a replica could change, as text: every outbox row,
// who saved each projection's position (where a queued row's ack is
// recorded) and how many events it confirmed, every ledger entry, and the
// index's documents with their versions. A position's snapshots are left
// out: the leader moves an idle projection's on to newer ones.
func (c *cluster) state() []string {
	c.t.Helper()
	rows := harness.Column[string](c.t, c.db, `SELECT e::text FROM outbox_events e ORDER BY id`)
	rows = append(rows, harness.Column[string](c.t, c.db, `
		SELECT concat_ws(' ', projection, epoch, saved_by, done_events, confirmed_at)
		  FROM outbox_positions ORDER BY projection`)...)
	ledger := harness.Column[string](c.t, c.db, `SELECT a::text FROM outbox_ledger_entries a ORDER BY entity_type, entity_id`)
	ctx, base := context.Background(), harness.ElasticURL(c.t)
	require.NoError(c.t, harness.ES(ctx, base, http.MethodPost, "/"+c.index+"/_refresh", nil, nil))
	var docs struct {
		Hits struct {
			Hits []struct {
				ID      string `json:"_id"`
				Version int64  `json:"_version"`
			} `json:"hits"`
		} `json:"hits"`
	}
	require.NoError(c.t, harness.ES(ctx, base, http.MethodPost, "/"+c.index+"/_search",
		[]byte(`{"size": 10000, "version": true, "_source": false, "sort": ["_doc"]}`), &docs))
	out := append(rows, ledger...)
	for _, d := range docs.Hits.Hits {
		out = append(out, d.ID+"@"+strconv.FormatInt(d.Version, 10))
	}
	return out
}

// A leader frozen mid-bulk (SIGSTOP, as a VM pause or a long GC would) has
// its lock session terminated; the standby takes over and finishes every
// event; the frozen bulk is answered meanwhile. Woken (SIGCONT), the old
// leader still believes it leads until its next check of the lock session,
// acks its bulk and is refused by the fence: it changes no row, no
// position, no ledger entry, no document. Its outbox_processed_total,
// which counts only acks that went through, stays at zero.
func TestReplicasStoppedLeaderChangesNothingWhenResumed(t *testing.T) {
	t.Parallel()
	const (
		hold  = 3 * time.Second  // a's bulk held in its proxy
		check = 10 * time.Second // a's check of its lock session, the longest allowed
	)
	ctx := context.Background()
	c := newCluster(t)
	// The old leader reaches the engine through a proxy of its own that
	// holds its bulks; its client waits longer than the whole test.
	engineA := faultproxy.Start(t, harness.ElasticURL(t))
	shared := c.env
	c.env = append(c.env[:len(c.env):len(c.env)], "ELASTIC_URL="+engineA.URL(), "ELASTIC_TIMEOUT_SECONDS=120",
		"OUTBOX_LEADER_CHECK_INTERVAL_SECONDS="+strconv.Itoa(int(check.Seconds())))
	a := c.start("a")
	require.Same(t, a, c.leader())
	c.env = shared
	b := c.start("b")
	require.NoError(t, harness.WaitStandby(ctx, 15*time.Second, c.db.Pool, b, leader.LockSessionName(b.Name)))
	var epoch int64
	var acquired time.Time
	require.NoError(t, c.db.Pool.QueryRow(ctx, `SELECT epoch, acquired_at FROM outbox_leader`).Scan(&epoch, &acquired))
	// a checks its lock session every check from acquired on (same host,
	// same clock). Freeze it just after a check, so that it wakes before
	// the next: a check missed while frozen would run the moment it wakes.
	checks := func(at time.Time) int64 { return int64(at.Sub(acquired) / check) }
	time.Sleep(time.Until(acquired.Add(time.Duration(checks(time.Now())+1)*check + 300*time.Millisecond)))

	engineA.Set(faultproxy.Fault{Delay: hold, PathSuffix: "/_bulk"})
	sent := engineA.Requests()
	c.produce(100, 2)
	harness.Eventually(t, 5*time.Second, "a bulk of a's held in its proxy", func() bool {
		return engineA.Requests() > sent && c.count(`status = 'processing' AND locked_by = 'a'`) > 0
	})
	held := time.Now()
	require.NoError(t, a.Signal(syscall.SIGSTOP))
	c.terminateLockSession(a)

	// Only b is asked: a frozen process answers no /healthz.
	_, next, err := harness.WaitLeader(ctx, 15*time.Second, epoch+1, b)
	require.NoError(t, err)
	c.drained(30 * time.Second)
	// The held bulk has reached the engine and its answer waits in a's socket.
	time.Sleep(time.Until(held.Add(hold + time.Second)))
	before := c.state()

	woke := time.Now()
	require.NoError(t, a.Signal(syscall.SIGCONT))
	require.NoError(t, a.WaitRole(ctx, check+5*time.Second, harness.RoleStandby), "the old leader steps down")
	require.Equal(t, before, c.state(), "the resumed leader changed nothing")
	require.EqualValues(t, next, c.db.Int(t, `SELECT epoch FROM outbox_leader`))
	require.Zero(t, metric(t, a, processedMetric), "a acked nothing, before it froze or after it woke")
	fenced := metric(t, a, "outbox_fenced_acks_total")
	if checks(woke) == checks(held) {
		require.Positive(t, fenced, "a woke believing it led: its acks reached the fence")
	} else {
		t.Logf("a was frozen across a check (a slow machine): it stopped before acking, %v acks fenced", fenced)
	}
	c.verify()
}

// terminateLockSession ends replica r's lock session in the cluster's
// database (other tests' replicas may share r's name on the server).
func (c *cluster) terminateLockSession(r *harness.Replica) {
	c.t.Helper()
	require.Equal(c.t, 1, c.db.Int(c.t, `
		SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))::int FROM pg_stat_activity
		 WHERE application_name = $1 AND datname = current_database()`, leader.LockSessionName(r.Name)),
		"%s's lock session", r.Name)
}
