package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// Queued rows (status 'queued', the default since migration 00018) are read
// by position, PgQ's way, and never updated when they succeed: the hot path
// writes no row version per event. A projection's position moves through
// batches, each the rows that became visible between two snapshots of the
// leader (Position.Prev, Position.Cur), so a producer's transaction that
// commits after a later one is read in the batch of the first snapshot that
// sees it committed: it can never fall behind the position unread.

// Position is where a projection's leader is among its queued rows: every
// queued row visible in snapshot Prev, and those visible in Cur but not in
// Prev up to (XID, ID) in (xid, id) order, are behind it. Snapshots are
// pg_snapshot text.
type Position struct {
	Prev, Cur string
	XID       uint64
	ID        int64
}

// Drained is the position at the end of p's batch: the next read takes a
// new snapshot.
func (p Position) Drained() Position { return Position{Prev: p.Cur, Cur: p.Cur} }

// ticks reports whether a read from p takes a new snapshot: p's batch is
// drained (or p is an origin).
func (p Position) ticks() bool { return p.Cur == "" || p.Cur == p.Prev }

// InBatch reports whether a read from p reads on in the batch of an older
// snapshot (a leader's position saved mid-batch, a rewind): what it finds
// ends at that snapshot, not where the queue ends.
func (p Position) InBatch() bool { return !p.ticks() }

// Origin is the position every projection starts from, nil before
// migration 00018 made rows queued (there are none to read then).
func (s *Store) Origin(ctx context.Context) (*Position, error) {
	var snap string
	err := s.Pool.QueryRow(ctx, originSQL).Scan(&snap)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("queue origin: %w", err)
	}
	return &Position{Prev: snap, Cur: snap}, nil
}

// originSQL reads the queue's origin; positionsSQL each projection's
// confirmed position.
const originSQL = `SELECT snapshot::text FROM outbox_queue_origin`

const positionsSQL = `SELECT projection, done_prev::text, done_cur::text, done_xid, done_id FROM outbox_positions`

// ErrLedgerNotTaken says LoadQueue failed before the term took the ledger:
// the barrier that waits for the last term's ledger writes (migration
// 00029) has not run, and nothing may be judged by the ledger yet.
var ErrLedgerNotTaken = errors.New("the term has not taken the ledger")

// TakeLedger takes the ledger alone (takeLedgerSQL, and the barrier its
// trigger runs), for a term whose LoadQueue failed on one of its reads: the
// claim of rows goes on without the queue's state, never without this.
func (s *Store) TakeLedger(ctx context.Context) error {
	if _, err := s.Pool.Exec(ctx, takeLedgerSQL); err != nil {
		return fmt.Errorf("%w: %w", ErrLedgerNotTaken, err)
	}
	return nil
}

// LoadQueue takes the ledger (takeLedgerSQL) and reads the queue's origin and
// every saved position in one round trip: a new leader's first read waits
// for them, and three round trips on the takeover path cost what the read
// itself does.
func (s *Store) LoadQueue(ctx context.Context) (*Position, map[string]Position, error) {
	batch := &pgx.Batch{}
	batch.Queue(takeLedgerSQL)
	batch.Queue(originSQL)
	batch.Queue(positionsSQL)
	br := s.Pool.SendBatch(ctx, batch)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrLedgerNotTaken, err)
	}
	var origin *Position
	var snap string
	switch err := br.QueryRow().Scan(&snap); {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return nil, nil, fmt.Errorf("queue origin: %w", err)
	default:
		origin = &Position{Prev: snap, Cur: snap}
	}
	rows, err := br.Query()
	if err != nil {
		return nil, nil, fmt.Errorf("positions: %w", err)
	}
	saved, err := scanPositions(rows)
	return origin, saved, err
}

func scanPositions(rows pgx.Rows) (map[string]Position, error) {
	defer rows.Close()
	out := map[string]Position{}
	for rows.Next() {
		var name string
		var p Position
		if err := rows.Scan(&name, &p.Prev, &p.Cur, &p.XID, &p.ID); err != nil {
			return nil, fmt.Errorf("positions: %w", err)
		}
		out[name] = p
	}
	return out, rows.Err()
}

// queuedProjectionsSQL lists the projections with queued rows through
// outbox_queue_heads (one probe of outbox_events_queued_idx each; a queued
// row's entry never dies while it is queued, so no held horizon makes the
// walk longer).
const queuedProjectionsSQL = `SELECT projection FROM outbox_queue_heads`

