package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/wlproj/wlproj/internal/bounds"
)

// Querier is what *pgxpool.Pool, *pgx.Conn and pgx.Tx have in common, so the
// read paths run on a pool or inside a caller's transaction alike.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Statuses of an outbox row, as stored in outbox_events.status.
const (
	StatusPending    = "pending"
	StatusProcessing = "processing"
	StatusDone       = "done"
	StatusFailed     = "failed"
	StatusDiscarded  = "discarded"
)

// topFailedReasons is how many (projection, reason) pairs a Snapshot keeps.
const topFailedReasons = 10

// Snapshot is the state of the outbox at one moment, for `wlproj status` and
// the gauges.
type Snapshot struct {
	// Counts has every status as a key. The done count is an estimate
	// unless DoneExact (see SnapshotOptions.ExactDone).
	Counts    map[string]int64
	DoneExact bool
	// Lag is the number of pending rows, due or waiting for a retry.
	Lag int64
	// OldestPendingAge is how long the oldest pending row has waited: since
	// its insert, or since the replay or restore that revived it;
	// zero when nothing is pending.
	OldestPendingAge time.Duration
	// InFlight is the number of processing rows.
	InFlight int64
	// Stuck counts processing rows past their lease or past the
	// max-processing cap; the leader's reclaimer returns them to pending.
	Stuck            int64
	TopFailedReasons []ReasonCount
	// OldestDoneAge is how long ago the oldest done row was acked; the
	// leader's pruner keeps it near the retention.
	OldestDoneAge time.Duration
	// DoneOverRetention counts done rows older than SnapshotOptions.Retention
	// (not counted when that is zero): what the rotation is late on. The
	// count stops at RetentionCountCap rows of each kind (done rows, each
	// projection's queued rows); DoneOverRetentionCapped says it did.
	DoneOverRetention       int64
	DoneOverRetentionCapped bool
	// Leader is the newest leader record, nil if no replica ever led.
	Leader *LeaderInfo
	// Projections is the lag and state of each projection, by name; only
	// with SnapshotOptions.Projections.
	Projections []ProjectionLag
	// Rebuilds are the rebuilds the leader writes both indexes of, with
	// whether the current leader confirmed it does; only with
	// SnapshotOptions.Rebuilds.
	Rebuilds []RebuildWrite
	// TakenAt is the database's clock when the counts were read.
	TakenAt time.Time
}

// ReasonCount is the number of failed rows of one projection and reason.
type ReasonCount struct {
	Projection string
	Reason     string
	Count      int64
}

// ProjectionLag is one projection's backlog and whether it is paused.
type ProjectionLag struct {
	Projection string
	// Pending counts its pending rows, due or waiting for a retry.
	Pending          int64
	OldestPendingAge time.Duration
	// State is its outbox_projection_state row: Paused, by whom, why and
	// since when. Zero for a projection never paused.
	State ProjectionState
}

// LeaderInfo is a row of outbox_leader.
type LeaderInfo struct {
	Name       string
	Holder     string
	Epoch      int64
	AcquiredAt time.Time
	// Active says whether some session holds the leader's advisory lock right
	// now; the row alone outlives a leader that died or stepped down.
	Active bool
}

// SnapshotOptions tunes TakeSnapshotWith.
type SnapshotOptions struct {
	// MaxProcessing is the cap after which a processing row counts as stuck
	// even with a live lease. Zero counts only expired leases.
	MaxProcessing time.Duration
	// ExactDone counts done rows exactly, which reads the whole table. By
	// default the done count is the planner's live-row estimate minus the
	// exact counts of the other statuses, which is free.
	ExactDone bool
	// Retention, when set, counts the done rows older than it.
	Retention time.Duration
	// Projections, when set, adds Snapshot.Projections: these names, and
	// any other projection with pending rows or a state row. Its count
	// reads every pending row, so the gauges leave it out.
	Projections []string
	// Rebuilds, when set, adds Snapshot.Rebuilds.
	Rebuilds bool
}

// stuckWhere is true of a processing row that is stuck: its lease expired,
// or it has been processing longer than $1 seconds (when positive).
const stuckWhere = `(lease_until < now()
             OR ($1::float8 > 0 AND processing_started_at < now() - make_interval(secs => $1::float8)))`

