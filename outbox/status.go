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
	// (not counted when that is zero): what the rotation is late on.
	DoneOverRetention int64
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
// with inserts; a revived row waits from its revival, pendingSince). One statement, so the numbers agree with each other.
var snapshotSQL = `
WITH queued AS MATERIALIZED (
  SELECT count(*) FILTER (WHERE NOT in_flight) AS pending, count(*) FILTER (WHERE in_flight) AS processing,
         count(*) FILTER (WHERE in_flight AND ` + stuckWhere + `) AS stuck,
         min(created_at) FILTER (WHERE NOT in_flight) AS oldest, count(*) AS backlog
    FROM outbox_queue_backlog)
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
    least((SELECT min(processed_at) FROM outbox_events WHERE status = 'done'),
          (SELECT min(f.created_at) FROM outbox_queue_heads h CROSS JOIN LATERAL (
             SELECT created_at FROM outbox_events WHERE status = 'queued' AND projection = h.projection
              ORDER BY xid, id LIMIT 1) f)),
    CASE WHEN $3::float8 > 0 THEN (SELECT count(*) FROM outbox_events
          WHERE status = 'done' AND processed_at < now() - make_interval(secs => $3::float8))
        + (SELECT count(*) FROM outbox_events
          WHERE status = 'queued' AND created_at < now() - make_interval(secs => $3::float8)) ELSE 0 END`

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
		Scan(&pending, &processing, &failed, &discarded, &stuck, &oldest, &done, &s.TakenAt, &oldestDone, &s.DoneOverRetention)
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
