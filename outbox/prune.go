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
const pruneDoneSQL = `
WITH gone AS (
  DELETE FROM outbox_events
   WHERE id IN (SELECT id FROM outbox_events
                 WHERE status = 'done' AND processed_at < now() - make_interval(secs => @retention_secs)
                 ORDER BY processed_at LIMIT @batch
                 FOR UPDATE SKIP LOCKED)
     AND status = 'done'
  RETURNING projection
)
SELECT projection, count(*) FROM gone GROUP BY projection`

// PruneDone deletes up to batch done rows older than retention and returns
// how many per projection.
func (s *Store) PruneDone(ctx context.Context, retention time.Duration, batch int) (map[string]int, error) {
	rows, err := s.Pool.Query(ctx, pruneDoneSQL, pgx.NamedArgs{"retention_secs": retention.Seconds(), "batch": batch})
	if err != nil {
		return nil, fmt.Errorf("prune done: %w", err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var projection string
		var n int
		if err := rows.Scan(&projection, &n); err != nil {
			return nil, fmt.Errorf("prune done: %w", err)
		}
		out[projection] = n
	}
	return out, rows.Err()
}

// pruneLedgerSQL deletes one batch of ledger entries of deleted documents
// whose delete is older than the retention. An entry stays while any event
// of its document could still be sent (pending, processing, failed,
// discarded, or archived in the dead letter): removing it then would let a
// replay of an older upsert bring the document back. Once none is left, the
// only way to send an older version is a producer writing one anew.
const pruneLedgerSQL = `
DELETE FROM outbox_applied
 WHERE (projection, entity_type, entity_id) IN (
         SELECT a.projection, a.entity_type, a.entity_id FROM outbox_applied a
          WHERE a.deleted AND a.applied_at < now() - make_interval(secs => @retention_secs)
            AND NOT EXISTS (SELECT 1 FROM outbox_events e
                             WHERE e.status IN ('pending', 'processing', 'failed', 'discarded')
                               AND e.projection = a.projection AND e.entity_type = a.entity_type
                               AND e.entity_id = a.entity_id)
            AND NOT EXISTS (SELECT 1 FROM outbox_dead_letter d
                             WHERE d.projection = a.projection AND d.entity_type = a.entity_type
                               AND d.entity_id = a.entity_id)
          ORDER BY a.applied_at LIMIT @batch
          FOR UPDATE OF a SKIP LOCKED)
   AND deleted`

// PruneLedger deletes up to batch entries of long-deleted documents that no
// live or archived event refers to, and returns how many.
func (s *Store) PruneLedger(ctx context.Context, retention time.Duration, batch int) (int, error) {
	tag, err := s.Pool.Exec(ctx, pruneLedgerSQL, pgx.NamedArgs{"retention_secs": retention.Seconds(), "batch": batch})
	if err != nil {
		return 0, fmt.Errorf("prune ledger: %w", err)
	}
	return int(tag.RowsAffected()), nil
}
