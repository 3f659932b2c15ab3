package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The ledger (outbox_ledger, migration 00019) is insert-only: an ack
// inserts its documents' new entries, and a document's entry is its row of
// highest (version, event_id). Space comes back by rotation over three
// partitions, never by a row's DELETE, so a held vacuum horizon leaves no
// dead version for a lookup to walk.

// takeLedgerSQL records that a binary which writes outbox_ledger only has
// led (LoadQueue sends it at the start of every term): from then on the
// writes of a binary of before it to outbox_applied are refused (see
// migration 00019), so such a binary never judges events by the entries it
// would no longer see. Idempotent: it writes once per database, not once
// per term.
const takeLedgerSQL = `UPDATE outbox_ledger_rotation SET log_only = true WHERE NOT log_only`

// LedgerRotation is what one RotateLedger did.
type LedgerRotation struct {
	// Rotated is whether a partition was opened again.
	Rotated bool
	// Slot is the partition current afterwards.
	Slot int
	// Carried counts the entries copied out of the reopened partition
	// because they were still needed.
	Carried int64
	// Held names what kept a due partition from being opened again: a lock
	// another session holds on it.
	Held string
}

// ledgerRotateAtMost bounds the time a partition is current: only a
// document's newest entry matters, so the superseded rest is space held for
// nothing, and a day of it is enough to carry each rotation's needed
// entries (at most one per document applied within the retention).
const ledgerRotateAtMost = 24 * time.Hour

// RotateLedger opens the ledger's oldest partition again once the current
// one has been written for half the retention (a day at most) or longer.
// Before the TRUNCATE, the entries of that partition still needed
// (carryLedgerSQL, which judges by age, not by the rotation's pace) are
// copied into the current one, in pages of one short transaction each.
func (s *Store) RotateLedger(ctx context.Context, epoch int64, retention, tombstoneRetention time.Duration, page int) (LedgerRotation, error) {
	slot, due, err := s.current(ctx, ledgerRotated, min(retention/2, ledgerRotateAtMost))
	if err != nil || !due {
		return LedgerRotation{Slot: slot}, err
	}
	next := (slot + 1) % rotationSlots
	carried, err := s.carryLedger(ctx, slot, next, retention, tombstoneRetention, page)
	if err != nil {
		return LedgerRotation{Slot: slot, Carried: carried}, err
	}
	err = s.reopen(ctx, epoch, ledgerRotated, slot, next, nil)
	var held *HeldError
	if errors.As(err, &held) {
		return LedgerRotation{Slot: slot, Carried: carried, Held: held.Reason}, nil
	}
	if errors.Is(err, errNotReopened) {
		return LedgerRotation{Slot: slot, Carried: carried}, nil
	}
	if err != nil {
		return LedgerRotation{Slot: slot, Carried: carried}, err
	}
	return LedgerRotation{Rotated: true, Slot: next, Carried: carried}, nil
}

// carryLedgerSQL copies one page of a partition's documents (slot %d),
// those past a key, into the current partition (@cur) when their entry
// there is still their newest one (no row of another partition is as new)
// and still needed: a tombstone younger than the tombstone retention (it
// refuses an older upsert written after the delete, which the engine has
// forgotten), a live entry younger than the retention, or any entry of a
// document an event could still be sent for (pending, processing, failed,
// discarded, archived in the dead letter; queued and not passed, which
// carryBacklogSQL carried before the first page): the leader judges that
// event by it. It returns the page's last key and how many it copied.
//
// Each page costs the same whatever the outbox holds: every question is
// one probe by the document's key (outbox_ledger_key_idx per partition,
// outbox_events_open_doc_idx (migration 24), the dead letter's entity
// index). The events' and the dead letter's are LATERAL with a LIMIT, not
// EXISTS: an EXISTS under an OR may be planned as a hash of every open or
// archived row, built again for each page (seen at 20,000 failed rows).
// On a schema before 24 the events' probe reads every open row of the
// status indexes per entry instead: correct, as slow as before.
// The partition is read through the parent, pruned to it by its slot:
// roles.sql's runtime role may read the parent and empty a partition, and
// needs no more.
const carryLedgerSQL = `
WITH page AS (
  SELECT DISTINCT ON (projection, entity_type, entity_id) * FROM outbox_ledger
   WHERE slot = %[1]d AND (projection, entity_type, entity_id) > (@p, @t, @i)
   ORDER BY projection, entity_type, entity_id, version DESC, event_id DESC
   LIMIT @page
), kept AS (
  INSERT INTO outbox_ledger (slot, projection, entity_type, entity_id, version, deleted, event_id, applied_at)
  SELECT @cur, a.projection, a.entity_type, a.entity_id, a.version, a.deleted, a.event_id, a.applied_at
    FROM page a
    LEFT JOIN LATERAL (SELECT true AS open FROM outbox_events e
                        WHERE e.status IN ('pending', 'processing', 'failed', 'discarded')
                          AND e.projection = a.projection AND e.entity_type = a.entity_type AND e.entity_id = a.entity_id
                        LIMIT 1) e ON true
    LEFT JOIN LATERAL (SELECT true AS archived FROM outbox_dead_letter d
                        WHERE d.projection = a.projection AND d.entity_type = a.entity_type AND d.entity_id = a.entity_id
                        LIMIT 1) d ON true
   WHERE NOT EXISTS (SELECT 1 FROM outbox_ledger n
                      WHERE n.slot <> %[1]d AND n.projection = a.projection AND n.entity_type = a.entity_type
                        AND n.entity_id = a.entity_id AND (n.version, n.event_id) >= (a.version, a.event_id))
     AND ((a.deleted AND a.applied_at >= now() - make_interval(secs => @tombstone_secs))
       OR (NOT a.deleted AND a.applied_at >= now() - make_interval(secs => @retention_secs))
       OR e.open OR d.archived)
  RETURNING 1
)
SELECT (SELECT count(*) FROM kept), l.projection, l.entity_type, l.entity_id
  FROM (SELECT projection, entity_type, entity_id FROM page
         ORDER BY projection DESC, entity_type DESC, entity_id DESC LIMIT 1) l`

