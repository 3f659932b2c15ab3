package e2e

// The upgrade the runbook documents without a window: `wlproj migrate` from
// schema 15 to head while the two replicas of the documented topology run
// on 15 under a steady producer. It builds 00016's index CONCURRENTLY, and a
// CONCURRENTLY build waits for every transaction and snapshot older than
// itself: it finishes only if no replica holds one for long.

import (
	"context"
	"encoding/json"
	"fmt"
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

// liveMigrateBound is how long the migrate may take. Alone it takes well
// under a second; this is a bound against waiting for a replica for good
// (as it did while the standby waited in one statement), not a benchmark.
const liveMigrateBound = 2 * time.Minute

// longestMigrateWait bounds any one lock wait of a migrate session: the
// replicas' transactions are short, and the standby's wait for leadership
// ends its statement every outbox.LockWaitSlice (1 s).
const longestMigrateWait = 5 * time.Second

func TestMigrateWhileReplicasDrain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := databaseAt(t, 15)
	// An outbox with history, for the build to read: the chronicle's done
	// rows, which the replicas neither claim nor judge.
	db.Exec(t, `INSERT INTO outbox_events (projection, entity_type, entity_id, op, event_version, payload, status, processed_at)
		SELECT 'chronicle', 'book', (g % 20000)::text, 'upsert', g, '{"title": "t"}', 'done', now()
		  FROM generate_series(1, 200000) g`)
	c := &cluster{t: t, db: db, index: harness.NewIndex(t)}
	c.env = harness.ReplicaEnv(db.URL, harness.ElasticURL(t), c.index, harness.Quick...)
	l := c.run("a", "b")
	standby := c.replicas[0]
	if standby == l {
		standby = c.replicas[1]
	}
	require.NoError(t, harness.WaitStandby(ctx, 20*time.Second, db.Pool, standby, leader.LockSessionName(standby.Name)))

	var version atomic.Int64
	prod := harness.Produce(ctx, db.Pool, harness.ProducerConfig{Rate: 300, Next: func(n int) []harness.Event {
		events := make([]harness.Event, n)
		for i := range events {
			v := version.Add(1)
			payload, _ := json.Marshal(map[string]any{"kind": "book", "title": fmt.Sprintf("v%d", v), "position": v})
			events[i] = harness.Event{EntityType: "book", EntityID: strconv.FormatInt(v%200, 10), Op: "upsert", Version: v, Payload: payload}
		}
		return events
	}})
	defer prod.Stop()
	harness.Eventually(t, 30*time.Second, "the leader draining", func() bool { return c.count(`status = 'done'`) > 1000 })

	waits := watchMigrateWaits(db, 50*time.Millisecond)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the migrate's longest lock wait: %s", waits.stop())
		}
	})
	snapshots := harness.WatchSnapshots(db.Pool, migrations.ApplicationName, 50*time.Millisecond)
	start, err := harness.Now(ctx, db.Pool)
	require.NoError(t, err)
	code, out := startMigrate(t, db.URL).wait(t, liveMigrateBound)
	end, err := harness.Now(ctx, db.Pool)
	require.NoError(t, err)
	longest := waits.stop()
	oldest, _, err := snapshots.Stop()
	require.NoError(t, err)
	require.Zero(t, code, out)
	t.Logf("migrate 15 → head took %s; its longest lock wait: %s; its oldest snapshot: %s old",
		end.Sub(start).Round(time.Millisecond), longest, oldest.Age.Round(time.Millisecond))

	require.Equal(t, 1, db.Int(t, `SELECT count(*) FROM pg_index WHERE indexrelid = to_regclass($1) AND indisvalid`, dueIndex))
	require.Positive(t, db.Count(t, `status = 'done' AND processed_at BETWEEN $1 AND $2`, start, end), "the leader stopped draining during the migration")
	require.NoError(t, harness.WaitStandby(ctx, 10*time.Second, db.Pool, standby, leader.LockSessionName(standby.Name)), "the standby stands by still")
	require.Less(t, longest.dur, longestMigrateWait, "a migrate session waited needlessly long")
	require.Less(t, oldest.Age, longestMigrateWait, "a migrate session held a snapshot for long")

	prod.Stop()
	rep := c.settle(60 * time.Second)
	require.EqualValues(t, prod.Committed(), rep.Done)
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
