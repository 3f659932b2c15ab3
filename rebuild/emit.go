package rebuild

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wlproj/wlproj/internal/serviceutil"
)

// emitPoll is how often the emitter looks at the backlog it waits for.
const emitPoll = 100 * time.Millisecond

// emitter is --emit-outbox: instead of bulk-loading, it enqueues an upsert
// event per source row (the SoT's "truncate and re-emit", with a new index
// instead of the truncate), and the leader carries them to both indexes.
// The events are labelled with scope_key "rebuild:<id>", so a failed one is
// found with wlproj failed list --scope-key. They carry the repair mark:
// the ledger holds the version of every document changed within
// OUTBOX_RETENTION, from the producer's own event, and without the mark
// the leader failed each such event as version_reused, and the swap went
// ahead with the new index lacking the document. Rows the ledger holds
// newer are judged as the load judges them: a delete drops the row, and a
// newer live version is enqueued from the old index's copy (Behind).
type emitter struct {
	cfg    Config
	pool   *pgxpool.Pool
	row    *Row
	rep    *Report
	copier copier
}

func (e *emitter) label() string { return "rebuild:" + strconv.FormatInt(e.row.ID, 10) }

// emitPageSQL reads the keys of the next page after a key (%s is
// afterKey's clause, $3 the page's size) with what the ledger holds of
// them, and changes nothing.
const emitPageSQL = `
WITH src AS (SELECT entity_type, entity_id, version FROM %s%s ORDER BY entity_type, entity_id LIMIT $3)
SELECT s.entity_type, s.entity_id, coalesce(s.version, -1), coalesce(a.version, -1), coalesce(a.deleted, false)
  FROM src s LEFT JOIN LATERAL outbox_ledger_entry($4, s.entity_type, s.entity_id) a ON true
 ORDER BY s.entity_type, s.entity_id`

// emitSQL enqueues the rows of a page, up to its last key ($3, $4), with
// the repair mark, and moves the checkpoint to that key in the same
// statement, so a crash re-emits nothing. %s is afterKey's clause, with
// its two parameters. A row the ledger holds a delete of (at its version
// or newer) is superseded; one it holds a newer live version of is
// replaced by its copy from the old index ($8 to $11), read before the
// statement, or superseded when the old index has none. Every row the
// statement reads is judged again: a row written since the page's keys
// were read is in it, and one written after it comes by dual-write.
const emitSQL = `
WITH src AS (
  SELECT entity_type, entity_id, doc, version FROM %s%s AND (entity_type, entity_id) <= ($3, $4)
), judged AS (
  SELECT s.*, coalesce(s.version IS NOT NULL AND a.version >= s.version AND (a.deleted OR a.version > s.version), false) AS newer,
         coalesce(a.deleted, false) AS deleted
    FROM src s LEFT JOIN LATERAL outbox_ledger_entry($5, s.entity_type, s.entity_id) a ON true
), copies AS (
  SELECT c.* FROM unnest($8::text[], $9::text[], $10::bigint[], $11::text[]) AS c(entity_type, entity_id, version, doc)
    JOIN judged j USING (entity_type, entity_id) WHERE j.newer AND NOT j.deleted
), ins AS (
  INSERT INTO outbox_events (projection, entity_type, entity_id, op, event_version, payload, scope_key, repair)
  SELECT $5, entity_type, entity_id, 'upsert', version, doc, $6, true
    FROM (SELECT entity_type, entity_id, version, coalesce(doc, 'null'::jsonb) AS doc FROM judged WHERE NOT newer
          UNION ALL
          SELECT entity_type, entity_id, version, doc::jsonb FROM copies) e
   ORDER BY entity_type, entity_id
  RETURNING id
)
UPDATE outbox_rebuilds r
   SET loaded_type = $3, loaded_id = $4,
       rows_loaded = r.rows_loaded + (SELECT count(*) FROM ins),
       rows_superseded = r.rows_superseded + (SELECT count(*) FROM judged WHERE newer) - (SELECT count(*) FROM copies),
       emit_first_id = coalesce(r.emit_first_id, (SELECT min(id) FROM ins)),
       emit_last_id = greatest(r.emit_last_id, (SELECT max(id) FROM ins))
 WHERE r.id = $7 AND r.state = 'open'
RETURNING r.loaded_type, r.loaded_id, r.rows_loaded, r.rows_superseded, r.emit_first_id, r.emit_last_id`

