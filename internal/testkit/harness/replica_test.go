package harness

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/leader"
)

// replicaEnv is a fresh database and index for real replicas to drain.
func replicaEnv(t *testing.T) (DB, string, []string) {
	t.Helper()
	db, index := NewDatabase(t), NewIndex(t)
	return db, index, ReplicaEnv(db.URL, ElasticURL(t), index, Quick...)
}

func TestReplicaHealthMetricsAndKill9(t *testing.T) {
	t.Parallel()
	_, _, env := replicaEnv(t)
	r := StartReplica(t, "solo", env)
	Healthy(t, r)
	require.Same(t, r, Leader(t, r))
	h, err := r.Health()
	require.NoError(t, err)
	require.Equal(t, Health{Status: "ok", Role: RoleLeader, WorkerID: "solo", Epoch: 1}, h)

	peak := r.WatchPeak("outbox_leader", 10*time.Millisecond)
	Eventually(t, 5*time.Second, "outbox_leader 1 scraped", func() bool { return peak.Max() == 1 })

	r.Kill()
	require.False(t, r.Alive())
	code, err := r.ExitCode(time.Second)
	require.NoError(t, err)
	require.Equal(t, -1, code, "killed by a signal")
	require.Equal(t, float64(1), peak.Max(), "the peak outlives the process")
	require.ErrorContains(t, r.WaitHealthy(context.Background()), "solo exited")
}

func TestReplicaSigtermExitsZero(t *testing.T) {
	t.Parallel()
	_, _, env := replicaEnv(t)
	r := StartReplica(t, "term", env)
	Healthy(t, r)
	require.NoError(t, r.Signal(syscall.SIGTERM))
	code, err := r.ExitCode(15 * time.Second)
	require.NoError(t, err)
	require.Zero(t, code)
}

func TestLeaderStandbyAndFailover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, index, env := replicaEnv(t)
	a, b := StartReplica(t, "a", env), StartReplica(t, "b", env)
	Healthy(t, a, b)
	l, epoch, err := WaitLeader(ctx, 15*time.Second, 0, a, b)
	require.NoError(t, err)
	require.EqualValues(t, 1, epoch)
	standby := map[*Replica]*Replica{a: b, b: a}[l]
	require.NoError(t, WaitStandby(ctx, 15*time.Second, db.Pool, standby, leader.LockSessionName(standby.Name)))
	require.ErrorContains(t, WaitStandby(ctx, 100*time.Millisecond, db.Pool, l, leader.LockSessionName(l.Name)), "timed out after 100ms waiting for "+l.Name)

	p := Produce(ctx, db.Pool, ProducerConfig{Rate: 200, Next: books(new(int))})
	defer p.Stop()
	killed, err := Now(ctx, db.Pool)
	require.NoError(t, err)
	l.Kill()
	next, nextEpoch, err := WaitLeader(ctx, 15*time.Second, epoch+1, a, b)
	require.NoError(t, err)
	require.Same(t, standby, next)
	require.EqualValues(t, 2, nextEpoch)
	ack, err := WaitFirstAck(ctx, 15*time.Second, db.Pool, killed, next.Name)
	require.NoError(t, err)
	require.True(t, ack.After(killed))
	requireFirstApplied(ctx, t, db, ack, next.Name)

	p.Stop()
	require.NoError(t, p.Err())
	Drained(t, db.Pool, 30*time.Second)
	_, ok, err := AckedAfter(ctx, db.Pool, time.Now().Add(time.Hour), "")
	require.NoError(t, err)
	require.False(t, ok, "no ack in the future")
	require.EqualValues(t, p.Committed(), Verified(t, db.Pool, index).Done)
}

// requireFirstApplied checks that ack, what WaitFirstAck returned, is when
// by applied its first event of the term, as the ledger dates it (the
// replicas run a search projection, and their rows are queued), and not
// its first checkpoint, which the loop saves with its first confirmed
// batch: after the ack that wrote the ledger.
func requireFirstApplied(ctx context.Context, t *testing.T, db DB, ack time.Time, by string) {
	t.Helper()
	var term, firstApplied, firstCheckpoint time.Time
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT acquired_at FROM outbox_leader WHERE holder = $1`, by).Scan(&term))
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT min(applied_at) FROM outbox_ledger WHERE applied_at >= $1`, term).Scan(&firstApplied))
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT confirmed_at FROM outbox_positions WHERE saved_by = $1 ORDER BY confirmed_at LIMIT 1`, by).Scan(&firstCheckpoint))
	require.True(t, ack.Equal(firstApplied), "the takeover ends at the first ledger entry of the term (%s), not at %s", firstApplied, ack)
	require.True(t, firstCheckpoint.After(firstApplied), "the first checkpoint (%s) comes after the first ack", firstCheckpoint)
}