// Every count except done walks one of the partial indexes, so its cost
// follows the backlog, failed set or in-flight set, never the done history.
// The oldest pending row is found among the lowest pending ids (ids grow
// with inserts; a revived row waits from its revival, pendingSince). One
// statement, so the numbers agree with each other.
//
// The oldest queued row of each projection is its first in (xid, id)
// order, read range by range of visibleRangesSQL so that an open
// transaction's uncommitted rows are stepped over, not walked. The queued
// rows past the retention ($3 seconds) are counted only when that first row
// is past it, among the first GaugeCountCap rows: a walk of every queued
// row the retention keeps cost 100-150 ms at 1 M rows to count none.
// Each count stops at RetentionCountCap.
var snapshotSQL = `
WITH queued AS MATERIALIZED (
  SELECT count(*) FILTER (WHERE NOT in_flight) AS pending, count(*) FILTER (WHERE in_flight) AS processing,
         count(*) FILTER (WHERE in_flight AND ` + stuckWhere + `) AS stuck,
         min(created_at) FILTER (WHERE NOT in_flight) AS oldest, count(*) AS backlog
    FROM outbox_queue_backlog),
ranges AS MATERIALIZED (` + visibleRangesSQL + `),
heads AS MATERIALIZED (
  SELECT h.projection, f.created_at AS first_at,
         CASE WHEN $3::float8 > 0 AND f.created_at < now() - make_interval(secs => $3::float8) THEN (
           SELECT count(*) FILTER (WHERE w.created_at < now() - make_interval(secs => $3::float8)) FROM (
             SELECT q.created_at FROM ranges r CROSS JOIN LATERAL (` + queuedInRangeSQL + `
                 LIMIT ` + strconv.Itoa(RetentionCountCap) + `) q
              ORDER BY r.before_xid, q.xid, q.id LIMIT ` + strconv.Itoa(RetentionCountCap) + `) w) ELSE 0 END AS past
    FROM outbox_queue_heads h
    LEFT JOIN LATERAL (SELECT q.created_at FROM ranges r CROSS JOIN LATERAL (` + queuedInRangeSQL + ` LIMIT 1) q
                        ORDER BY r.before_xid LIMIT 1) f ON true),
done_past AS MATERIALIZED (
  SELECT count(*) AS n FROM (SELECT 1 FROM outbox_events
   WHERE $3::float8 > 0 AND status = 'done' AND processed_at < now() - make_interval(secs => $3::float8)
   LIMIT ` + strconv.Itoa(RetentionCountCap) + `) d)
SELECT
    (SELECT count(*) FROM outbox_events WHERE status = 'pending') + (SELECT pending FROM queued),
    (SELECT count(*) FROM outbox_events WHERE status = 'processing') + (SELECT processing FROM queued),
    (SELECT count(*) FROM outbox_events WHERE status = 'failed'),
    (SELECT count(*) FROM outbox_events WHERE status = 'discarded'),
    (SELECT count(*) FROM outbox_events WHERE status = 'processing' AND ` + stuckWhere + `) + (SELECT stuck FROM queued),
    least((SELECT min(since) FROM (SELECT ` + pendingSince + ` AS since FROM outbox_events
      WHERE status = 'pending' ORDER BY id LIMIT ` + strconv.Itoa(GaugeCountCap) + `) head), (SELECT oldest FROM queued)),
    CASE WHEN $2::bool THEN (SELECT count(*) FROM outbox_events WHERE status = 'done')
                            + (SELECT count(*) FROM outbox_events WHERE status = 'queued') - (SELECT backlog FROM queued)
         ELSE (SELECT greatest(sum(pg_stat_get_live_tuples(relid)), 0)::bigint FROM pg_partition_tree('outbox_events')) END,
    now(),
    least((SELECT min(processed_at) FROM outbox_events WHERE status = 'done'), (SELECT min(first_at) FROM heads)),
    (SELECT n FROM done_past) + (SELECT coalesce(sum(past), 0) FROM heads)::bigint,
    (SELECT n FROM done_past) >= ` + strconv.Itoa(RetentionCountCap) + ` OR EXISTS (SELECT 1 FROM heads WHERE past >= ` +
	strconv.Itoa(RetentionCountCap) + `)`

