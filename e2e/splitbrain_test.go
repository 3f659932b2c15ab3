package e2e

// A split brain of Postgres: after a failover the old primary comes back as
// a primary, on the pair of harness.StartPGPair (a pg_basebackup standby
// promoted with pg_ctl promote, the old primary started again).

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/leader"
	"github.com/wlproj/wlproj/outbox"
)

// After a failover the old primary is started again as a primary (Patroni
// without fencing, or an operator, might), and writes reach it. The standby
// replica restarts onto it (DATABASE_URL lists it first); the leader's pool
// connections end and come back on it too. Throughout, at most one replica
// leads; the one on the old primary says why it does not; the two servers'
// epochs differ; nothing is claimed or acked on the old primary. Once the
// old primary is gone a replica leads again and every event on the
// promoted standby is done, as the model says.
func TestOldPrimaryBackAsPrimaryGetsNoSecondLeader(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pair := harness.StartPGPair(t)
	c := newPairCluster(t, pair, pair.Primary.Addr(), pair.Standby.Addr())
	c.run("a", "b")
	c.produce(20, 2)
	c.drained(30 * time.Second)

	require.NoError(t, pair.KillPrimary())
	pair.Promote(t)
	first, epoch, err := harness.WaitLeader(ctx, 20*time.Second, outbox.EpochsPerTimeline, c.replicas...)
	require.NoError(t, err, "a leader on the promoted standby, at an epoch of its timeline")
	harness.Eventually(t, 10*time.Second, "the test's pool on the promoted standby", func() bool {
		_, err := c.db.Pool.Exec(ctx, `SELECT 1`) // each failure drops a connection the kill broke
		return err == nil
	})
	c.produce(20, 2)
	c.drained(30 * time.Second)

	pair.StartOldPrimary(t)
	oldDB, newDB := harness.DBOnNode(t, c.db, pair.Primary), harness.DBOnNode(t, c.db, pair.Standby)
	claimedBefore := claimed(t, oldDB)
	standby := c.replicas[0]
	if standby == first {
		standby = c.replicas[1]
	}
	roles := watchLeaders(first, standby)
	defer roles.stop()

	standby.Stop(10 * time.Second)
	restarted := c.start(standby.Name)
	roles.add(restarted)
	started := time.Now()
	waitRefused(t, restarted, leader.ReasonNotNewestPrimary)
	t.Logf("%s, restarted onto the old primary, refused %s after it served /healthz", restarted.Name, time.Since(started))
	oldDB.Exec(t, `
		INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload, scope_key)
		SELECT 'book', 'split-' || i, 'upsert', 1, jsonb_build_object('kind', 'book', 'title', 'written to the old primary'), 'lib'
		  FROM generate_series(1, 20) i`)

	harness.TerminateSessions(t, newDB, "wlproj:"+first.Name)
	terminated := time.Now()
	harness.Eventually(t, 15*time.Second, first.Name+" to step down and say why", func() bool {
		return !first.IsLeader() && (refused(first, leader.ReasonPoolOnOtherServer) || refused(first, leader.ReasonNotNewestPrimary))
	})
	t.Logf("%s stepped down %s after its pool's connections were ended", first.Name, time.Since(terminated))
	time.Sleep(2 * time.Second) // time for a second leader, or a claim on the old primary, to show
	oldEpoch, newEpoch := oldDB.Int(t, `SELECT epoch FROM outbox_leader`), newDB.Int(t, `SELECT epoch FROM outbox_leader`)
	require.Less(t, oldEpoch, outbox.EpochsPerTimeline, "the old primary's epoch stays on timeline 1")
	require.GreaterOrEqual(t, int64(newEpoch), epoch)
	require.Equal(t, claimedBefore, claimed(t, oldDB), "nothing claimed or acked on the old primary after the split")
	require.Equal(t, 20, oldDB.Count(t, `entity_id LIKE 'split-%' AND status = 'pending' AND attempts = 0`))

	require.NoError(t, pair.KillPrimary())
	fenced := time.Now()
	_, _, err = harness.WaitLeader(ctx, 30*time.Second, epoch+1, first, restarted)
	require.NoError(t, err, "a leader again once the old primary is gone")
	t.Logf("a leader again %s after the old primary was killed", time.Since(fenced))
	for _, r := range []*harness.Replica{first, restarted} {
		harness.Eventually(t, 15*time.Second, r.Name+" to refuse no more", func() bool {
			return !refused(r, leader.ReasonPoolOnOtherServer) && !refused(r, leader.ReasonNotNewestPrimary)
		})
	}
	roles.stop()
	rounds, two := roles.counts()
	require.Zero(t, two, "rounds of %d in which two replicas said leader", rounds)
	require.Positive(t, rounds)

	c.produce(20, 1)
	rep := c.settle(60 * time.Second)
	require.EqualValues(t, 20*5, rep.Done)
	n, err := harness.DocCount(ctx, harness.ElasticURL(t), c.index)
	require.NoError(t, err)
	require.Equal(t, 20, n, "nothing written only to the old primary reached the index")
}

