package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// The outbox lives in the application's database, and vacuum of every table
// in it stops at the oldest transaction any session, standby, slot or
// prepared transaction still needs: the horizon. The outbox rewrites its
// rows at every claim and ack, so it is the first table to bloat when
// something holds the horizon back. ReadHorizon says who holds it and what
// it costs the outbox and the ledger so far.

// Kinds of horizon holder, as HorizonHolder.Kind and the metrics' kind label
// name them.
const (
	// HolderNone: no session, slot or prepared transaction holds an xmin.
	HolderNone = "none"
	// HolderBackend is a session of the outbox's database with an open
	// snapshot or transaction id: an idle-in-transaction session, a long
	// query, a pg_dump, or wlproj's own.
	HolderBackend = "backend"
	// HolderWalsender is a standby streaming without a replication slot,
	// with hot_standby_feedback on: its oldest query holds the primary back.
	HolderWalsender = "walsender"
	// HolderSlot is a replication slot with an xmin: a standby with
	// hot_standby_feedback through that slot, even while it is disconnected.
	HolderSlot = "replication_slot"
	// HolderPrepared is a prepared (two-phase) transaction nobody committed
	// or rolled back.
	HolderPrepared = "prepared_xact"
)

// Bases of Horizon.Age.
const (
	// AgeUnknown: Postgres shows this role no start time for the holder, and
	// no watch has seen it before.
	AgeUnknown = ""
	// AgeFromPostgres: the start of the holder's transaction as Postgres
	// reports it (xact_start, or when a transaction was prepared).
	AgeFromPostgres = "postgres"
	// AgeObserved: how long a HorizonWatch has seen the same holder with
	// the same xmin, a lower bound.
	AgeObserved = "observed"
)

// wlprojApplicationPrefix starts the application_name of every wlproj
// session: the replicas' pools, their lock connections, migrate and the CLI.
const wlprojApplicationPrefix = "wlproj"

// HorizonHolder is whoever holds the oldest xmin of the outbox's database.
type HorizonHolder struct {
	Kind string
	// PID is the backend or walsender, or the walsender of an active slot;
	// zero for a prepared transaction or an inactive slot.
	PID int32
	// Application is the session's application_name.
	Application string
	// State is the session's state (active, idle in transaction, ...), which
	// Postgres shows only to the session's own role and pg_read_all_stats;
	// "active" or "inactive" for a slot, "prepared" for a prepared
	// transaction; empty when hidden.
	State string
	// Name is the slot's name, or the prepared transaction's gid.
	Name string
	// Xid is the oldest transaction id it holds (backend_xmin, or its own
	// transaction id when that is older, or the slot's xmin, or the prepared
	// transaction), and XidAge how many transactions ago that was: age(xid).
	Xid    int64
	XidAge int64
	// Since is when its transaction began, when Postgres shows it: a
	// backend's xact_start (only to its own role and pg_read_all_stats), a
	// prepared transaction's prepare time. Zero otherwise.
	Since time.Time
}

// Wlproj says whether the holder is one of wlproj's own sessions.
func (h HorizonHolder) Wlproj() bool {
	return (h.Kind == HolderBackend || h.Kind == HolderWalsender) && strings.HasPrefix(h.Application, wlprojApplicationPrefix)
}

// TableVacuum is a table's vacuum statistics (pg_stat_user_tables).
type TableVacuum struct {
	Table string
	// Live and Dead are n_live_tup and n_dead_tup: estimates the statistics
	// collector keeps, read without touching the table.
	Live, Dead int64
	// LastAutovacuum is when autovacuum last finished on it; zero if never
	// since the statistics were reset.
	LastAutovacuum time.Time
}

// Horizon is the vacuum horizon of the outbox's database at one moment.
type Horizon struct {
	// Holder is the oldest holder; nil when nothing holds an xmin.
	Holder *HorizonHolder
	// Age is how long Holder has held it, on the basis AgeBasis says.
	Age      time.Duration
	AgeBasis string
	// Tables are outbox_events and the ledger outbox_ledger, those of
	// them that exist.
	Tables []TableVacuum
	// TakenAt is the database's clock at the reading.
	TakenAt time.Time
}

// Kind is the holder's kind, HolderNone without one.
func (h Horizon) Kind() string {
	if h.Holder == nil {
		return HolderNone
	}
	return h.Holder.Kind
}

// horizonSQL reads the oldest xmin that holds back vacuum of the ordinary
// tables of this database, from catalog views only. It follows what
// Postgres counts for a data table's horizon (ComputeXidHorizons): sessions
// of this database, walsenders (no database) that apply a standby's
// hot_standby_feedback, replication slots' xmin, and this database's
// prepared transactions. A slot's catalog_xmin holds back only the system
// catalogs, so it is left out. Autovacuum workers, the only sessions of a
// database without a user, are left out too: a lazy VACUUM's snapshot holds
// back no other vacuum. Every column but the session's state and start is
// visible to any role, so the runtime role sees every holder.
const horizonSQL = `
WITH holders AS (
    SELECT CASE WHEN a.datname IS NULL THEN 'walsender' ELSE 'backend' END AS kind,
           a.pid, coalesce(a.application_name, '') AS application, coalesce(a.state, '') AS state, '' AS name,
           CASE WHEN a.backend_xid IS NOT NULL AND (a.backend_xmin IS NULL OR age(a.backend_xid) > age(a.backend_xmin))
                THEN a.backend_xid ELSE a.backend_xmin END AS xid,
           a.xact_start AS since
      FROM pg_stat_activity a
     WHERE (a.datname = current_database() OR a.datname IS NULL)
       AND a.usesysid IS NOT NULL
       AND a.pid <> pg_backend_pid()
       AND (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL)
    UNION ALL
    SELECT 'replication_slot', coalesce(s.active_pid, 0), '', CASE WHEN s.active THEN 'active' ELSE 'inactive' END,
           s.slot_name::text, s.xmin, NULL
      FROM pg_replication_slots s
     WHERE s.xmin IS NOT NULL
    UNION ALL
    SELECT 'prepared_xact', 0, '', 'prepared', p.gid, p.transaction, p.prepared
      FROM pg_prepared_xacts p
     WHERE p.database = current_database()
)
SELECT kind, pid, application, state, name, xid::text::bigint, age(xid), since, now()
  FROM holders
 ORDER BY age(xid) DESC, since NULLS LAST, pid
 LIMIT 1`

