package harness

import (
	"context"
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
	Query       string
	// Age is how long the snapshot has been held: since the transaction
	// began, or the statement for one outside a transaction.
	Age time.Duration
}

func (s Snapshot) String() string {
	return fmt.Sprintf("%s (pid %d, %s, %s old): %.120q", s.Application, s.PID, s.State, s.Age.Round(time.Millisecond), s.Query)
}

// OldestSnapshot returns the oldest snapshot held in q's database by a
// session whose application_name starts with prefix (every wlproj session's
// starts with "wlproj"), and false when none holds one.
func OldestSnapshot(ctx context.Context, q Querier, prefix string) (Snapshot, bool, error) {
	var s Snapshot
	var seconds float64
	err := q.QueryRow(ctx, `
		SELECT pid, application_name, coalesce(state, ''), left(coalesce(query, ''), 300),
		       extract(epoch FROM clock_timestamp() - coalesce(xact_start, query_start))
		  FROM pg_stat_activity
		 WHERE datname = current_database() AND pid <> pg_backend_pid()
		   AND backend_xmin IS NOT NULL AND starts_with(application_name, $1)
		 ORDER BY coalesce(xact_start, query_start) LIMIT 1`, prefix).
		Scan(&s.PID, &s.Application, &s.State, &s.Query, &seconds)
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
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			s, ok, err := OldestSnapshot(context.Background(), q, prefix)
			w.samples++
			if err != nil {
				w.err = err
				return
			}
			if ok && s.Age > w.oldest.Age {
				w.oldest = s
			}
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return w
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
