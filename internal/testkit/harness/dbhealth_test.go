package harness

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// connectAs opens a connection to url named application, closed when the
// test ends.
func connectAs(t *testing.T, url, application string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	cfg.RuntimeParams["application_name"] = application
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// holdSnapshot opens a transaction on conn that keeps its snapshot, as a
// pg_dump or a session idle in a transaction would.
func holdSnapshot(t *testing.T, conn *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	_, err := conn.Exec(ctx, `BEGIN ISOLATION LEVEL REPEATABLE READ`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `SELECT 1`)
	require.NoError(t, err)
}

// burnXIDs commits n transactions that each take an xid.
func burnXIDs(t *testing.T, db DB, n int) {
	t.Helper()
	for range n {
		db.Exec(t, `SELECT txid_current()`)
	}
}

func TestOldestHorizonNamesWhoHoldsIt(t *testing.T) {
	t.Parallel()
	db, elsewhere := NewDatabase(t), NewEmptyDatabase(t)
	ctx := context.Background()
	// A snapshot in another database holds back only the shared catalogs:
	// not ours.
	holdSnapshot(t, connectAs(t, elsewhere.URL, "someone-elsewhere"))
	burnXIDs(t, db, 3)
	holdSnapshot(t, connectAs(t, db.URL, "nightly-dump"))
	burnXIDs(t, db, 5)

	h, held, err := OldestHorizon(ctx, db.Pool)
	require.NoError(t, err)
	require.True(t, held, "the dump's snapshot holds the horizon")
	require.Equal(t, "backend", h.Kind)
	require.Contains(t, h.Who, "nightly-dump")
	require.GreaterOrEqual(t, h.XIDAge, int64(5), "the transactions begun since its snapshot")
	require.Positive(t, h.Age)
}

func TestTablesCountDeadRowsAndVacuums(t *testing.T) {
	t.Parallel()
	db := NewEmptyDatabase(t)
	ctx := context.Background()
	db.Exec(t, `CREATE TABLE churn (id int PRIMARY KEY) WITH (autovacuum_enabled = false)`)
	db.Exec(t, `INSERT INTO churn SELECT generate_series(1, 100)`)
	db.Exec(t, `DELETE FROM churn WHERE id <= 40`)
	Eventually(t, 10*time.Second, "the delete's dead rows in the statistics", func() bool {
		stats, err := Tables(ctx, db.Pool, "churn", "no_such_table")
		require.NoError(t, err)
		require.NotContains(t, stats, "no_such_table")
		return stats["churn"].Dead == 40 && stats["churn"].Live == 60
	})
	db.Exec(t, `VACUUM churn`)
	stats, err := Tables(ctx, db.Pool, "churn")
	require.NoError(t, err)
	require.Equal(t, TableStats{Live: 60, Dead: 0, Autovacuums: 0, Vacuums: 1}, stats["churn"])
}

// A standby waiting for the leader's advisory lock is how the pair should
// look; a session of ours waiting for a row lock is a lock wait.
func TestWaitingForLocksLeavesTheElectionApart(t *testing.T) {
	t.Parallel()
	db := NewEmptyDatabase(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	db.Exec(t, `CREATE TABLE books (id int PRIMARY KEY, title text)`)
	db.Exec(t, `INSERT INTO books VALUES (1, 'a')`)
	holder := connectAs(t, db.URL, "application")
	_, err := holder.Exec(ctx, `BEGIN; UPDATE books SET title = 'b' WHERE id = 1; SELECT pg_advisory_lock(42)`)
	require.NoError(t, err)
	blocked, standby := connectAs(t, db.URL, "wlproj:a"), connectAs(t, db.URL, "wlproj-leader:b")
	go func() { _, _ = blocked.Exec(ctx, `UPDATE books SET title = 'c' WHERE id = 1`) }()
	go func() { _, _ = standby.Exec(ctx, `SELECT pg_advisory_lock(42)`) }()

	var w LockWaits
	Eventually(t, 5*time.Second, "both sessions waiting", func() bool {
		w, err = WaitingForLocks(ctx, db.Pool, "wlproj", "wlproj-leader:")
		require.NoError(t, err)
		return w.Waiting+w.Election == 2
	})
	require.Equal(t, 1, w.Waiting, "the row lock wait")
	require.Contains(t, w.First, "wlproj:a")
	require.Equal(t, 1, w.Election, "the standby's wait for the lock")
}

func TestWatchHealthSamplesTheOutbox(t *testing.T) {
	t.Parallel()
	db := NewDatabase(t)
	require.NoError(t, Insert(context.Background(), db.Pool, books(new(int))(3)))
	w := WatchHealth(db.Pool, HealthConfig{Prefix: "wlproj", Election: "wlproj-leader:",
		Tables: []string{"outbox_events", "outbox_ledger"}, Backlog: true, Every: 20 * time.Millisecond})
	Eventually(t, 10*time.Second, "two samples", func() bool { return len(w.Samples()) >= 2 })
	samples := w.Stop()
	for _, s := range samples {
		require.NoError(t, s.Err)
		require.EqualValues(t, 3, s.Backlog)
		require.Contains(t, s.Tables, "outbox_events")
		require.Contains(t, s.Tables, "outbox_ledger")
	}
	require.Len(t, w.Samples(), len(samples), "nothing sampled after Stop")
}

func TestSummarizeKeepsTheWorst(t *testing.T) {
	t.Parallel()
	at := time.Now()
	sample := func(s int, dead, autovacuums int64, xids int64, ours time.Duration, waiting, standby int) HealthSample {
		return HealthSample{At: at.Add(time.Duration(s) * time.Second),
			Oldest: Horizon{Kind: "backend", Who: "dump", XIDAge: xids, Age: time.Duration(xids) * time.Millisecond}, Held: true,
			Ours: Snapshot{Application: "wlproj:a", Age: ours}, OursHeld: ours > 0,
			Tables: map[string]TableStats{"outbox_events": {Dead: dead, Autovacuums: autovacuums}},
			Locks:  LockWaits{Waiting: waiting, First: "wlproj:a (pid 1) on transactionid", Election: standby}, Backlog: dead / 10}
	}
	samples := []HealthSample{
		sample(0, 100, 4, 10, 0, 0, 1),
		sample(1, 900, 4, 700, 2*time.Second, 1, 1),
		{At: at.Add(2 * time.Second), Err: context.DeadlineExceeded},
		sample(3, 50, 6, 20, 300*time.Millisecond, 0, 0),
	}
	h := Summarize(samples)
	require.Equal(t, 4, h.Samples)
	require.Equal(t, 1, h.FailedSamples)
	require.Equal(t, int64(700), h.OldestXIDAge)
	require.Equal(t, 0.7, h.OldestSeconds)
	require.Equal(t, "backend dump", h.OldestHolder)
	require.Equal(t, 2.0, h.OursSeconds)
	require.Contains(t, h.OursHolder, "wlproj:a")
	require.Equal(t, TableSummary{DeadMax: 900, DeadMin: 50, DeadLast: 50, Autovacuums: 2}, h.Tables["outbox_events"])
	require.Equal(t, 1, h.LockWaitSamples)
	require.Equal(t, "wlproj:a (pid 1) on transactionid", h.LockWaiter)
	require.Equal(t, 2, h.StandbySamples)
	require.Equal(t, int64(90), h.BacklogMax)

	require.Len(t, Between(samples, at.Add(time.Second), at.Add(3*time.Second)), 2, "[from, to)")
}
