package leader

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// lockSessions counts the lock connections of worker in the database.
func lockSessions(t *testing.T, db harness.DB, worker string) int {
	t.Helper()
	return db.Int(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1`,
		LockSessionName(worker))
}

// A replica that may not lead (its schema is behind its binary) holds no
// connection, takes no lock and bumps no epoch, however long it runs; it
// campaigns, and wins, once it may.
func TestReplicaThatMayNotLeadDoesNotCampaign(t *testing.T) {
	t.Parallel()
	db := harness.NewDatabase(t)
	var may atomic.Bool
	r := startReplica(t, db, "gated", may.Load)

	before := r.e.LastTick()
	time.Sleep(500 * time.Millisecond) // ten ticks
	require.Equal(t, RoleStandby, r.e.State().Role)
	require.Zero(t, lockSessions(t, db, "gated"), "no lock connection while it may not lead")
	require.Zero(t, db.Int(t, `SELECT count(*) FROM outbox_leader`), "no epoch taken")
	require.True(t, r.e.LastTick().After(before), "it still ticks: alive, only not leading")

	may.Store(true)
	waitLeader(t, r)
	require.Equal(t, int64(1), r.e.State().Epoch)
}

// A leader for which CanLead turns to no steps down as at shutdown (its
// services drain, the lock is released), the other replica takes over, and
// it does not campaign again until it may.
func TestLeaderThatMayNotLeadStepsDown(t *testing.T) {
	t.Parallel()
	db := harness.NewDatabase(t)
	var mayA, mayB atomic.Bool
	mayA.Store(true)
	a := startReplica(t, db, "a", mayA.Load)
	waitLeader(t, a)
	mayB.Store(true)
	b := startReplica(t, db, "b", mayB.Load)
	epoch := a.e.State().Epoch

	mayA.Store(false)
	waitLeader(t, b)
	require.Equal(t, epoch+1, b.e.State().Epoch)
	a.mu.Lock()
	drained, aborted := a.drained, a.aborted
	a.mu.Unlock()
	require.Equal(t, 1, drained, "its services drained, as at shutdown")
	require.Zero(t, aborted)
	harness.Eventually(t, 2*time.Second, "its lock connection closed", func() bool { return lockSessions(t, db, "a") == 0 })

	b.stop()
	time.Sleep(300 * time.Millisecond)
	require.Equal(t, RoleStandby, a.e.State().Role, "it does not campaign while it may not lead")
	mayA.Store(true)
	waitLeader(t, a)
}

// A standby waiting for the lock gives the wait up at the next slice once
// it may not lead: it must not win the lock when the leader goes.
func TestStandbyThatMayNotLeadStopsWaiting(t *testing.T) {
	t.Parallel()
	db := harness.NewDatabase(t)
	a := startReplica(t, db, "a")
	waitLeader(t, a)
	var mayB atomic.Bool
	mayB.Store(true)
	b := startReplica(t, db, "b", mayB.Load)
	harness.Eventually(t, 5*time.Second, "b waits for the lock", func() bool { return lockSessions(t, db, "b") == 1 })

	mayB.Store(false)
	harness.Eventually(t, 3*time.Second, "b closed its lock connection", func() bool { return lockSessions(t, db, "b") == 0 })
	a.stop()
	time.Sleep(300 * time.Millisecond)
	require.Equal(t, RoleStandby, b.e.State().Role, "b did not take the lock a released")
}