// emit enqueues the whole source table, paced: at most EmitRate rows a
// second, and never while more than EmitBacklog events of the projection
// are pending, so a live event waits behind at most that many. Then it
// waits until every event it enqueued is done or failed.
func (e *emitter) emit(ctx context.Context, table string) error {
	total, err := countSource(ctx, e.pool, table, nil)
	if err != nil {
		return err
	}
	e.rep.Rows = total
	e.cfg.Progress.Phase("emit", total)
	e.cfg.Progress.Add(e.row.RowsLoaded + e.row.RowsSuperseded)
	start, sent := time.Now(), int64(0)
	for {
		if err := e.pace(ctx, start, sent); err != nil {
			return err
		}
		n, err := e.chunk(ctx, table)
		if err != nil || n == 0 {
			e.rep.Rows = e.row.RowsLoaded + e.row.RowsSuperseded
			return err
		}
		sent += n
		e.cfg.Progress.Add(n)
	}
}

// chunk enqueues the next BulkSize rows; 0 when none are left. It reads
// the page's keys first, and the old index's copies of the rows behind
// the ledger, so that the statement that enqueues the page and moves the
// checkpoint enqueues the copies too: a crash between the two would
// otherwise skip them on the resume.
func (e *emitter) chunk(ctx context.Context, table string) (int64, error) {
	var after *key
	if e.row.LoadedType != nil && e.row.LoadedID != nil {
		after = &key{Type: *e.row.LoadedType, ID: *e.row.LoadedID}
	}
	where, args := afterKey(after)
	if after == nil {
		// Keep the parameter numbers of the resumed form.
		where, args = ` WHERE $1::text IS NULL AND $2::text IS NULL`, []any{nil, nil}
	}
	last, behind, err := e.page(ctx, table, where, args)
	if err != nil || last == nil {
		return 0, err
	}
	copies, err := e.copier.copies(ctx, behind, 1)
	if err != nil {
		return 0, err
	}
	n := len(copies)
	types, ids, versions, docs := make([]string, n), make([]string, n), make([]int64, n), make([]string, n)
	for i, c := range copies {
		types[i], ids[i], versions[i], docs[i] = c.EntityType, c.EntityID, *c.EventVersion, string(c.Payload)
	}
	before := e.row.RowsLoaded + e.row.RowsSuperseded
	err = e.pool.QueryRow(ctx, fmt.Sprintf(emitSQL, table, where), append(args, last.Type, last.ID, e.cfg.Projection,
		e.label(), e.row.ID, types, ids, versions, docs)...).
		Scan(&e.row.LoadedType, &e.row.LoadedID, &e.row.RowsLoaded, &e.row.RowsSuperseded, &e.row.EmitFirstID, &e.row.EmitLastID)
	if err != nil {
		return 0, fmt.Errorf("enqueue from %s: %w", table, err)
	}
	e.rep.behind(behind)
	// At least one: the checkpoint moved past the page's last key.
	return max(1, e.row.RowsLoaded+e.row.RowsSuperseded-before), nil
}

