package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// A wlproj session that holds a snapshot holds back vacuum of every table in
// its database, the application's included. These helpers let a test watch
// for it from the database's side: the age of each session's snapshot, and
// whether VACUUM can remove rows deleted before it ran.

// Snapshot is one session's snapshot as pg_stat_activity shows it.
type Snapshot struct {
	PID         int
	Application string
	State       string
	// Wait is what the session waited on when sampled ("Lock:relation",
	// "IO:DataFileRead"), or "" when it was running or runnable: a slow
	// statement's cause, lock, disk or a starved CPU.
	Wait  string
	Query string
	// Age is how long the snapshot has been held: since the transaction
	// began, or the statement for one outside a transaction.
	Age time.Duration
}

func (s Snapshot) String() string {
	wait := s.Wait
	if wait == "" {
		wait = "not waiting"
	}
	return fmt.Sprintf("%s (pid %d, %s, %s, %s old): %.120q", s.Application, s.PID, s.State, wait, s.Age.Round(time.Millisecond), s.Query)
}

// OldestSnapshot returns the oldest snapshot (or transaction id, which holds
// the horizon as well) held in q's database by a session whose
// application_name starts with prefix (every wlproj session's starts with
// "wlproj"), and false when none holds one. An idle session outside a
// transaction is left out: the snapshot it shows for an instant is the one
// Postgres takes to read the notification queue for a LISTENing backend,
// and its query_start is that of its last statement, minutes ago.
func OldestSnapshot(ctx context.Context, q Querier, prefix string) (Snapshot, bool, error) {
	var s Snapshot
	var seconds float64
	err := q.QueryRow(ctx, `
		SELECT pid, application_name, coalesce(state, ''),
		       coalesce(wait_event_type || ':' || wait_event, ''), left(coalesce(query, ''), 300),
		       extract(epoch FROM clock_timestamp() - coalesce(xact_start, query_start))
		  FROM pg_stat_activity
		 WHERE datname = current_database() AND pid <> pg_backend_pid()
		   AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL) AND starts_with(application_name, $1)
		   AND (xact_start IS NOT NULL OR state = 'active')
		 ORDER BY coalesce(xact_start, query_start) LIMIT 1`, prefix).
		Scan(&s.PID, &s.Application, &s.State, &s.Wait, &s.Query, &seconds)
	if err == pgx.ErrNoRows {
		return Snapshot{}, false, nil
	}
	if err != nil {
		return Snapshot{}, false, fmt.Errorf("oldest snapshot: %w", err)
	}
	s.Age = time.Duration(seconds * float64(time.Second))
	return s, true, nil
}

// SnapshotWatch samples OldestSnapshot every interval until Stop and keeps
// the oldest it saw.
type SnapshotWatch struct {
	stop    chan struct{}
	done    chan struct{}
	oldest  Snapshot
	samples int
	err     error
}

// WatchSnapshots starts a SnapshotWatch of the sessions named prefix….
func WatchSnapshots(q Querier, prefix string, every time.Duration) *SnapshotWatch {
	w := &SnapshotWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		sampleEvery(every, w.stop, func() bool {
			s, ok, err := OldestSnapshot(context.Background(), q, prefix)
			w.samples++
			if err != nil {
				w.err = err
				return false
			}
			if ok && s.Age > w.oldest.Age {
				w.oldest = s
			}
			return true
		})
	}()
	return w
}

// sampleEvery calls sample at once and then every interval, until stop is
// closed or sample returns false.
func sampleEvery(every time.Duration, stop <-chan struct{}, sample func() bool) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for sample() {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
	}
}

// Stop ends the watch and returns the oldest snapshot seen (a zero Age when
// none was held) and how many samples it took.
func (w *SnapshotWatch) Stop() (Snapshot, int, error) {
	close(w.stop)
	<-w.done
	return w.oldest, w.samples, w.err
}

// ExecQuerier is a pool or a connection.
type ExecQuerier interface {
	Querier
	Execer
}

// DeadRows is an application table whose rows were all deleted, to see
// whether VACUUM can remove them.
type DeadRows struct {
	q     ExecQuerier
	table string
}