// QueuedProjections names the projections that have queued rows, read or
// not: a projection producers name that no replica knows yet gets a
// position too, and its rows fail as unknown_projection like claimed ones.
func (s *Store) QueuedProjections(ctx context.Context) ([]string, error) {
	rows, err := s.Pool.Query(ctx, queuedProjectionsSQL)
	if err != nil {
		return nil, fmt.Errorf("queued projections: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("queued projections: %w", err)
	}
	return names, nil
}

// readQueuedSQL reads the next rows of a projection's batch past (xid, id):
// those of transactions in progress at prev that cur sees committed (the
// late ones, one index probe per such transaction: an array of them
// compared with xid was a filter on a walk of every row past the position,
// 2 M rows on a 2 M backlog), then those of transactions that started
// between the two snapshots and committed before cur. Both parts walk
// outbox_events_queued_idx from the position, and a queued row that
// succeeds never leaves it, so a held horizon adds no dead entry to skip.
// When the batch is drained, cur is the statement's own snapshot: the rows
// it reads are exactly the ones it sees committed. A paused projection
// reads nothing, not even a snapshot. The second part's lower bound is one
// row comparison, the later of the position and (xmax of prev, 0): given
// both a row bound and xid >= xmax, the index walk started at the row
// bound, and a new batch's position is (0, 0), so every read of a steady
// stream walked every queued row the retention keeps (11k buffers a read
// at 3.5 M rows, growing with the table).

const readQueuedSQL = `
WITH cur AS (SELECT CASE WHEN @tick THEN pg_current_snapshot() ELSE @cur::text::pg_snapshot END AS s
              WHERE NOT EXISTS (SELECT 1 FROM outbox_projection_state WHERE projection = @projection AND paused))
SELECT cur.s::text, c.* FROM cur LEFT JOIN LATERAL (
  SELECT * FROM (
    (SELECT e.* FROM pg_snapshot_xip(@prev::text::pg_snapshot) x
      CROSS JOIN LATERAL (
        SELECT q.id, q.xid, q.entity_type, q.entity_id, q.op, q.event_version, q.payload, q.scope_key,
               q.attempts, q.created_at, q.repair, q.traceparent
          FROM outbox_events q
         WHERE q.status = 'queued' AND q.projection = @projection AND q.xid = x
           AND (q.xid, q.id) > (@xid::xid8, @after_id::bigint)
         ORDER BY q.id LIMIT @limit) e
      WHERE pg_visible_in_snapshot(x, cur.s))
    UNION ALL
    (SELECT e.id, e.xid, e.entity_type, e.entity_id, e.op, e.event_version, e.payload, e.scope_key,
            e.attempts, e.created_at, e.repair, e.traceparent
       FROM outbox_events e
      WHERE e.status = 'queued' AND e.projection = @projection AND e.xid < pg_snapshot_xmax(cur.s)
        AND (e.xid, e.id) > (greatest(@xid::xid8, pg_snapshot_xmax(@prev::text::pg_snapshot)),
                             CASE WHEN @xid::xid8 >= pg_snapshot_xmax(@prev::text::pg_snapshot) THEN @after_id::bigint ELSE 0 END)
        AND pg_visible_in_snapshot(e.xid, cur.s)
      ORDER BY e.xid, e.id LIMIT @limit)) u
  ORDER BY u.xid, u.id LIMIT @limit) c ON true`

// readQueuedLedgerSQL adds each row's ledger entry, for projections that
// keep one, as three columns of a lateral join: an array of them built by a
// subquery per row cost 7% more of the statement (4.09 against 3.80 ms a
// batch of 500, the lookups missing) and a decoded array per row in the
// loop. A nested loop keeps the batch's order.
const readQueuedLedgerSQL = `
SELECT r.*, a.version, a.event_id, a.deleted
  FROM (` + readQueuedSQL + `) r LEFT JOIN LATERAL outbox_ledger_entry(@projection, r.entity_type, r.entity_id) a ON true`

// queuedPlan keeps the read on the queued index whatever the statistics
// say (see claimPlan), and JIT off.
var queuedPlan = []string{"BEGIN",
	"SELECT set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true), set_config('jit', 'off', true)"}

// ReadQueued reads up to limit queued rows of projection past from, in
// (xid, id) order, each with its ledger entry when withLedger, and returns
// the position past them: from's batch drained when fewer than limit came
// back. Nothing is written: the rows become done when a saved position
// passes them. A paused projection reads nothing and stays where it is.
func (s *Store) ReadQueued(ctx context.Context, projection string, from Position, limit int, withLedger bool) ([]Event, Position, error) {
	sql := readQueuedSQL
	if withLedger {
		sql = readQueuedLedgerSQL
	}
	args := pgx.NamedArgs{"projection": projection, "tick": from.ticks(), "cur": from.Cur, "prev": from.Cur,
		"xid": from.XID, "after_id": from.ID, "limit": limit}
	if !from.ticks() {
		args["prev"] = from.Prev
	}
	br, err := s.sendAfter(ctx, queuedPlan, func(b *pgx.Batch) { b.Queue(sql, args); b.Queue("COMMIT") })
	if err != nil {
		return nil, from, fmt.Errorf("read queued: %w", err)
	}
	defer br.Close()
	events, cur, err := scanQueued(br, projection, limit, withLedger)
	if err != nil {
		return nil, from, err
	}
	if _, err := br.Exec(); err != nil {
		return nil, from, fmt.Errorf("read queued: commit: %w", err)
	}
	return events, advance(from, cur, events, limit), nil
}

// advance is the position past events, read from from in the batch ending
// at snapshot cur ("" when paused: nothing was read).
func advance(from Position, cur string, events []Event, limit int) Position {
	if cur == "" {
		return from
	}
	batch := from
	if from.ticks() {
		batch = Position{Prev: from.Cur, Cur: cur}
	}
	if len(events) < limit {
		return batch.Drained()
	}
	last := events[len(events)-1]
	batch.XID, batch.ID = last.XID, last.ID
	return batch
}

func scanQueued(br pgx.BatchResults, projection string, limit int, withLedger bool) ([]Event, string, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, "", fmt.Errorf("read queued: %w", err)
	}
	defer rows.Close()
	var events []Event
	var cur string
	row := newQueuedRow(&cur, withLedger)
	for rows.Next() {
		e, ok, err := row.scan(rows)
		if err != nil {
			return nil, "", fmt.Errorf("read queued: %w", err)
		}
		if !ok {
			continue
		}
		if events == nil {
			// Made at the first row, an idle leader's empty reads
			// (several a second) allocate nothing; a trickle's small
			// batches take no room for a whole limit.
			events = make([]Event, 0, min(limit, 64))
		}
		e.Projection = projection
		events = append(events, e)
	}
	return events, cur, rows.Err()
}