// page reads the keys of the next page and returns its last key (nil when
// no row is left) and its rows behind the ledger.
func (e *emitter) page(ctx context.Context, table, where string, args []any) (*key, []Behind, error) {
	rows, err := e.pool.Query(ctx, fmt.Sprintf(emitPageSQL, table, where), append(args, e.cfg.BulkSize, e.cfg.Projection)...)
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", table, err)
	}
	var last *key
	var behind []Behind
	var k key
	var version, applied int64
	var deleted bool
	_, err = pgx.ForEachRow(rows, []any{&k.Type, &k.ID, &version, &applied, &deleted}, func() error {
		last = &key{Type: k.Type, ID: k.ID}
		if version >= 0 && applied > version && !deleted {
			behind = append(behind, Behind{EntityType: k.Type, EntityID: k.ID, SourceVersion: version, LedgerVersion: applied})
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", table, err)
	}
	return last, behind, nil
}

// pace waits for the rate and the backlog to allow the next chunk.
func (e *emitter) pace(ctx context.Context, start time.Time, sent int64) error {
	if due := start.Add(time.Duration(float64(sent) / float64(e.cfg.EmitRate) * float64(time.Second))); time.Until(due) > 0 {
		if err := serviceutil.Sleep(ctx, time.Until(due)); err != nil {
			return err
		}
	}
	for {
		var pending int64
		// Counted up to one past the limit: the answer is the same, and the
		// cost stays that of the limit whatever the backlog.
		err := e.pool.QueryRow(ctx, `SELECT count(*) FROM ((SELECT 1 FROM outbox_events
			WHERE status = 'pending' AND projection = $1 LIMIT $2)
			UNION ALL (SELECT 1 FROM outbox_queue_backlog WHERE projection = $1 LIMIT $2)) b`,
			e.cfg.Projection, e.cfg.EmitBacklog+1).Scan(&pending)
		if err != nil {
			return fmt.Errorf("backlog: %w", err)
		}
		if pending <= int64(e.cfg.EmitBacklog) {
			return nil
		}
		if err := serviceutil.Sleep(ctx, emitPoll); err != nil {
			return err
		}
	}
}

// drain waits until every enqueued event is done, failed or discarded, and
// reports the failed ones as refused rows.
func (e *emitter) drain(ctx context.Context) error {
	if e.row.EmitFirstID == nil {
		return nil
	}
	first, last, label := *e.row.EmitFirstID, *e.row.EmitLastID, e.label()
	e.cfg.Progress.Phase("drain", e.row.RowsLoaded)
	for {
		var open int64
		// One count per status, so each reads its own partial index: an
		// IN over both read the whole table (160 ms every poll).
		err := e.pool.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM outbox_events WHERE status = 'pending' AND id BETWEEN $1 AND $2 AND scope_key = $3) +
			(SELECT count(*) FROM outbox_events WHERE status = 'processing' AND id BETWEEN $1 AND $2 AND scope_key = $3) +
			(SELECT count(*) FROM outbox_queue_backlog b JOIN outbox_events q ON q.id = b.id
			  WHERE b.id BETWEEN $1 AND $2 AND q.scope_key = $3)`,
			first, last, label).Scan(&open)
		if err != nil {
			return fmt.Errorf("wait for the enqueued events: %w", err)
		}
		e.cfg.Progress.Set(e.row.RowsLoaded - open)
		if open == 0 {
			break
		}
		if err := serviceutil.Sleep(ctx, emitPoll); err != nil {
			return err
		}
	}
	return e.failures(ctx, first, last, label)
}

// failuresSpan is the ids one statement of failures reads.
const failuresSpan = 50_000

// failures reads the enqueued events that failed or were discarded, a span
// of ids per statement along the primary key: the emitted range can hold
// millions of rows, and one statement over it all read them all (a second
// at 2 million rows).
func (e *emitter) failures(ctx context.Context, first, last int64, label string) error {
	var refused []Refused
	for lo := first; lo <= last; lo += failuresSpan {
		rows, err := e.pool.Query(ctx, `SELECT entity_type, entity_id, coalesce(event_version, id), coalesce(error_reason, ''),
			coalesce(last_error, '') FROM outbox_events
			WHERE id BETWEEN $1 AND $2 AND scope_key = $3 AND status IN ('failed', 'discarded') ORDER BY id`,
			lo, min(lo+failuresSpan-1, last), label)
		if err != nil {
			return fmt.Errorf("read the failed events: %w", err)
		}
		span, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Refused])
		if err != nil {
			return fmt.Errorf("read the failed events: %w", err)
		}
		refused = append(refused, span...)
	}
	// rows_loaded keeps counting the enqueued events; the report subtracts.
	e.row.RowsRefused = int64(len(refused))
	e.rep.refuse(refused, e.cfg.OnRefused)
	return checkpoint(ctx, e.pool, e.row)
}