// DeleteRows creates table in q's database with n rows and deletes them all.
// q must be a superuser's: the count after VACUUM uses pgstattuple.
func DeleteRows(ctx context.Context, q ExecQuerier, table string, n int) (DeadRows, error) {
	id := pgx.Identifier{table}.Sanitize()
	for _, stmt := range []string{
		`CREATE EXTENSION IF NOT EXISTS pgstattuple`,
		`CREATE TABLE ` + id + ` (id int PRIMARY KEY, body text) WITH (autovacuum_enabled = false)`,
		`INSERT INTO ` + id + ` SELECT g, repeat('x', 100) FROM generate_series(1, ` + fmt.Sprint(n) + `) g`,
		`DELETE FROM ` + id,
	} {
		if _, err := q.Exec(ctx, stmt); err != nil {
			return DeadRows{}, fmt.Errorf("dead rows: %s: %w", stmt, err)
		}
	}
	return DeadRows{q: q, table: table}, nil
}

// Vacuum runs VACUUM on the table and returns how many of its deleted rows
// it could not remove: those some snapshot may still see.
func (d DeadRows) Vacuum(ctx context.Context) (int64, error) {
	id := pgx.Identifier{d.table}.Sanitize()
	if _, err := d.q.Exec(ctx, `VACUUM `+id); err != nil {
		return 0, fmt.Errorf("vacuum %s: %w", d.table, err)
	}
	var dead int64
	err := d.q.QueryRow(ctx, `SELECT dead_tuple_count FROM pgstattuple($1::regclass)`, id).Scan(&dead)
	if err != nil {
		return 0, fmt.Errorf("pgstattuple %s: %w", d.table, err)
	}
	return dead, nil
}

// Horizon is what holds the database's vacuum horizon back the most, from
// whatever side: a session of the database (wlproj's or anyone's: a
// pg_dump, a session idle in a transaction), a walsender (a standby with
// hot_standby_feedback), a replication slot or a prepared transaction.
type Horizon struct {
	// Kind is "backend", "walsender", "slot" or "prepared".
	Kind string
	// Who names it: the session's application_name and pid, the slot's
	// name or the prepared transaction's gid.
	Who string
	// XIDAge is age(xmin): the transactions begun since the oldest it may
	// still see, the measure of how far back it holds vacuum.
	XIDAge int64
	// Age is how long it has been held: zero for a walsender and a slot,
	// whose xmin Postgres does not date.
	Age time.Duration
}

func (h Horizon) String() string {
	return fmt.Sprintf("%s %s (%d transactions, %s old)", h.Kind, h.Who, h.XIDAge, h.Age.Round(time.Millisecond))
}

// oldestHorizonSQL ranks every holder of an xmin that limits vacuum in
// this database by age(xmin). A backend of another database holds back
// only the shared catalogs, so only this database's count, and the
// sampler's own session is left out.
const oldestHorizonSQL = `
SELECT kind, who, xid_age, seconds FROM (
	SELECT CASE WHEN backend_type = 'walsender' THEN 'walsender' ELSE 'backend' END AS kind,
	       format('%s (pid %s)', coalesce(nullif(application_name, ''), backend_type), pid) AS who,
	       age(backend_xmin)::bigint AS xid_age,
	       CASE WHEN backend_type = 'walsender' THEN 0
	            ELSE extract(epoch FROM clock_timestamp() - coalesce(xact_start, query_start)) END::float8 AS seconds
	  FROM pg_stat_activity
	 WHERE backend_xmin IS NOT NULL AND pid <> pg_backend_pid()
	   AND (datname = current_database() OR backend_type = 'walsender')
	UNION ALL
	SELECT 'slot', slot_name::text, age(xmin)::bigint, 0 FROM pg_replication_slots WHERE xmin IS NOT NULL
	UNION ALL
	SELECT 'prepared', gid, age(transaction)::bigint, extract(epoch FROM clock_timestamp() - prepared)::float8
	  FROM pg_prepared_xacts WHERE database = current_database()
) holders ORDER BY xid_age DESC, seconds DESC LIMIT 1`

// OldestHorizon returns the holder of the oldest xmin in q's database,
// and false when nothing holds one. q must be a superuser's (or
// pg_read_all_stats') to see other roles' sessions.
func OldestHorizon(ctx context.Context, q Querier) (Horizon, bool, error) {
	var h Horizon
	var seconds float64
	err := q.QueryRow(ctx, oldestHorizonSQL).Scan(&h.Kind, &h.Who, &h.XIDAge, &seconds)
	if err == pgx.ErrNoRows {
		return Horizon{}, false, nil
	}
	if err != nil {
		return Horizon{}, false, fmt.Errorf("oldest horizon: %w", err)
	}
	h.Age = time.Duration(seconds * float64(time.Second))
	return h, true, nil
}

// TableStats is what the statistics say of a table's dead rows and
// vacuums (pg_stat_user_tables; a backend reports its counts at most a
// second after its transaction ends).
type TableStats struct {
	Live        int64 `json:"live"`
	Dead        int64 `json:"dead"`
	Autovacuums int64 `json:"autovacuums"`
	Vacuums     int64 `json:"vacuums"`
}

