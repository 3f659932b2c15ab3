package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// What an operator's overview reads besides the Snapshot: the replicas
// of a leader name, its leader, the work of the last hour, the stuck rows.
// Every query here reads the database, so any replica, leader or not, shows
// the same.

// ReplicaSession is the lock connection of one replica, seen in pg_locks
// and pg_stat_activity: the leader holds the lock, standbys wait for it.
type ReplicaSession struct {
	// ApplicationName is the session's application_name (the leader
	// package names it after the worker id).
	ApplicationName string
	Holding         bool
	// Since is when the session connected; zero if the database role may
	// not see it.
	Since time.Time
}

var replicasSQL = `
SELECT coalesce(a.application_name, ''), k.granted, a.backend_start
  FROM pg_locks k
  JOIN pg_stat_activity a ON a.pid = k.pid
 WHERE ` + lockOf("$1") + `
 ORDER BY k.granted DESC, a.backend_start, a.application_name`

// Replicas lists the sessions holding or waiting for the leader lock of
// name, the holder first.
func Replicas(ctx context.Context, db Querier, name string) ([]ReplicaSession, error) {
	rows, err := db.Query(ctx, replicasSQL, name)
	if err != nil {
		return nil, fmt.Errorf("replicas: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ReplicaSession, error) {
		var s ReplicaSession
		var since *time.Time
		err := r.Scan(&s.ApplicationName, &s.Holding, &since)
		if since != nil {
			s.Since = *since
		}
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("replicas: %w", err)
	}
	return out, nil
}

var leaderOfSQL = leaderSelect + `
 WHERE l.name = $1`

// LeaderOf reads the leader record of name; nil if no replica of that name
// ever led.
func LeaderOf(ctx context.Context, db Querier, name string) (*LeaderInfo, error) {
	var l LeaderInfo
	err := db.QueryRow(ctx, leaderOfSQL, name).Scan(&l.Name, &l.Holder, &l.Epoch, &l.AcquiredAt, &l.Active)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("leader of %s: %w", name, err)
	}
	return &l, nil
}

// Bucket counts the events acked done and the events that failed for good
// (still failed, or discarded since) in one interval.
type Bucket struct {
	At           time.Time
	Done, Failed int64
}

// activityStartSQL is the window's first bucket: buckets are aligned to
// the epoch, so successive reads agree. $1 is the bucket width and $2 the
// window, in seconds.
const activityStartSQL = `
SELECT date_bin(make_interval(secs => $1), now(), timestamptz 'epoch') - make_interval(secs => $2 - $1)`

// activityBucketSQL counts the acks of one bucket, walking
// outbox_events_done_idx, with the queued rows the positions confirmed in
// its minutes (outbox_done_by_minute: a bucket narrower than a minute
// counts a minute's in its first), and the terminal failures by the time of failure,
// walking the failed and discarded partial indexes.
const activityBucketSQL = `
SELECT (SELECT count(*) FROM outbox_events WHERE status = 'done' AND processed_at >= $1 AND processed_at < $2)
     + (SELECT coalesce(sum(done), 0) FROM outbox_done_by_minute WHERE minute >= $1 AND minute < $2)::bigint,
       (SELECT count(*) FROM outbox_events
         WHERE (status = 'failed' OR status = 'discarded') AND updated_at >= $1 AND updated_at < $2)`

// Activity counts the work of the last window in buckets of width, oldest
// first, every bucket present (the last one still filling). A done row
// pruned by the retention is no longer counted. Each bucket is a statement
// of its own: at 2,000 events/s an hour is 7 M acks, and counting them in
// one statement held its snapshot, and the database's vacuum horizon, for
// as long as that took.
func Activity(ctx context.Context, db Querier, window, width time.Duration) ([]Bucket, error) {
	if width <= 0 || window < width {
		return nil, fmt.Errorf("activity: window %s must hold at least one bucket of %s", window, width)
	}
	n := int(window / width)
	var start time.Time
	if err := db.QueryRow(ctx, activityStartSQL, width.Seconds(), float64(n)*width.Seconds()).Scan(&start); err != nil {
		return nil, fmt.Errorf("activity: %w", err)
	}
	buckets := make([]Bucket, n)
	for i := range buckets {
		b := &buckets[i]
		b.At = start.Add(time.Duration(i) * width)
		if err := db.QueryRow(ctx, activityBucketSQL, b.At, b.At.Add(width)).Scan(&b.Done, &b.Failed); err != nil {
			return nil, fmt.Errorf("activity: %w", err)
		}
	}
	return buckets, nil
}

// StuckRow is a processing row past its lease or the processing cap.
type StuckRow struct {
	ID                   int64
	Projection           string
	EntityType, EntityID string
	Attempts             int
	LockedBy             string
	ClaimToken           *int64
	LeaseUntil           *time.Time
	ProcessingStartedAt  *time.Time
}

const stuckSQL = `
SELECT * FROM (
  (SELECT id, projection, entity_type, entity_id, attempts, coalesce(locked_by, ''), claim_token,
          lease_until, processing_started_at
     FROM outbox_events
    WHERE status = 'processing' AND ` + stuckWhere + `
    ORDER BY id LIMIT $2)
  UNION ALL
  (SELECT b.id, b.projection, b.entity_type, b.entity_id, 0, coalesce(b.locked_by, ''),
          (SELECT p.epoch FROM outbox_positions p WHERE p.projection = b.projection),
          b.lease_until, b.processing_started_at
     FROM outbox_queue_backlog b
    WHERE b.in_flight AND ` + stuckWhere + `
    LIMIT $2)) s
 ORDER BY id
 LIMIT $2`

// Stuck lists up to limit stuck rows, lowest id first, with maxProcessing
// as in SnapshotOptions.
func Stuck(ctx context.Context, db Querier, maxProcessing time.Duration, limit int) ([]StuckRow, error) {
	rows, err := db.Query(ctx, stuckSQL, maxProcessing.Seconds(), limit)
	if err != nil {
		return nil, fmt.Errorf("stuck rows: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (StuckRow, error) {
		var s StuckRow
		err := r.Scan(&s.ID, &s.Projection, &s.EntityType, &s.EntityID, &s.Attempts, &s.LockedBy, &s.ClaimToken,
			&s.LeaseUntil, &s.ProcessingStartedAt)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("stuck rows: %w", err)
	}
	return out, nil
}
