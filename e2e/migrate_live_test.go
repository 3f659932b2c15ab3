package e2e

// The upgrade the runbook documents without a window, from the release
// before this one under a steady producer: the two replicas of that release
// (schema 18, whose ledger is outbox_applied) drain while `wlproj migrate`
// brings the schema to head, copying a ledger of 100,000 entries into
// outbox_ledger in pages while the old leader keeps writing outbox_applied
// (its writes copied by the trigger); then the replicas are restarted on
// this binary, standby first. Every document and ledger entry is checked
// at the end. (From a release before 17, the upgrade goes through the
// release of 18 first: its own two steps, `migrate --to 17` then `migrate`.)

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/leader"
	"github.com/wlproj/wlproj/migrations"
)

// liveLockTimeout is the migrate's MIGRATE_LOCK_TIMEOUT here, the top of
// the runbook's range: under make test's load the old release's acks run
// for one to three seconds back to back, and behind them no try of 500 ms
// ever found a gap (CI ran out the five minutes). The producer waits up to
// this long per try.
const liveLockTimeout = "--lock-timeout=2s"

// liveMigrateBound is how long the migrate may take. Alone it takes well
// under a second; this is a bound against waiting for a replica for good
// (as it did while the standby waited in one statement), not a benchmark.
// 00021's brief ACCESS EXCLUSIVE statements wait for gaps between the old
// leader's acks, which run for seconds under make test's load (1m24s to
// over 2m measured), each wait bounded by lock_timeout for the producers.
const liveMigrateBound = 5 * time.Minute

// longestMigrateWait bounds any one lock wait of a migrate session: the
// replicas' transactions are short, and the standby's wait for leadership
// ends its statement every outbox.LockWaitSlice (1 s).
const longestMigrateWait = 5 * time.Second

// ackShowsWithin is how soon an ack is seen: a claimed row's at once, a
// queued row's when the leader next saves its position (once a second).
const ackShowsWithin = 2 * time.Second

// ledgerSchema is the first schema whose ledger is outbox_ledger: the
// release before it upserts outbox_applied.
const ledgerSchema = 19

func TestMigrateWhileReplicasDrain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	old := binaryBeforeMigration(t, ledgerSchema)
	t.Logf("the running release: built from %s, schema %d", old.commit[:12], old.schema)
	db := databaseAt(t, old.schema)
	// A ledger with history, for the copy to read: documents no event of
	// this test touches.
	db.Exec(t, `INSERT INTO outbox_applied (projection, entity_type, entity_id, version, deleted, event_id)
		SELECT 'search', 'old', g::text, g, g % 3 = 0, g FROM generate_series(1, 100000) g`)
	c := &cluster{t: t, db: db, index: harness.NewIndex(t)}
	c.env = harness.ReplicaEnv(db.URL, harness.ElasticURL(t), c.index, harness.Quick...)
	c.startBinary(old.path, "a")
	c.startBinary(old.path, "b")
	l := c.leader()
	standby := map[*harness.Replica]*harness.Replica{c.replicas[0]: c.replicas[1], c.replicas[1]: c.replicas[0]}[l]
	require.NoError(t, harness.WaitStandby(ctx, 20*time.Second, db.Pool, standby, leader.LockSessionName(standby.Name)))

	prod := harness.Produce(ctx, db.Pool, harness.ProducerConfig{Rate: 300, Next: liveBooks()})
	defer prod.Stop()
	harness.Eventually(t, 30*time.Second, "the leader draining", func() bool {
		return db.Int(t, `SELECT count(*) FROM outbox_event_states WHERE projection = 'search' AND status = 'done'`) > 1000
	})

	migrateLive(t, c, standby, liveLockTimeout)
	require.EqualValues(t, migrations.HeadVersion(), version(t, db))
	require.Equal(t, 100000, db.Int(t, `SELECT count(*) FROM outbox_ledger_entries WHERE entity_type = 'old'`),
		"the ledger's history copied")
	// A write the old leader makes after the migration lands in the ledger
	// (by event id, not by time: under load its acks run for seconds).
	copied := db.Int(t, `SELECT coalesce(max(event_id), 0) FROM outbox_ledger WHERE entity_type = 'book'`)
	harness.Eventually(t, 30*time.Second, "the old leader's ledger writes copied", func() bool {
		return db.Int(t, `SELECT coalesce(max(event_id), 0) FROM outbox_ledger WHERE entity_type = 'book'`) > copied
	})

	l, _ = rollReplicas(t, c, l, standby)
	prod.Stop()
	rep := c.settle(60 * time.Second)
	require.EqualValues(t, prod.Committed(), rep.Done)
	require.Equal(t, l.Name, positionSavedBy(t, c), "this binary's leader read the queued rows")
	require.Equal(t, 1, db.Int(t, `SELECT count(*) FROM outbox_ledger_rotation WHERE log_only`), "the ledger is this binary's")
}

// liveBooks is the producer's events: each a new version of one of 200 books.
func liveBooks() func(n int) []harness.Event {
	var version atomic.Int64
	return func(n int) []harness.Event {
		events := make([]harness.Event, n)
		for i := range events {
			v := version.Add(1)
			payload, _ := json.Marshal(map[string]any{"kind": "book", "title": fmt.Sprintf("v%d", v), "position": v})
			events[i] = harness.Event{EntityType: "book", EntityID: strconv.FormatInt(v%200, 10), Op: "upsert", Version: v, Payload: payload}
		}
		return events
	}
}