// Tables returns the statistics of the tables named, as the search path
// finds them, by name, a partitioned table's as the sum of its
// partitions'; a table that does not exist is left out.
func Tables(ctx context.Context, q Querier, names ...string) (map[string]TableStats, error) {
	var raw []byte
	err := q.QueryRow(ctx, `
		SELECT coalesce(json_object_agg(n, json_build_object('live', live, 'dead', dead,
		                'autovacuums', autovacuums, 'vacuums', vacuums)), '{}')
		  FROM (SELECT n, sum(s.n_live_tup) AS live, sum(s.n_dead_tup) AS dead,
		               sum(s.autovacuum_count) AS autovacuums, sum(s.vacuum_count) AS vacuums
		          FROM unnest($1::text[]) n
		         CROSS JOIN LATERAL (SELECT to_regclass(n) AS relid
		                             UNION SELECT relid FROM pg_partition_tree(to_regclass(n)) WHERE isleaf) p
		          JOIN pg_stat_user_tables s ON s.relid = p.relid
		         GROUP BY n) t`, names).Scan(&raw)
	if err != nil {
		return nil, fmt.Errorf("table statistics: %w", err)
	}
	stats := map[string]TableStats{}
	return stats, json.Unmarshal(raw, &stats)
}

// LockWaits is who of a program's sessions waits for a lock.
type LockWaits struct {
	// Waiting counts the sessions waiting for a lock (wait_event_type
	// Lock, or a lock not granted in pg_locks), the election's wait aside;
	// First names one of them.
	Waiting int
	First   string
	// Election counts the lock sessions waiting for the advisory lock: a
	// standby standing by, which is how it should wait, not a lock wait.
	Election int
}

// WaitingForLocks samples the lock waits of the sessions of q's database
// whose application_name starts with prefix; those whose name starts with
// election (leader.LockSessionName("")) and wait for an advisory lock are
// standbys, counted apart.
func WaitingForLocks(ctx context.Context, q Querier, prefix, election string) (LockWaits, error) {
	var w LockWaits
	err := q.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE NOT election), coalesce(min(who) FILTER (WHERE NOT election), ''),
		       count(*) FILTER (WHERE election)
		  FROM (SELECT format('%s (pid %s) on %s', application_name, pid, coalesce(wait_event, 'a lock')) AS who,
		               $2 <> '' AND starts_with(application_name, $2) AND wait_event = 'advisory' AS election
		          FROM pg_stat_activity
		         WHERE datname = current_database() AND starts_with(application_name, $1)
		           AND (wait_event_type = 'Lock' OR pid IN (SELECT pid FROM pg_locks WHERE NOT granted))) waits`,
		prefix, election).Scan(&w.Waiting, &w.First, &w.Election)
	if err != nil {
		return w, fmt.Errorf("lock waits: %w", err)
	}
	return w, nil
}

// Backlog counts the outbox's pending and processing rows, each through
// its partial index, and the queued rows no position has passed yet
// (outbox_queue_backlog, from schema 17 on: a queued row is never updated
// when it succeeds, so its status says nothing of it).
func Backlog(ctx context.Context, q Querier) (int64, error) {
	var queued bool
	if err := q.QueryRow(ctx, `SELECT to_regclass('outbox_queue_backlog') IS NOT NULL`).Scan(&queued); err != nil {
		return 0, fmt.Errorf("backlog: %w", err)
	}
	sql := `SELECT (SELECT count(*) FROM outbox_events WHERE status = 'pending')
	             + (SELECT count(*) FROM outbox_events WHERE status = 'processing')`
	if queued {
		sql += ` + (SELECT count(*) FROM outbox_queue_backlog)`
	}
	var n int64
	if err := q.QueryRow(ctx, sql).Scan(&n); err != nil {
		return 0, fmt.Errorf("backlog: %w", err)
	}
	return n, nil
}

// WaitRemoved runs Vacuum every 100 ms until it removes every deleted row
// or within passes, and returns how many it could not remove at the last
// try (with the timeout's error then).
func (d DeadRows) WaitRemoved(ctx context.Context, within time.Duration) (int64, error) {
	var left int64
	err := PollAt(ctx, 100*time.Millisecond, within, "VACUUM to remove "+d.table+"'s deleted rows",
		func(ctx context.Context) (bool, error) {
			var err error
			left, err = d.Vacuum(ctx)
			return err == nil && left == 0, err
		})
	return left, err
}
