package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// outbox_events (migration 00021) is partitioned by slot over three
// partitions, rotated as the ledger is: nothing deletes a row of a
// successful event, whatever its age, so a held vacuum horizon keeps no
// dead version of it. A partition is emptied by TRUNCATE once every row in
// it is older than the retention and every projection has passed it, after
// the rows still needed are moved out of it.

// EventsRotation is what one RotateEvents did.
type EventsRotation struct {
	// Rotated is whether a partition was opened again.
	Rotated bool
	// Slot is the partition current afterwards.
	Slot int
	// Carried counts the rows moved out of the partition to reopen because
	// they were still needed.
	Carried int64
	// Held names what kept a due partition from being opened again: an
	// event in flight, or one a projection has not passed (a paused
	// projection holds the outbox's retention until it resumes).
	Held string
}

// RotateEvents opens the outbox's oldest partition again once the current
// one has been written for half the retention and the oldest's newest row
// is older than the retention (it is, unless the retention was raised):
// with three partitions, its rows were written two half-retentions ago.
// Before the TRUNCATE, the rows still needed move into the current
// partition (carryEventsSQL); rows in flight or not yet passed hold the
// partition until a later round (eventsHeldSQL).
func (s *Store) RotateEvents(ctx context.Context, epoch int64, retention time.Duration, page int) (EventsRotation, error) {
	slot, due, err := s.current(ctx, eventsRotated, retention/2)
	if err != nil || !due {
		return EventsRotation{Slot: slot}, err
	}
	next := (slot + 1) % rotationSlots
	var young bool
	if err := s.Pool.QueryRow(ctx, fmt.Sprintf(youngEventsSQL, eventsRotated.partitionOf(next)),
		retention.Seconds()).Scan(&young); err != nil || young {
		return EventsRotation{Slot: slot}, err
	}
	carried, err := s.carryEvents(ctx, slot, next, retention, page)
	if err != nil {
		return EventsRotation{Slot: slot, Carried: carried}, err
	}
	err = s.reopen(ctx, epoch, eventsRotated, slot, next, func(ctx context.Context, tx pgx.Tx) (held string, err error) {
		if _, err := tx.Exec(ctx, carryPlan[0]); err != nil {
			return "", err
		}
		err = tx.QueryRow(ctx, fmt.Sprintf(eventsHeldSQL, eventsRotated.partitionOf(next)),
			pgx.NamedArgs{"retention_secs": retention.Seconds()}).Scan(&held)
		return held, err
	})
	var held *HeldError
	switch {
	case errors.As(err, &held):
		return EventsRotation{Slot: slot, Carried: carried, Held: held.Reason}, nil
	case errors.Is(err, errNotReopened):
		return EventsRotation{Slot: slot, Carried: carried}, nil
	case err != nil:
		return EventsRotation{Slot: slot, Carried: carried}, err
	}
	return EventsRotation{Rotated: true, Slot: next, Carried: carried}, nil
}

// youngEventsSQL says whether a partition's newest row (by id, along its
// primary key) is younger than the retention ($1 seconds).
const youngEventsSQL = `
SELECT coalesce((SELECT created_at > now() - make_interval(secs => $1) FROM %s ORDER BY id DESC LIMIT 1), false)`

// eventsNeeded is the condition of a row that must outlive its partition
// whatever its age: one to retry, a failed or discarded one (only an
// operator's action ends them), a done one acked within the retention.
// Queued rows are never moved: their projection's position passes them in
// place, and a row in flight is not moved under the leader's feet.
const eventsNeeded = `(%[1]s.status = 'pending' OR %[1]s.status = 'failed' OR %[1]s.status = 'discarded'
    OR (%[1]s.status = 'done' AND %[1]s.processed_at >= now() - make_interval(secs => @retention_secs)))`