// queuedRow holds the scan targets of the read's rows, made once per read
// and reused for every row: fresh targets per row were a dozen allocations
// each, 8% of the loop's own CPU in the bench's Postgres path with the
// collector's work behind them. The payload starts nil on every row, so
// no event shares a buffer with the next.
type queuedRow struct {
	id, version                                     pgtype.Int8
	xid8                                            pgtype.Uint64
	entityType, entityID, op, scopeKey, traceparent pgtype.Text
	attempts                                        pgtype.Int4
	created                                         pgtype.Timestamptz
	repair                                          pgtype.Bool
	payload                                         []byte
	appliedVersion, appliedEventID                  pgtype.Int8
	appliedDeleted                                  pgtype.Bool
	dest                                            []any
}

func newQueuedRow(cur *string, withLedger bool) *queuedRow {
	r := &queuedRow{}
	r.dest = []any{cur, &r.id, &r.xid8, &r.entityType, &r.entityID, &r.op, &r.version, &r.payload, &r.scopeKey,
		&r.attempts, &r.created, &r.repair, &r.traceparent}
	if withLedger {
		r.dest = append(r.dest, &r.appliedVersion, &r.appliedEventID, &r.appliedDeleted)
	}
	return r
}

// scan scans one row of the read; the row of an empty batch has only the
// snapshot, and gives no event (false).
func (r *queuedRow) scan(rows pgx.Rows) (Event, bool, error) {
	r.payload = nil
	if err := rows.Scan(r.dest...); err != nil {
		return Event{}, false, err
	}
	if !r.id.Valid {
		return Event{}, false, nil
	}
	e := Event{ID: r.id.Int64, XID: r.xid8.Uint64, EntityType: r.entityType.String, EntityID: r.entityID.String,
		Op: r.op.String, Payload: r.payload, Attempts: int(r.attempts.Int32), CreatedAt: r.created.Time,
		DueAt: r.created.Time, Repair: r.repair.Bool, Traceparent: r.traceparent.String, Queued: true}
	e.setNullable(r.version, r.scopeKey, nil)
	if r.appliedVersion.Valid {
		e.Applied = &Applied{Version: r.appliedVersion.Int64, EventID: r.appliedEventID.Int64, Deleted: r.appliedDeleted.Bool}
	}
	return e, true, nil
}

// Checkpoint is what a leader saves of one projection's position: what it
// confirmed, what it has read and holds in flight, and since when.
type Checkpoint struct {
	Projection string
	Done       Position
	Claimed    Position
	// InFlightSince is when the oldest batch in flight was read; zero when
	// none is.
	InFlightSince time.Time
	// DoneEvents counts the events confirmed since the last checkpoint.
	DoneEvents int64
}

