package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// pruneDoneSQL deletes one batch of done rows acked before the cutoff, oldest
// ack first (outbox_events_done_idx). Done is terminal and no leader writes
// it again, so a deposed leader pruning too changes nothing that matters:
// no fencing guard. SKIP LOCKED leaves rows an operator is reading alone.
// The batch's ids go to the DELETE as an array, so that it probes the
// primary key: an IN let the planner hash-join the batch against a
// sequential scan of the table (99 ms a batch at 100k rows).
const pruneDoneSQL = `
WITH gone AS (
  DELETE FROM outbox_events
   WHERE id = ANY(ARRAY(SELECT id FROM outbox_events
                 WHERE status = 'done' AND processed_at < now() - make_interval(secs => @retention_secs)
                 ORDER BY processed_at LIMIT @batch
                 FOR UPDATE SKIP LOCKED))
     AND status = 'done'
  RETURNING projection
)
SELECT projection, count(*) FROM gone GROUP BY projection`

// pruneQueuedSQL deletes one batch of queued rows older than the cutoff
// that every position has passed: per projection, those its confirmed
// batch's first snapshot sees committed, oldest first along
// outbox_events_queued_idx, among the first batch of them (a row still
// young ends the walk there: rows are in transaction order).
const pruneQueuedSQL = `
WITH gone AS (
  DELETE FROM outbox_events
   WHERE id = ANY(ARRAY(SELECT o.id FROM outbox_positions p CROSS JOIN LATERAL (
                   SELECT id, xid, created_at FROM outbox_events
                    WHERE status = 'queued' AND projection = p.projection AND xid < pg_snapshot_xmax(p.done_prev)
                    ORDER BY xid, id LIMIT @batch) o
                 WHERE o.created_at < now() - make_interval(secs => @retention_secs)
                   AND pg_visible_in_snapshot(o.xid, p.done_prev) LIMIT @batch))
     AND status = 'queued'
  RETURNING projection
)
SELECT projection, count(*) FROM gone GROUP BY projection`

// PruneDone deletes up to batch done rows older than retention, claimed
// ones and then queued ones, and returns how many per projection; the
// activity counts of minutes older than retention go with them.
func (s *Store) PruneDone(ctx context.Context, retention time.Duration, batch int) (map[string]int, error) {
	out, err := s.prune(ctx, pruneDoneSQL, retention, batch, map[string]int{})
	if err != nil {
		return nil, err
	}
	if _, err := s.Pool.Exec(ctx, `DELETE FROM outbox_done_by_minute WHERE minute < now() - make_interval(secs => $1)`,
		retention.Seconds()); err != nil {
		return nil, fmt.Errorf("prune activity: %w", err)
	}
	return s.prune(ctx, pruneQueuedSQL, retention, batch, out)
}

func (s *Store) prune(ctx context.Context, sql string, retention time.Duration, batch int, out map[string]int) (map[string]int, error) {
	rows, err := s.Pool.Query(ctx, sql, pgx.NamedArgs{"retention_secs": retention.Seconds(), "batch": batch})
	if err != nil {
		return nil, fmt.Errorf("prune done: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var projection string
		var n int
		if err := rows.Scan(&projection, &n); err != nil {
			return nil, fmt.Errorf("prune done: %w", err)
		}
		out[projection] += n
	}
	return out, rows.Err()
}