// RetentionCountCap is where status stops counting the rows past the
// retention, of each kind (done rows, each projection's queued rows): any
// number of them says the rotation is late, and a count of the rows of a
// rotation weeks late would hold status's snapshot for seconds. The walk
// stops after this many rows along outbox_events_queued_idx, in order, a
// plan the small limit keeps whatever the statistics say.
const RetentionCountCap = 1_000

// visibleRangesSQL is the (xid, id) ranges whose queued rows the statement
// can see, in order: split at each transaction in progress in its snapshot
// (pg_current_snapshot's xip list), whose rows it cannot see, and ending at
// the snapshot's xmax, or past the session's own transaction, whose rows
// it sees, when that began later. A range holds the rows above (after_xid,
// after_id) with an xid below before_xid: one index probe per transaction
// in progress, instead of a heap visit per uncommitted row (an open
// producer transaction of 200k rows cost each walk 5,400 buffers).
// Migration 00026's backlog function has the same ranges; this copy keeps
// status running on schema 21.
const visibleRangesSQL = `
  SELECT coalesce(lag(x) OVER w, '0'::xid8) AS after_xid,
         CASE WHEN lag(x) OVER w IS NULL THEN -9223372036854775808 ELSE 9223372036854775807 END AS after_id,
         x AS before_xid
    FROM (SELECT x FROM pg_snapshot_xip(pg_current_snapshot()) x
          UNION ALL
          SELECT CASE WHEN pg_current_xact_id_if_assigned() >= pg_snapshot_xmax(pg_current_snapshot())
                      THEN '18446744073709551615'::xid8 ELSE pg_snapshot_xmax(pg_current_snapshot()) END) stops
  WINDOW w AS (ORDER BY x)`

// queuedInRangeSQL walks projection h's queued rows in range r of
// visibleRangesSQL, in (xid, id) order along outbox_events_queued_idx.
const queuedInRangeSQL = `
               SELECT q.xid, q.id, q.created_at FROM outbox_events q
                WHERE q.status = 'queued' AND q.projection = h.projection
                  AND (q.xid, q.id) > (r.after_xid, r.after_id) AND q.xid < r.before_xid
                ORDER BY q.xid, q.id`

const topFailedSQL = `
SELECT projection, coalesce(error_reason, ''), count(*)
  FROM outbox_events
 WHERE status = 'failed'
 GROUP BY 1, 2
 ORDER BY 3 DESC, 1, 2
 LIMIT $1`

// The leader holds LockSQL's lock on its lock connection; a bigint key shows
// in pg_locks split into classid and objid with objsubid 1.
var leaderSelect = `
SELECT l.name, l.holder, l.epoch, l.acquired_at,
       EXISTS (SELECT 1 FROM pg_locks k
                WHERE k.locktype = 'advisory' AND k.granted AND ` + lockOf("l.name") + `) AS active
  FROM outbox_leader l`

var leaderSQL = leaderSelect + `
 ORDER BY active DESC, l.acquired_at DESC
 LIMIT 1`

// lockOf is true of a pg_locks row k that is the leader lock of name, an
// SQL expression.
func lockOf(name string) string {
	return `k.locktype = 'advisory' AND k.objsubid = 1
                  AND k.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                  AND ((k.classid::bigint << 32) | k.objid::bigint) = ` + fmt.Sprintf(lockKey, name)
}

// MaxProcessingDefault is how long a row may stay in processing, whatever
// its lease, before it counts as stuck: the reclaim takes it back and the
// status, the console and the gauges count it. consume.Config, the console,
// health and the CLI take it from here.
const MaxProcessingDefault = 300 * time.Second

// MaxProcessingRange is what the stuck cap accepts.
var MaxProcessingRange = bounds.Range[time.Duration]{Min: time.Second, Max: 24 * time.Hour}

// TakeSnapshot reads the outbox state with an estimated done count.
func TakeSnapshot(ctx context.Context, db Querier, maxProcessing time.Duration) (Snapshot, error) {
	return TakeSnapshotWith(ctx, db, SnapshotOptions{MaxProcessing: maxProcessing})
}

