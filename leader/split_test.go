package leader

import (
	"context"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/pgpool"
	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/outbox"
)

// openPool is the replica's pool on url, named application for
// pg_stat_activity, closed when the test ends.
func openPool(t *testing.T, url, application string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgpool.Open(context.Background(), url, 4, application)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, pool.Ping(context.Background()))
	return pool
}

func withPool(pool *pgxpool.Pool) func(*Elector) {
	return func(e *Elector) { e.PoolServers = PoolServers(pool) }
}

func (r *replica) refused() string { return r.e.State().Refused }

func (r *replica) terms() (drained, aborted int, elected []int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.drained, r.aborted, append([]int64(nil), r.elected...)
}

// A standby promoted while its primary still runs (a partition, a failover
// tool without fencing) makes two primaries. The leader on the old one,
// whose lock connection is fine, sees a listed host that is a primary on a
// newer timeline, steps down as at shutdown and says why; it does not lead
// while the split lasts, and leads on the new primary once the old one is
// gone.
func TestLeaderStepsDownWhenAnotherPrimaryIsNewer(t *testing.T) {
	t.Parallel()
	pair := harness.StartPGPair(t)
	db := pair.NewDatabase(t, pair.URL([]string{pair.Primary.Addr(), pair.Standby.Addr()}, "target_session_attrs=read-write"))
	r := runReplica(t, db.URL, "a", withPool(openPool(t, db.URL, "wlproj:a")))
	waitLeader(t, r)
	require.Empty(t, r.refused())
	probes, err := r.e.probeHosts(context.Background())
	require.NoError(t, err)
	require.Len(t, probes, 2)
	for i, want := range []struct {
		primary  bool
		timeline int64
	}{{true, 1}, {false, 0}} {
		require.NoError(t, probes[i].err, probes[i].host)
		require.Equal(t, want.primary, probes[i].server.Primary, probes[i].host)
		require.Equal(t, want.timeline, probes[i].server.Timeline, probes[i].host)
	}

	pair.Promote(t)
	harness.Eventually(t, 5*time.Second, "the leader on the old primary to step down", func() bool {
		return !r.leading() && r.refused() == ReasonNotNewestPrimary
	})
	drained, aborted, _ := r.terms()
	require.Equal(t, 1, drained, "it stepped down as at shutdown")
	require.Zero(t, aborted)
	time.Sleep(time.Second) // five checks
	require.False(t, r.leading(), "it does not lead while the split lasts")
	_, _, elected := r.terms()
	require.Len(t, elected, 1)

	require.NoError(t, pair.KillPrimary())
	harness.Eventually(t, 10*time.Second, "the replica to lead on the promoted standby", func() bool {
		return r.leading() && r.refused() == ""
	})
	require.Greater(t, r.e.State().Epoch, int64(outbox.EpochsPerTimeline), "an epoch of timeline 2")
}

// After a failover the old primary comes back as a primary. A leader on the
// promoted standby whose pool's connections end and come back on the old
// primary (listed first) steps down, since its claims would run on one
// server and its lock and epoch live on the other, and refuses to lead while
// the pool stays there; once the old primary is gone it leads again.
func TestLeaderWhosePoolReachesAnotherServerStepsDown(t *testing.T) {
	t.Parallel()
	pair := harness.StartPGPair(t)
	primaryFirst := []string{pair.Primary.Addr(), pair.Standby.Addr()}
	db := pair.NewDatabase(t, pair.URL(primaryFirst, "target_session_attrs=read-write"))
	require.NoError(t, pair.KillPrimary())
	pair.Promote(t)
	pool := openPool(t, db.URL, "wlproj:a")
	standbyFirst := strings.Replace(db.URL, strings.Join(primaryFirst, ","), pair.Standby.Addr()+","+pair.Primary.Addr(), 1)
	r := runReplica(t, standbyFirst, "a", withPool(pool))
	waitLeader(t, r)
	epoch := r.e.State().Epoch

	pair.StartOldPrimary(t)
	harness.TerminateSessions(t, harness.DBOnNode(t, db, pair.Standby), "wlproj:a")
	harness.Eventually(t, 5*time.Second, "the leader to step down", func() bool {
		return !r.leading() && r.refused() == ReasonPoolOnOtherServer
	})
	drained, _, _ := r.terms()
	require.Equal(t, 1, drained, "it stepped down as at shutdown")
	time.Sleep(time.Second)
	require.False(t, r.leading(), "it does not lead while its pool is on the other server")

	require.NoError(t, pair.KillPrimary())
	harness.Eventually(t, 10*time.Second, "the replica to lead again", func() bool {
		return r.leading() && r.refused() == "" && r.e.State().Epoch > epoch
	})
}

// One server listed under two names is one server, not two primaries: the
// replica leads and refuses nothing.
func TestOneServerUnderTwoNamesIsNoSplit(t *testing.T) {
	t.Parallel()
	db := harness.NewDatabase(t)
	u, err := url.Parse(db.URL)
	require.NoError(t, err)
	u.Host += ",localhost:" + u.Port()
	u.RawQuery += "&target_session_attrs=read-write"
	twoNames := u.String()
	r := runReplica(t, twoNames, "a", withPool(openPool(t, twoNames, "wlproj:a")))
	waitLeader(t, r)
	time.Sleep(time.Second) // five checks
	require.True(t, r.leading())
	require.Empty(t, r.refused())
}

// A standby checks for a split while it waits for the lock, every half
// ServerCheckInterval, so that when the lock comes its last check is recent
// and it leads without checking again: a takeover waits for no probe of
// the hosts and no statement on each pooled connection.
func TestStandbyChecksWhileWaitingAndTakesOverWithoutChecking(t *testing.T) {
	t.Parallel()
	db := harness.NewDatabase(t)
	pool := openPool(t, db.URL, "wlproj:b")
	var mu sync.Mutex
	var checks []time.Time
	a := runReplica(t, db.URL, "a", nil)
	waitLeader(t, a)
	b := runReplica(t, db.URL, "b", func(e *Elector) {
		poolServers := PoolServers(pool)
		e.PoolServers = func(ctx context.Context) ([]Server, error) {
			mu.Lock()
			checks = append(checks, time.Now())
			mu.Unlock()
			return poolServers(ctx)
		}
	})
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(checks)
	}
	harness.Eventually(t, 5*time.Second, "the standby to check three times while it waits", func() bool { return count() >= 3 })
	require.False(t, b.leading())

	// Right after a check, the next is half an interval away (100 ms).
	last := count()
	harness.Eventually(t, 5*time.Second, "the standby's next check", func() bool { return count() > last })
	released := time.Now()
	a.stop()
	waitLeader(t, b)
	_, _, elected := b.terms()
	require.Len(t, elected, 1)
	mu.Lock()
	defer mu.Unlock()
	for _, at := range checks {
		require.False(t, at.After(released) && b.e.State().Since.After(at),
			"no check between the lock's release (%s) and the term (%s): one at %s", released, b.e.State().Since, at)
	}
}
