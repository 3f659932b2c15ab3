package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
)

// topFailedReasons is how many (projection, reason) pairs a Snapshot keeps.
const topFailedReasons = 10

// Snapshot is the state of the outbox at one moment, for `wlproj status` and
// the gauges.
type Snapshot struct {
	// Counts has all four statuses as keys. The done count is an estimate
	// unless DoneExact (see SnapshotOptions.ExactDone).
	Counts    map[string]int64
	DoneExact bool
	// Lag is the number of pending rows, due or waiting for a retry.
	Lag int64
	// OldestPendingAge is how long ago the oldest pending row was inserted;
	// zero when nothing is pending.
	OldestPendingAge time.Duration
	// InFlight is the number of processing rows.
	InFlight int64
	// Stuck counts processing rows past their lease or past the
	// max-processing cap; the leader's reclaimer returns them to pending.
	Stuck            int64
	TopFailedReasons []ReasonCount
	// Leader is the newest leader record, nil if no replica ever led.
	Leader *LeaderInfo
	// TakenAt is the database's clock when the counts were read.
	TakenAt time.Time
}

// ReasonCount is the number of failed rows of one projection and reason.
type ReasonCount struct {
	Projection string
	Reason     string
	Count      int64
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
}

// Every count except done walks one of the partial indexes, so its cost
// follows the backlog, failed set or in-flight set, never the done history.
// The oldest pending row is the lowest pending id (ids grow with inserts),
// one index probe. One statement, so the numbers agree with each other.
const snapshotSQL = `
SELECT
    (SELECT count(*) FROM outbox_events WHERE status = 'pending'),
    (SELECT count(*) FROM outbox_events WHERE status = 'processing'),
    (SELECT count(*) FROM outbox_events WHERE status = 'failed'),
    (SELECT count(*) FROM outbox_events WHERE status = 'processing'
        AND (lease_until < now()
             OR ($1::float8 > 0 AND processing_started_at < now() - make_interval(secs => $1::float8)))),
    (SELECT created_at FROM outbox_events WHERE status = 'pending' ORDER BY id LIMIT 1),
    CASE WHEN $2::bool THEN (SELECT count(*) FROM outbox_events WHERE status = 'done')
         ELSE greatest(pg_stat_get_live_tuples('outbox_events'::regclass), 0) END,
    now()`

const topFailedSQL = `
SELECT projection, coalesce(error_reason, ''), count(*)
  FROM outbox_events
 WHERE status = 'failed'
 GROUP BY 1, 2
 ORDER BY 3 DESC, 1, 2
 LIMIT $1`

// The leader holds pg_advisory_lock(hashtextextended(name, 0)) on its lock
// connection (see package leader); a bigint key shows in pg_locks split into
// classid (high half) and objid (low half) with objsubid 1.
const leaderSQL = `
SELECT l.name, l.holder, l.epoch, l.acquired_at,
       EXISTS (SELECT 1 FROM pg_locks k
                WHERE k.locktype = 'advisory' AND k.granted AND k.objsubid = 1
                  AND k.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                  AND ((k.classid::bigint << 32) | k.objid::bigint) = hashtextextended(l.name, 0)) AS active
  FROM outbox_leader l
 ORDER BY active DESC, l.acquired_at DESC
 LIMIT 1`

// TakeSnapshot reads the outbox state with an estimated done count.
func TakeSnapshot(ctx context.Context, db Querier, maxProcessing time.Duration) (Snapshot, error) {
	return TakeSnapshotWith(ctx, db, SnapshotOptions{MaxProcessing: maxProcessing})
}

// TakeSnapshotWith reads the outbox state.
func TakeSnapshotWith(ctx context.Context, db Querier, opts SnapshotOptions) (Snapshot, error) {
	s := Snapshot{DoneExact: opts.ExactDone}
	var pending, processing, failed, stuck, done int64
	var oldest *time.Time
	err := db.QueryRow(ctx, snapshotSQL, opts.MaxProcessing.Seconds(), opts.ExactDone).
		Scan(&pending, &processing, &failed, &stuck, &oldest, &done, &s.TakenAt)
	if err != nil {
		return s, fmt.Errorf("snapshot counts: %w", err)
	}
	if !opts.ExactDone {
		// The live-tuple statistic includes every status and lags behind by
		// up to a second or so; what is left after the exact counts is done.
		done = max(done-pending-processing-failed, 0)
	}
	s.Counts = map[string]int64{
		StatusPending:    pending,
		StatusProcessing: processing,
		StatusDone:       done,
		StatusFailed:     failed,
	}
	s.Lag, s.InFlight, s.Stuck = pending, processing, stuck
	if oldest != nil {
		s.OldestPendingAge = max(s.TakenAt.Sub(*oldest), 0)
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

	var l LeaderInfo
	err = db.QueryRow(ctx, leaderSQL).Scan(&l.Name, &l.Holder, &l.Epoch, &l.AcquiredAt, &l.Active)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return s, fmt.Errorf("snapshot leader: %w", err)
	default:
		s.Leader = &l
	}
	return s, nil
}
