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

// The ledger pruner's two statements differ only in which entries they
// take. An entry stays while any event of its document could still be sent
// (pending, processing, failed, discarded, queued and not yet passed, or
// archived in the dead letter):
// the leader judges that event by it. The status test is spelled as ORs so
// that each arm matches one of outbox_events' partial indexes: the backlog
// is read once per statement through them and hashed, never the done rows.
// No ORDER BY: under FOR UPDATE a sort reads every due entry for each
// batch, while without it the scan of due entries stops once the batch is
// full. The DELETE takes the locked entries by ctid, from an array: FOR
// UPDATE locks and rechecks them (a locked row's ctid cannot change before
// the delete), and an IN over the key made the planner hash-join the
// batch against every entry of the ledger (111 ms a batch at 200k entries).
const (
	pruneLedgerHead = `
WITH backlog AS MATERIALIZED (SELECT DISTINCT projection, entity_type, entity_id FROM outbox_queue_backlog)
DELETE FROM outbox_applied
 WHERE ctid = ANY(ARRAY(
         SELECT a.ctid FROM outbox_applied a
          WHERE `
	pruneLedgerTail = ` AND a.applied_at < now() - make_interval(secs => @retention_secs)
            AND NOT EXISTS (SELECT 1 FROM outbox_events e
                             WHERE (e.status = 'pending' OR e.status = 'processing'
                                    OR e.status = 'failed' OR e.status = 'discarded')
                               AND e.projection = a.projection AND e.entity_type = a.entity_type
                               AND e.entity_id = a.entity_id)
            AND NOT EXISTS (SELECT 1 FROM backlog b
                             WHERE b.projection = a.projection AND b.entity_type = a.entity_type
                               AND b.entity_id = a.entity_id)
            AND NOT EXISTS (SELECT 1 FROM outbox_dead_letter d
                             WHERE d.projection = a.projection AND d.entity_type = a.entity_type
                               AND d.entity_id = a.entity_id)
          LIMIT @batch
          FOR UPDATE OF a SKIP LOCKED))`
)

// pruneTombstonesSQL deletes one batch of deleted documents' entries
// (outbox_applied_deleted_idx). The engine forgets a delete after
// index.gc_deletes, so until this runs the entry is what refuses an older
// upsert a producer writes after the delete.
const pruneTombstonesSQL = pruneLedgerHead + `a.deleted` + pruneLedgerTail

// pruneLiveSQL deletes one batch of live documents' entries
// (outbox_applied_live_idx). The engine keeps a live document's version
// and refuses an older one (external_gte), so the entry is not needed once
// no event of the document is left to judge.
const pruneLiveSQL = pruneLedgerHead + `NOT a.deleted` + pruneLedgerTail

// PruneTombstones deletes up to batch entries of documents deleted longer
// ago than retention that no live or archived event refers to, and returns
// how many. After that, an older upsert a producer writes anew brings the
// document back: retention is the window of that protection.
func (s *Store) PruneTombstones(ctx context.Context, retention time.Duration, batch int) (int, error) {
	return s.pruneLedger(ctx, pruneTombstonesSQL, retention, batch)
}

// PruneLive deletes up to batch entries of live documents applied longer
// ago than retention that no live or archived event refers to, and returns
// how many.
func (s *Store) PruneLive(ctx context.Context, retention time.Duration, batch int) (int, error) {
	return s.pruneLedger(ctx, pruneLiveSQL, retention, batch)
}

func (s *Store) pruneLedger(ctx context.Context, sql string, retention time.Duration, batch int) (int, error) {
	tag, err := s.Pool.Exec(ctx, sql, pgx.NamedArgs{"retention_secs": retention.Seconds(), "batch": batch})
	if err != nil {
		return 0, fmt.Errorf("prune ledger: %w", err)
	}
	return int(tag.RowsAffected()), nil
}