// TakeSnapshotWith reads the outbox state.
func TakeSnapshotWith(ctx context.Context, db Querier, opts SnapshotOptions) (Snapshot, error) {
	s := Snapshot{DoneExact: opts.ExactDone}
	var pending, processing, failed, discarded, stuck, done int64
	var oldest, oldestDone *time.Time
	err := db.QueryRow(ctx, snapshotSQL, opts.MaxProcessing.Seconds(), opts.ExactDone, opts.Retention.Seconds()).
		Scan(&pending, &processing, &failed, &discarded, &stuck, &oldest, &done, &s.TakenAt, &oldestDone, &s.DoneOverRetention,
			&s.DoneOverRetentionCapped)
	if err != nil {
		return s, fmt.Errorf("snapshot counts: %w", err)
	}
	if !opts.ExactDone {
		// The live-tuple statistic includes every status and lags behind by
		// up to a second or so; what is left after the exact counts is done.
		done = max(done-pending-processing-failed-discarded, 0)
	}
	s.Counts = map[string]int64{
		StatusPending:    pending,
		StatusProcessing: processing,
		StatusDone:       done,
		StatusFailed:     failed,
		StatusDiscarded:  discarded,
	}
	s.Lag, s.InFlight, s.Stuck = pending, processing, stuck
	if oldest != nil {
		s.OldestPendingAge = max(s.TakenAt.Sub(*oldest), 0)
	}
	if oldestDone != nil {
		s.OldestDoneAge = max(s.TakenAt.Sub(*oldestDone), 0)
	}

	rows, err := db.Query(ctx, topFailedSQL, topFailedReasons)
	if err != nil {
		return s, fmt.Errorf("snapshot failed reasons: %w", err)
	}
	s.TopFailedReasons, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (ReasonCount, error) {
		var rc ReasonCount
		err := r.Scan(&rc.Projection, &rc.Reason, &rc.Count)
		return rc, err
	})
	if err != nil {
		return s, fmt.Errorf("snapshot failed reasons: %w", err)
	}

	if opts.Projections != nil {
		if s.Projections, err = projectionLags(ctx, db, opts.Projections, s.TakenAt); err != nil {
			return s, err
		}
	}

	if opts.Rebuilds {
		if s.Rebuilds, err = RebuildWrites(ctx, db); err != nil {
			return s, err
		}
	}

	s.Leader, err = readLeader(ctx, db)
	return s, err
}

// readLeader is the newest leader record, nil if no replica ever led.
func readLeader(ctx context.Context, db Querier) (*LeaderInfo, error) {
	var l LeaderInfo
	err := db.QueryRow(ctx, leaderSQL).Scan(&l.Name, &l.Holder, &l.Epoch, &l.AcquiredAt, &l.Active)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("snapshot leader: %w", err)
	}
	return &l, nil
}

// pendingByProjectionSQL walks the pending partial index and reads each
// row's projection: its cost follows the backlog.
var pendingByProjectionSQL = `
SELECT projection, sum(n)::bigint, min(since) FROM (
  SELECT projection, count(*) AS n, min(` + pendingSince + `) AS since FROM outbox_events WHERE status = 'pending' GROUP BY projection
  UNION ALL
  SELECT projection, count(*), min(created_at) FROM outbox_queue_backlog WHERE NOT in_flight GROUP BY projection) c
 GROUP BY projection`

// projectionLags joins the pending counts with the state rows, for known
// and every other projection that shows up, sorted by name.
func projectionLags(ctx context.Context, db Querier, known []string, now time.Time) ([]ProjectionLag, error) {
	byName := map[string]*ProjectionLag{}
	get := func(name string) *ProjectionLag {
		if byName[name] == nil {
			byName[name] = &ProjectionLag{Projection: name, State: ProjectionState{Projection: name}}
		}
		return byName[name]
	}
	for _, name := range known {
		get(name)
	}
	rows, err := db.Query(ctx, pendingByProjectionSQL)
	if err != nil {
		return nil, fmt.Errorf("snapshot projections: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var n int64
		var oldest time.Time
		if err := rows.Scan(&name, &n, &oldest); err != nil {
			return nil, fmt.Errorf("snapshot projections: %w", err)
		}
		p := get(name)
		p.Pending, p.OldestPendingAge = n, max(now.Sub(oldest), 0)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("snapshot projections: %w", err)
	}
	states, err := ProjectionStates(ctx, db)
	if err != nil {
		return nil, err
	}
	for _, st := range states {
		get(st.Projection).State = st
	}
	out := make([]ProjectionLag, 0, len(byName))
	for _, p := range byName {
		out = append(out, *p)
	}
	slices.SortFunc(out, func(a, b ProjectionLag) int { return strings.Compare(a.Projection, b.Projection) })
	return out, nil
}