// carryEventsSQL moves one page of a partition's (%[1]s, slot %[3]d)
// needed rows into the current partition (%[2]s, slot @cur), as they are
// but for their slot: a DELETE
// and an INSERT in one statement, so each row is in exactly one partition
// for every reader. SKIP LOCKED leaves a row another statement is changing
// (a claim, an operator's replay); one that changes status under the
// DELETE is judged again as it is then. A statement that meets a moved row
// later with an older snapshot finds it deleted and passes over it, as
// Postgres does for any row deleted under it: a claim claims it next time,
// an operator's action on it is refused and changes nothing.
//
// The rows are locked through the parent, pruned to the partition by its
// slot: a row lock needs UPDATE on a column of the table it is taken
// through, and roles.sql's runtime role has UPDATE on the parent's
// lifecycle columns only, none on a partition (a partition's privileges
// are checked only when it is named). Locking the rows there needs no
// grant beyond what the ack has.
var carryEventsSQL = `
WITH moved AS (
  DELETE FROM %[1]s m
   WHERE m.id = ANY(ARRAY(SELECT c.id FROM outbox_events c WHERE c.slot = %[3]d AND ` + fmt.Sprintf(eventsNeeded, "c") + `
                    LIMIT @page FOR UPDATE SKIP LOCKED))
     AND ` + fmt.Sprintf(eventsNeeded, "m") + `
  RETURNING m.*
)
INSERT INTO %[2]s
SELECT r.* FROM moved
 CROSS JOIN LATERAL jsonb_populate_record(NULL::outbox_events, to_jsonb(moved) || jsonb_build_object('slot', @cur::smallint)) r`

// eventsHeldSQL names, under the partition's (%[1]s) ACCESS EXCLUSIVE lock
// and after carryPlan, a row that must not go with it, or an empty string.
// Each probe is one of its partial indexes; the last walks, per projection,
// only the rows past its position's first snapshot's xmin.
var eventsHeldSQL = `
SELECT coalesce(
  (SELECT 'event ' || id || ', processing' FROM %[1]s WHERE status = 'processing' LIMIT 1),
  (SELECT 'event ' || n.id || ', ' || n.status FROM %[1]s n WHERE ` +
	fmt.Sprintf(eventsNeeded, "n") + ` LIMIT 1),
  (SELECT 'event ' || q.id || ', which projection ' || h.projection || ' has not passed yet'
     FROM outbox_queue_heads h CROSS JOIN LATERAL (
       SELECT q.id FROM %[1]s q
        WHERE q.status = 'queued' AND q.projection = h.projection AND q.xid >= pg_snapshot_xmin(h.done_prev)
          AND NOT outbox_behind(q.xid, q.id, h.done_prev, h.done_cur, h.done_xid, h.done_id)
        LIMIT 1) q
    LIMIT 1),
  '')`

// carryEvents runs carryEventsSQL over partition next after carryPlan (the
// partial indexes of the needed rows, not a scan of the partition however
// many of them its statistics promise), page after page, until a page
// moves fewer rows than a page.
func (s *Store) carryEvents(ctx context.Context, cur, next int, retention time.Duration, page int) (int64, error) {
	sql := fmt.Sprintf(carryEventsSQL, eventsRotated.partitionOf(next), eventsRotated.partitionOf(cur), next)
	args := pgx.NamedArgs{"cur": cur, "page": page, "retention_secs": retention.Seconds()}
	var total int64
	for {
		tag, err := s.execAfter(ctx, carryPlan, sql, args)
		if err != nil {
			return total, fmt.Errorf("move the outbox's needed rows out of %s: %w", eventsRotated.partitionOf(next), err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(page) {
			return total, nil
		}
	}
}

// PruneActivity deletes the per-minute activity counts older than the
// retention: one row per projection and minute, a few thousand at most.
func (s *Store) PruneActivity(ctx context.Context, retention time.Duration) error {
	if _, err := s.Pool.Exec(ctx, `DELETE FROM outbox_done_by_minute WHERE minute < now() - make_interval(secs => $1)`,
		retention.Seconds()); err != nil {
		return fmt.Errorf("prune activity: %w", err)
	}
	return nil
}

// execAfter runs sql after plan, in one round trip and one implicit
// transaction (the settings end with it).
func (s *Store) execAfter(ctx context.Context, plan []string, sql string, args pgx.NamedArgs) (pgconn.CommandTag, error) {
	br, err := s.sendAfter(ctx, plan, func(b *pgx.Batch) { b.Queue(sql, args) })
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	defer br.Close()
	return br.Exec()
}
