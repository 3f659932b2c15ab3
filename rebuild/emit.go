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
// found with wlproj failed list --scope-key.
type emitter struct {
	cfg  Config
	pool *pgxpool.Pool
	row  *Row
	rep  *Report
}

func (e *emitter) label() string { return "rebuild:" + strconv.FormatInt(e.row.ID, 10) }

// emitSQL enqueues the next rows after a key, in key order, and moves the
// checkpoint in the same statement, so a crash re-emits nothing. %s is
// afterKey's clause; $3 and $4 follow its two parameters.
const emitSQL = `
WITH src AS (
  SELECT entity_type, entity_id, doc, version FROM %s%s ORDER BY entity_type, entity_id LIMIT $3
), ins AS (
  INSERT INTO outbox_events (projection, entity_type, entity_id, op, event_version, payload, scope_key)
  SELECT $4, entity_type, entity_id, 'upsert', version, coalesce(doc, 'null'::jsonb), $5 FROM src ORDER BY entity_type, entity_id
  RETURNING id
), last AS (
  SELECT entity_type, entity_id FROM src ORDER BY entity_type DESC, entity_id DESC LIMIT 1
)
UPDATE outbox_rebuilds r
   SET loaded_type = last.entity_type, loaded_id = last.entity_id,
       rows_loaded = r.rows_loaded + (SELECT count(*) FROM ins),
       emit_first_id = coalesce(r.emit_first_id, (SELECT min(id) FROM ins)),
       emit_last_id = greatest(r.emit_last_id, (SELECT max(id) FROM ins))
  FROM last
 WHERE r.id = $6 AND r.state = 'open'
RETURNING r.loaded_type, r.loaded_id, r.rows_loaded, r.emit_first_id, r.emit_last_id`

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
	e.cfg.Progress.Add(e.row.RowsLoaded)
	start, sent := time.Now(), int64(0)
	for {
		if err := e.pace(ctx, start, sent); err != nil {
			return err
		}
		n, err := e.chunk(ctx, table)
		if err != nil || n == 0 {
			e.rep.Rows = e.row.RowsLoaded
			return err
		}
		sent += n
		e.cfg.Progress.Add(n)
	}
}

// chunk enqueues the next BulkSize rows; 0 when none are left.
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
	before := e.row.RowsLoaded
	sql := fmt.Sprintf(emitSQL, table, where)
	err := e.pool.QueryRow(ctx, sql, append(args, e.cfg.BulkSize, e.cfg.Projection, e.label(), e.row.ID)...).
		Scan(&e.row.LoadedType, &e.row.LoadedID, &e.row.RowsLoaded, &e.row.EmitFirstID, &e.row.EmitLastID)
	if err == pgx.ErrNoRows {
		return 0, nil // no source row left: last is empty, nothing updated
	}
	if err != nil {
		return 0, fmt.Errorf("enqueue from %s: %w", table, err)
	}
	return e.row.RowsLoaded - before, nil
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
		err := e.pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM outbox_events
			WHERE status = 'pending' AND projection = $1 LIMIT $2) b`,
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
			(SELECT count(*) FROM outbox_events WHERE status = 'processing' AND id BETWEEN $1 AND $2 AND scope_key = $3)`,
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