// vacuumStatsSQL reads the statistics of the outbox and the ledger through
// the functions behind pg_stat_user_tables, without its joins; the
// ledger's are the sum of its partitions' (a partitioned table has none of
// its own), and so are the outbox's.
const vacuumStatsSQL = `
SELECT t.name, sum(coalesce(pg_stat_get_live_tuples(r.oid), 0))::bigint,
       sum(coalesce(pg_stat_get_dead_tuples(r.oid), 0))::bigint, max(pg_stat_get_last_autovacuum_time(r.oid))
  FROM (VALUES (1, 'outbox_events', ARRAY['outbox_events', 'outbox_events_0', 'outbox_events_1', 'outbox_events_2']),
               (2, 'outbox_ledger', ARRAY['outbox_ledger_0', 'outbox_ledger_1', 'outbox_ledger_2'])) AS t(n, name, rels)
 CROSS JOIN LATERAL (SELECT to_regclass(rel) AS oid FROM unnest(t.rels) rel) r
 WHERE r.oid IS NOT NULL
 GROUP BY t.n, t.name
 ORDER BY t.n`

// ReadHorizon reads the horizon of db's database. Its Age is Postgres's
// when Postgres shows the holder's start, else unknown (a HorizonWatch
// fills it in).
func ReadHorizon(ctx context.Context, db Querier) (Horizon, error) {
	var h Horizon
	var hd HorizonHolder
	var since *time.Time
	err := db.QueryRow(ctx, horizonSQL).
		Scan(&hd.Kind, &hd.PID, &hd.Application, &hd.State, &hd.Name, &hd.Xid, &hd.XidAge, &since, &h.TakenAt)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		if err := db.QueryRow(ctx, `SELECT now()`).Scan(&h.TakenAt); err != nil {
			return h, fmt.Errorf("horizon: %w", err)
		}
	case err != nil:
		return h, fmt.Errorf("horizon: %w", err)
	default:
		if since != nil {
			hd.Since = *since
			h.Age, h.AgeBasis = max(h.TakenAt.Sub(hd.Since), 0), AgeFromPostgres
		}
		h.Holder = &hd
	}
	h.Tables, err = readVacuumStats(ctx, db)
	return h, err
}

func readVacuumStats(ctx context.Context, db Querier) ([]TableVacuum, error) {
	rows, err := db.Query(ctx, vacuumStatsSQL)
	if err != nil {
		return nil, fmt.Errorf("vacuum statistics: %w", err)
	}
	tables, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (TableVacuum, error) {
		var t TableVacuum
		var last *time.Time
		err := r.Scan(&t.Table, &t.Live, &t.Dead, &last)
		if last != nil {
			t.LastAutovacuum = *last
		}
		return t, err
	})
	if err != nil {
		return nil, fmt.Errorf("vacuum statistics: %w", err)
	}
	return tables, nil
}

// HorizonWatch reads the horizon again and again (the metrics poller, the
// console) and remembers since when it has seen the same holder with the
// same xid, so that a holder whose start Postgres does not show this role
// (another role's session, a standby, a slot) still gets an age: the time
// it has been seen, a lower bound that starts over with the process. Safe
// for concurrent use; the zero value is ready.
type HorizonWatch struct {
	mu    sync.Mutex
	seen  HorizonHolder
	since time.Time
}

// Read is ReadHorizon with the watch's memory.
func (w *HorizonWatch) Read(ctx context.Context, db Querier) (Horizon, error) {
	h, err := ReadHorizon(ctx, db)
	if err != nil {
		return h, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if h.Holder == nil {
		w.seen, w.since = HorizonHolder{}, time.Time{}
		return h, nil
	}
	if !sameHolder(w.seen, *h.Holder) || w.since.IsZero() {
		w.seen, w.since = *h.Holder, h.TakenAt
	}
	if h.AgeBasis == AgeUnknown {
		h.Age, h.AgeBasis = max(h.TakenAt.Sub(w.since), 0), AgeObserved
	}
	return h, nil
}

// sameHolder is true when a and b hold the same xid from the same place.
func sameHolder(a, b HorizonHolder) bool {
	return a.Kind == b.Kind && a.PID == b.PID && a.Name == b.Name && a.Xid == b.Xid
}

// String names the holder for an operator: its kind, and the session,
// slot or prepared transaction to act on.
func (h HorizonHolder) String() string {
	state := ""
	if h.State != "" {
		state = ", " + h.State
	}
	switch h.Kind {
	case HolderBackend, HolderWalsender:
		who := "session"
		if h.Kind == HolderWalsender {
			who = "standby's walsender (hot_standby_feedback)"
		}
		if h.Wlproj() {
			who = "wlproj " + who
		}
		return fmt.Sprintf("%s %q (pid %d%s)", who, h.Application, h.PID, state)
	case HolderSlot:
		return fmt.Sprintf("replication slot %q (%s)", h.Name, h.State)
	case HolderPrepared:
		return fmt.Sprintf("prepared transaction %q", h.Name)
	}
	return h.Kind
}