// saveSQL writes checkpoints under the leader's fencing guard: a deposed
// leader's position moves nothing. One row per projection, updated in
// place at most once a second (the loop's checkpointEvery) whatever the
// rate, so a held horizon keeps a few thousand versions of it an hour.
const saveSQL = `
WITH saved AS (
INSERT INTO outbox_positions AS p (projection, done_prev, done_cur, done_xid, done_id,
       claimed_prev, claimed_cur, claimed_xid, claimed_id, locked_by, epoch, lease_until,
       processing_started_at, done_events, confirmed_at, saved_by, updated_at)
SELECT u.projection, u.done_prev::pg_snapshot, u.done_cur::pg_snapshot, u.done_xid, u.done_id,
       u.claimed_prev::pg_snapshot, u.claimed_cur::pg_snapshot, u.claimed_xid, u.claimed_id,
       CASE WHEN u.since IS NOT NULL THEN @owner::text END, @epoch::bigint,
       CASE WHEN u.since IS NOT NULL THEN now() + make_interval(secs => @lease_secs) END,
       u.since, u.done_events, CASE WHEN u.done_events > 0 THEN now() END, @owner::text, now()
  FROM unnest(@projection::text[], @done_prev::text[], @done_cur::text[], @done_xid::xid8[], @done_id::bigint[],
              @claimed_prev::text[], @claimed_cur::text[], @claimed_xid::xid8[], @claimed_id::bigint[],
              @since::timestamptz[], @done_events::bigint[])
       AS u(projection, done_prev, done_cur, done_xid, done_id, claimed_prev, claimed_cur, claimed_xid,
            claimed_id, since, done_events)
 WHERE ` + leaderGuard + `
ON CONFLICT (projection) DO UPDATE
   SET done_prev = excluded.done_prev, done_cur = excluded.done_cur, done_xid = excluded.done_xid,
       done_id = excluded.done_id, claimed_prev = excluded.claimed_prev, claimed_cur = excluded.claimed_cur,
       claimed_xid = excluded.claimed_xid, claimed_id = excluded.claimed_id, locked_by = excluded.locked_by,
       epoch = excluded.epoch, lease_until = excluded.lease_until,
       processing_started_at = excluded.processing_started_at,
       done_events = p.done_events + excluded.done_events,
       confirmed_at = coalesce(excluded.confirmed_at, p.confirmed_at), saved_by = excluded.saved_by,
       updated_at = excluded.updated_at
RETURNING projection
), minute AS (
INSERT INTO outbox_done_by_minute AS m (minute, projection, done)
SELECT date_trunc('minute', now()), u.projection, u.done
  FROM unnest(@projection::text[], @done_events::bigint[]) AS u(projection, done)
 WHERE u.done > 0 AND u.projection IN (SELECT projection FROM saved)
ON CONFLICT (minute, projection) DO UPDATE SET done = m.done + excluded.done
)
SELECT projection FROM saved`

// SaveCheckpoints writes the projections' checkpoints in one statement and
// reports how many the fencing guard let through (0 once deposed).
func (s *Store) SaveCheckpoints(ctx context.Context, epoch int64, lease time.Duration, cps []Checkpoint) (int, error) {
	if len(cps) == 0 {
		return 0, nil
	}
	cols := checkpointColumns(cps)
	cols["lease_secs"] = lease.Seconds()
	ids, err := s.strings(ctx, saveSQL, s.args(epoch, cols))
	if err != nil {
		return 0, fmt.Errorf("save positions: %w", err)
	}
	return len(ids), nil
}

// checkpointColumns turns checkpoints into the arrays saveSQL unnests.
func checkpointColumns(cps []Checkpoint) map[string]any {
	n := len(cps)
	name, dp, dc, cp, cc := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	dx, cx := make([]uint64, n), make([]uint64, n)
	di, ci, de := make([]int64, n), make([]int64, n), make([]int64, n)
	since := make([]pgtype.Timestamptz, n)
	for i, c := range cps {
		name[i], de[i] = c.Projection, c.DoneEvents
		dp[i], dc[i], dx[i], di[i] = c.Done.Prev, c.Done.Cur, c.Done.XID, c.Done.ID
		cp[i], cc[i], cx[i], ci[i] = c.Claimed.Prev, c.Claimed.Cur, c.Claimed.XID, c.Claimed.ID
		since[i] = pgtype.Timestamptz{Time: c.InFlightSince, Valid: !c.InFlightSince.IsZero()}
	}
	return map[string]any{"projection": name, "done_prev": dp, "done_cur": dc, "done_xid": dx, "done_id": di,
		"claimed_prev": cp, "claimed_cur": cc, "claimed_xid": cx, "claimed_id": ci, "since": since, "done_events": de}
}

func (s *Store) strings(ctx context.Context, sql string, args pgx.NamedArgs) ([]string, error) {
	var out []string
	err := s.byKey(ctx, sql, args, func(rows pgx.Rows) error {
		var v string
		err := rows.Scan(&v)
		out = append(out, v)
		return err
	})
	return out, err
}