// carryBacklogSQL copies, once per rotation and before the pages, the
// newest entry in the partition (slot %d) of each document with a queued
// event its projection has not passed (the backlog), when no other
// partition holds one as new: the pages then find it carried and pass over
// it. The backlog was read per page before, a walk of every queued row not
// passed (a paused projection's 300,000 made each page 562 ms, 12 s a
// rotation of 20 pages); now once, one probe of the partition per document
// (3.4 s and 908,000 buffers for the same 300,000 documents, the one
// statement of the rotation whose cost grows with the backlog; 7 ms beside
// none). An event queued while the pages run is judged by the retentions
// alone, as one queued after the TRUNCATE always was.
const carryBacklogSQL = `
INSERT INTO outbox_ledger (slot, projection, entity_type, entity_id, version, deleted, event_id, applied_at)
SELECT @cur, a.projection, a.entity_type, a.entity_id, a.version, a.deleted, a.event_id, a.applied_at
  FROM (SELECT DISTINCT b.projection, b.entity_type, b.entity_id FROM outbox_queue_backlog b) d
 CROSS JOIN LATERAL (
   SELECT * FROM outbox_ledger l
    WHERE l.slot = %[1]d AND l.projection = d.projection AND l.entity_type = d.entity_type AND l.entity_id = d.entity_id
    ORDER BY l.version DESC, l.event_id DESC LIMIT 1) a
 WHERE NOT EXISTS (SELECT 1 FROM outbox_ledger n
                    WHERE n.slot <> %[1]d AND n.projection = a.projection AND n.entity_type = a.entity_type
                      AND n.entity_id = a.entity_id AND (n.version, n.event_id) >= (a.version, a.event_id))`

// carryPlan keeps the carry on the ledger's index whatever the statistics
// say (a partition emptied by the last rotation is analyzed as empty, and a
// sequential scan of it planned then reads it whole once it has filled), and
// JIT off: compiling the statement cost 500 ms a page.
var carryPlan = []string{"SELECT set_config('enable_seqscan', 'off', true), set_config('jit', 'off', true)"}

// carryLedger runs carryBacklogSQL over partition next, then
// carryLedgerSQL, page after page, until a page comes back empty.
func (s *Store) carryLedger(ctx context.Context, cur, next int, retention, tombstoneRetention time.Duration, page int) (int64, error) {
	tag, err := s.execAfter(ctx, carryPlan, fmt.Sprintf(carryBacklogSQL, next), pgx.NamedArgs{"cur": cur})
	if err != nil {
		return 0, fmt.Errorf("carry the ledger's entries of the backlog out of %s: %w", ledgerPartition(next), err)
	}
	total := tag.RowsAffected()
	sql := fmt.Sprintf(carryLedgerSQL, next)
	args := pgx.NamedArgs{"cur": cur, "page": page, "p": "", "t": "", "i": "",
		"retention_secs": retention.Seconds(), "tombstone_secs": tombstoneRetention.Seconds()}
	for {
		n, p, t, i, err := s.carryPage(ctx, sql, args)
		if errors.Is(err, pgx.ErrNoRows) {
			return total, nil
		}
		if err != nil {
			return total, fmt.Errorf("carry the ledger's needed entries out of %s: %w", ledgerPartition(next), err)
		}
		total += n
		args["p"], args["t"], args["i"] = p, t, i
	}
}

// carryPage runs one page of the carry after carryPlan, in one round trip
// and one implicit transaction (the settings end with it).
func (s *Store) carryPage(ctx context.Context, sql string, args pgx.NamedArgs) (n int64, p, t, i string, err error) {
	br, err := s.sendAfter(ctx, carryPlan, func(b *pgx.Batch) { b.Queue(sql, args) })
	if err != nil {
		return 0, "", "", "", err
	}
	defer br.Close()
	err = br.QueryRow().Scan(&n, &p, &t, &i)
	return n, p, t, i, err
}

// ledgerPartition is the name of the ledger's partition of slot.
func ledgerPartition(slot int) string {
	return ledgerRotated.partitionOf(slot)
}