// claimed is everything of db a leader writes when it reads or acks: the
// rows it wrote, by status and attempts (a claim, a failure, a claimed
// row's ack), each projection's position (a queued row's read and ack:
// the row itself is never written) and the ledger (every applied ack).
func claimed(t *testing.T, db harness.DB) map[string]int {
	t.Helper()
	return harness.Pairs[string, int](t, db, `
		SELECT status || '/' || attempts, count(*)::int FROM outbox_events
		 WHERE status NOT IN ('pending', 'queued') OR attempts > 0 GROUP BY 1
		UNION ALL
		SELECT 'position ' || concat_ws(' ', projection, done_cur, done_xid, done_id, claimed_cur, claimed_xid,
		                                claimed_id, epoch, saved_by, done_events), 1
		  FROM outbox_positions
		UNION ALL
		SELECT 'ledger ' || coalesce(sum(version), 0) || ' ' || coalesce(sum(event_id), 0), count(*)::int FROM outbox_ledger_entries`)
}

func refused(r *harness.Replica, reason string) bool {
	v, ok, err := r.Metric(`outbox_leader_refused{reason="` + reason + `"}`)
	return err == nil && ok && v == 1
}

func waitRefused(t *testing.T, r *harness.Replica, reason string) {
	t.Helper()
	harness.Eventually(t, 15*time.Second, r.Name+" to refuse to lead ("+reason+")", func() bool { return refused(r, reason) })
}

// leaderWatch reads /healthz of every watched replica, round after round,
// and counts the rounds in which more than one said leader.
type leaderWatch struct {
	mu       sync.Mutex
	replicas []*harness.Replica
	n, two   int
	quit     chan struct{}
	done     chan struct{}
	once     sync.Once
}

func watchLeaders(rs ...*harness.Replica) *leaderWatch {
	w := &leaderWatch{replicas: rs, quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			select {
			case <-w.quit:
				return
			case <-time.After(50 * time.Millisecond):
				w.round()
			}
		}
	}()
	return w
}

func (w *leaderWatch) round() {
	w.mu.Lock()
	rs := append([]*harness.Replica(nil), w.replicas...)
	w.mu.Unlock()
	leaders := 0
	for _, r := range rs {
		if r.Alive() && r.IsLeader() {
			leaders++
		}
	}
	w.mu.Lock()
	w.n++
	if leaders > 1 {
		w.two++
	}
	w.mu.Unlock()
}

func (w *leaderWatch) add(r *harness.Replica) {
	w.mu.Lock()
	w.replicas = append(w.replicas, r)
	w.mu.Unlock()
}

func (w *leaderWatch) stop() {
	w.once.Do(func() { close(w.quit) })
	<-w.done
}

// counts is how many rounds were read, and in how many two said leader.
func (w *leaderWatch) counts() (rounds, two int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n, w.two
}