// rollReplicas restarts both replicas on this binary as the runbook
// orders it, the standby first, and returns the leader and the standby.
func rollReplicas(t *testing.T, c *cluster, l, standby *harness.Replica) (*harness.Replica, *harness.Replica) {
	t.Helper()
	standby.Stop(15 * time.Second)
	next := c.startBinary(harness.Binary(t), standby.Name)
	harness.Eventually(t, 15*time.Second, "the new standby ready", func() bool {
		code, _ := readyz(t, next)
		return code == http.StatusOK
	})
	l.Stop(45 * time.Second)
	require.Equal(t, next, c.leader())
	again := c.startBinary(harness.Binary(t), l.Name)
	require.NoError(t, harness.WaitStandby(context.Background(), 20*time.Second, c.db.Pool, again, leader.LockSessionName(again.Name)))
	return next, again
}

// migrateLive runs wlproj migrate with args while the cluster's leader
// drains under the producer: the leader acks during it, the standby stands
// by still, and no migrate session waits long for a lock or holds an old
// snapshot.
func migrateLive(t *testing.T, c *cluster, standby *harness.Replica, args ...string) {
	t.Helper()
	ctx := context.Background()
	waits := watchMigrateWaits(c.db, 50*time.Millisecond)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the migrate's longest lock wait: %s", waits.stop())
		}
	})
	snapshots := harness.WatchSnapshots(c.db.Pool, migrations.ApplicationName, 50*time.Millisecond)
	start, err := harness.Now(ctx, c.db.Pool)
	require.NoError(t, err)
	code, out := startMigrate(t, c.db.URL, args...).wait(t, liveMigrateBound)
	end, err := harness.Now(ctx, c.db.Pool)
	require.NoError(t, err)
	longest := waits.stop()
	oldest, _, err := snapshots.Stop()
	require.NoError(t, err)
	require.Zero(t, code, out)
	t.Logf("migrate %v took %s; its longest lock wait: %s; its oldest snapshot: %s old",
		args, end.Sub(start).Round(time.Millisecond), longest, oldest.Age.Round(time.Millisecond))

	// A queued row's ack shows when the position is next saved, at most a
	// second later; a migration to 18 alone takes less than that.
	acked, err := harness.WaitFirstAck(ctx, ackShowsWithin, c.db.Pool, start, "")
	require.NoError(t, err, "the leader stopped draining during the migration")
	require.True(t, acked.Before(end.Add(ackShowsWithin)), "the leader stopped draining during the migration")
	require.NoError(t, harness.WaitStandby(ctx, 10*time.Second, c.db.Pool, standby, leader.LockSessionName(standby.Name)), "the standby stands by still")
	require.Less(t, longest.dur, longestMigrateWait, "a migrate session waited needlessly long")
	require.Less(t, oldest.Age, longestMigrateWait, "a migrate session held a snapshot for long")
}

// migrateWait is one lock wait of a migrate session, as sampled.
type migrateWait struct {
	dur       time.Duration
	statement string
	event     string
	blockers  string
}

func (w migrateWait) String() string {
	if w.event == "" {
		return "none seen"
	}
	return fmt.Sprintf("%s on %s in %q, behind %s", w.dur.Round(time.Millisecond), w.event, w.statement, w.blockers)
}

// migrateWaits samples the migrate's sessions waiting for a lock, and the
// sessions they wait for, and keeps the longest wait it saw.
type migrateWaits struct {
	stopOnce sync.Once
	stopped  chan struct{}
	done     chan struct{}
	longest  migrateWait
}

const migrateWaitsSQL = `
SELECT w.pid || '/' || w.query_start, w.wait_event_type || ':' || w.wait_event, left(w.query, 80),
       coalesce((SELECT string_agg(b.application_name || ' (' || coalesce(b.state, '') || coalesce(', waiting on ' || b.wait_event, '') || ')', ', ')
                   FROM pg_stat_activity b WHERE b.pid = ANY (pg_blocking_pids(w.pid))), 'nobody')
  FROM pg_stat_activity w
 WHERE w.datname = current_database() AND w.application_name = $1 AND w.wait_event_type = 'Lock'`

func watchMigrateWaits(db harness.DB, every time.Duration) *migrateWaits {
	w := &migrateWaits{stopped: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		since := map[string]time.Time{} // waits in progress, by session and statement
		for {
			now := time.Now()
			rows, err := db.Pool.Query(context.Background(), migrateWaitsSQL, migrations.ApplicationName)
			seen := map[string]bool{}
			for err == nil && rows.Next() {
				var key string
				var cur migrateWait
				if rows.Scan(&key, &cur.event, &cur.statement, &cur.blockers) != nil {
					continue
				}
				seen[key] = true
				if _, ok := since[key]; !ok {
					since[key] = now
				}
				if cur.dur = now.Sub(since[key]); cur.dur >= w.longest.dur {
					w.longest = cur
				}
			}
			if rows != nil {
				rows.Close()
			}
			for key := range since {
				if !seen[key] {
					delete(since, key)
				}
			}
			select {
			case <-w.stopped:
				return
			case <-time.After(every):
			}
		}
	}()
	return w
}

func (w *migrateWaits) stop() migrateWait {
	w.stopOnce.Do(func() { close(w.stopped) })
	<-w.done
	return w.longest
}
