package leader

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/outbox"
)

// replica runs one elector whose services record their life.
type replica struct {
	e       *Elector
	cancel  context.CancelFunc
	done    chan struct{}
	mu      sync.Mutex
	elected []int64
	aborted int // services ended by ctx (leadership lost)
	drained int // services ended by drain
}

// startReplica runs a replica named id; canLead, if given, is its
// elector's CanLead.
func startReplica(t *testing.T, db harness.DB, id string, canLead ...func() bool) *replica {
	t.Helper()
	return runReplica(t, db.URL, id, func(e *Elector) {
		for _, f := range canLead {
			e.CanLead = f
		}
	})
}

// runReplica runs a replica named id on url with quick checks; setup, if
// not nil, sets its elector's hooks.
func runReplica(t *testing.T, url, id string, setup func(*Elector)) *replica {
	t.Helper()
	r := &replica{done: make(chan struct{})}
	var err error
	r.e, err = New(Config{DatabaseURL: url, Name: "test", WorkerID: id, CheckInterval: 50 * time.Millisecond,
		TickInterval: 50 * time.Millisecond, RetryInterval: 50 * time.Millisecond, ServerCheckInterval: 200 * time.Millisecond},
		zerolog.Nop(), r)
	require.NoError(t, err)
	if setup != nil {
		setup(r.e)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { defer close(r.done); r.e.Run(ctx) }()
	t.Cleanup(r.stop)
	return r
}

func (r *replica) Name() string { return "recorder" }

// Run records the term and how it ended.
func (r *replica) Run(ctx context.Context, epoch int64, drain <-chan struct{}) {
	r.mu.Lock()
	r.elected = append(r.elected, epoch)
	r.mu.Unlock()
	select {
	case <-ctx.Done():
		r.mu.Lock()
		r.aborted++
		r.mu.Unlock()
	case <-drain:
		r.mu.Lock()
		r.drained++
		r.mu.Unlock()
	}
}

func (r *replica) stop() {
	r.cancel()
	<-r.done
}

func (r *replica) leading() bool { return r.e.State().Role == RoleLeader }

func waitLeader(t *testing.T, rs ...*replica) *replica {
	t.Helper()
	return harness.EventuallyOne(t, 10*time.Second, "exactly one leader", rs, (*replica).leading)
}

// startPair starts replicas a and b on a database of their own and returns
// it, the one of them elected and the other.
func startPair(t *testing.T) (db harness.DB, leader, other *replica) {
	t.Helper()
	db = harness.NewDatabase(t)
	a, b := startReplica(t, db, "a"), startReplica(t, db, "b")
	leader = waitLeader(t, a, b)
	return db, leader, map[*replica]*replica{a: b, b: a}[leader]
}

func lockHolderPID(t *testing.T, db harness.DB, worker string) int {
	t.Helper()
	var pid int
	require.NoError(t, db.Pool.QueryRow(context.Background(), `
		SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()`, LockSessionName(worker)).Scan(&pid))
	return pid
}

func TestOneLeaderAndGracefulHandover(t *testing.T) {
	t.Parallel()
	_, first, other := startPair(t)
	require.False(t, other.leading())
	epoch := first.e.State().Epoch

	first.stop() // graceful: drain, then unlock
	require.Equal(t, 1, first.drained)
	second := waitLeader(t, other)
	require.Equal(t, epoch+1, second.e.State().Epoch, "each election bumps the epoch")
}

func TestTerminatedLockSessionStopsTheLeader(t *testing.T) {
	t.Parallel()
	db, first, other := startPair(t)
	epoch := first.e.State().Epoch

	pid := lockHolderPID(t, db, first.e.State().WorkerID)
	killed := time.Now()
	_, err := db.Pool.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, pid)
	require.NoError(t, err)

	harness.Eventually(t, 5*time.Second, "old leader stopped its services", func() bool {
		first.mu.Lock()
		defer first.mu.Unlock()
		return first.aborted == 1
	})
	stoppedIn := time.Since(killed)
	require.Less(t, stoppedIn, 2*time.Second, "the leader notices within its check interval")
	harness.Eventually(t, 5*time.Second, "a new leader with a newer epoch", func() bool {
		for _, r := range []*replica{other, first} {
			if r.leading() && r.e.State().Epoch > epoch {
				return true
			}
		}
		return false
	})
	t.Logf("old leader stopped %s after its lock session was terminated; takeover %s", stoppedIn, time.Since(killed))
}

func TestHealthTicksWhileStandby(t *testing.T) {
	t.Parallel()
	_, _, standby := startPair(t)
	before := standby.e.LastTick()
	harness.Eventually(t, 2*time.Second, "standby ticks while it waits for the lock", func() bool {
		return standby.e.LastTick().After(before)
	})
}

// A standby waits for leadership as long as the leader lives. Its wait must
// not hold a snapshot: one held anywhere in the database stops VACUUM from
// removing rows deleted after it was taken, in the application's tables too.
func TestStandbyWaitHoldsNoSnapshot(t *testing.T) {
	t.Parallel()
	// A Postgres of its own: other packages' tests on the stack's hold xids
	// for seconds, which any snapshot taken meanwhile carries in.
	pg := harness.StartPGAlone(t)
	db := pg.NewDatabase(t, pg.URL([]string{pg.Primary.Addr()}))
	a, b := startReplica(t, db, "a"), startReplica(t, db, "b")
	standby := map[*replica]*replica{a: b, b: a}[waitLeader(t, a, b)]
	ctx := context.Background()
	lockSession := LockSessionName(standby.e.State().WorkerID)
	harness.Eventually(t, 5*time.Second, "standby waiting for the lock", func() bool {
		return db.Int(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
		                  AND application_name = $1 AND wait_event_type = 'Lock'`, lockSession) == 1
	})

	watch := harness.WatchSnapshots(db.Pool, lockSessionPrefix, 50*time.Millisecond)
	rows, err := harness.DeleteRows(ctx, db.Pool, "application_rows", 1000)
	require.NoError(t, err)
	left, err := rows.WaitRemoved(ctx, 3*outbox.LockWaitSlice)
	require.NoError(t, err, "VACUUM removes rows deleted while the standby waits: %d left", left)
	time.Sleep(2 * outbox.LockWaitSlice) // watch a few more slices of the wait
	oldest, samples, err := watch.Stop()
	require.NoError(t, err)
	require.Less(t, oldest.Age, outbox.LockWaitSlice+500*time.Millisecond,
		"no lock session holds a snapshot longer than one wait slice; oldest of %d samples: %s", samples, oldest)
	require.Equal(t, RoleStandby, standby.e.State().Role, "the standby still stands by")
}
