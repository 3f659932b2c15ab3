package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// HistoryKeep bounds error_history: the newest entries are what triage
// needs. Every writer of the history (acks, reclaim, replay) keeps this many.
const HistoryKeep = 20

// Store runs the leader's statements on the outbox. Owner and LeaderName are
// fixed per replica; the epoch (fencing token) is passed per call because it
// changes with every election.
type Store struct {
	Pool       *pgxpool.Pool
	Owner      string
	LeaderName string

	// claims numbers this replica's claims. With the epoch it makes each
	// claim's token unique, so an ack of a batch whose rows were reclaimed
	// and claimed again in the same term matches nothing.
	claims atomic.Int64
}

// leaderGuard makes a statement a no-op unless $epoch is still the current
// epoch of this leader name.
const leaderGuard = `EXISTS (SELECT 1 FROM outbox_leader WHERE name = @leader AND epoch = @epoch)`

// claimSQL claims the due pending rows, oldest due first, each with its
// document's ledger entry when its projection keeps one (@latest,
// projection.LatestOnly): the chronicle's events need none, so the claim
// reads none for them.
//
// It reads outbox_events_due_idx (projection, next_retry_at, id) one
// projection at a time: the projections with pending rows come from a skip
// scan of that index (one probe each), paused ones are left out before any
// of their rows is read, and in each the walk stops at the first row not yet
// due. So neither a paused projection's backlog nor rows waiting out a
// backoff cost the claim anything. Projections the binary does not know are
// claimed too, and failed as unknown_projection. The candidates are then
// locked one by one through the primary key (an array, so that no
// statistics can turn it into a join over every pending row), skipping rows
// another transaction holds (a replay, an ack), and status is checked again
// on the locked row. That check compares with a subquery's value, which no
// partial index's predicate matches: with statistics that say "empty" the
// planner otherwise found the pending indexes as cheap as the primary key,
// and a full walk of the due index for each claim collapsed a 2,000/s
// burst (52 ms a claim, lag 23 s).
var claimSQL = strings.NewReplacer("{{projections}}", `
      WITH RECURSIVE pending_projections AS (
          (SELECT projection FROM outbox_events WHERE status = 'pending' ORDER BY projection LIMIT 1)
        UNION ALL
          SELECT (SELECT n.projection FROM outbox_events n
                   WHERE n.status = 'pending' AND n.projection > p.projection
                   ORDER BY n.projection LIMIT 1)
            FROM pending_projections p WHERE p.projection IS NOT NULL)`, "{{cursor}}", "").Replace(claimSQLText)

// claimPastSQL is the claim past a cursor: only rows after the last one the
// leader claimed in its term, of the projections it names (@projections).
// Rows claimed before stay in the due index until vacuum, and while any
// older snapshot is open (a long report, an analyze) the claim cannot skip
// them: from the head it visited 20k of them in 120 ms; past the cursor it
// visits none, and the projections' probe, which would walk them too, is
// replaced by the list.
var claimPastSQL = strings.NewReplacer("{{projections}}", `
      WITH pending_projections AS (SELECT unnest(@projections::text[]) AS projection)`, "{{cursor}}", `
                              AND (next_retry_at, id) > (@after_at, @after_id)`).Replace(claimSQLText)

const claimSQLText = `
UPDATE outbox_events e
   SET status = 'processing', locked_by = @owner, claim_token = @epoch, claim_seq = @claim,
       lease_until = now() + make_interval(secs => @lease_secs),
       processing_started_at = now(), updated_at = now()
 WHERE e.id IN (
   SELECT o.id FROM outbox_events o
    WHERE o.id = ANY(ARRAY({{projections}}
      SELECT due.id FROM pending_projections p
       CROSS JOIN LATERAL (SELECT id, next_retry_at FROM outbox_events
                            WHERE status = 'pending' AND projection = p.projection AND next_retry_at <= now(){{cursor}}
                            ORDER BY next_retry_at, id LIMIT @limit) due
       WHERE p.projection IS NOT NULL
         AND p.projection NOT IN (SELECT projection FROM outbox_projection_state WHERE paused)
       ORDER BY due.next_retry_at, due.id LIMIT @limit))
      AND o.status = (SELECT 'pending')
    FOR UPDATE SKIP LOCKED)
   AND ` + leaderGuard + `
RETURNING e.id, e.projection, e.entity_type, e.entity_id, e.op, e.event_version,
          e.payload, e.scope_key, e.attempts, e.created_at, e.repair, e.traceparent, e.next_retry_at,
          CASE WHEN e.projection = ANY(@latest::text[]) THEN
            (SELECT ARRAY[a.version, a.event_id, a.deleted::int] FROM outbox_ledger_entry(e.projection, e.entity_type, e.entity_id) a)
          END`

// claimStatement is the claim past after, of the named projections, or
// from the head when after is nil, with the cursor's arguments.
func claimStatement(after *Cursor, projections []string) (string, pgx.NamedArgs) {
	if after == nil {
		return claimSQL, pgx.NamedArgs{}
	}
	return claimPastSQL, pgx.NamedArgs{"after_at": after.DueAt, "after_id": after.ID, "projections": projections}
}

// Cursor is where a claim starts: past the row due at DueAt with id ID, in
// the order the claim takes rows.
type Cursor struct {
	DueAt time.Time
	ID    int64
}

// After reports whether c is past d in claim order.
func (c Cursor) After(d Cursor) bool {
	return c.DueAt.After(d.DueAt) || (c.DueAt.Equal(d.DueAt) && c.ID > d.ID)
}

// CursorOf is the cursor past the last of events in claim order, nil if
// there are none.
func CursorOf(events []Event) *Cursor {
	var c *Cursor
	for _, e := range events {
		if ec := (Cursor{DueAt: e.DueAt, ID: e.ID}); c == nil || ec.After(*c) {
			c = &ec
		}
	}
	return c
}

// Claim moves up to limit due pending rows, oldest due first, to processing under
// this owner, epoch and a claim number of their own (Event.Claim), each
// event of a projection named in latest (the ones that keep a ledger) with
// its document's ledger entry.
func (s *Store) Claim(ctx context.Context, epoch int64, limit int, lease time.Duration, latest []string) ([]Event, error) {
	return s.ClaimAfter(ctx, epoch, limit, lease, latest, nil, nil)
}

// ClaimAfter is Claim of the rows past after only, of the projections
// named (nil after: from the head, of every projection). A row that
// becomes due behind the cursor (a producer's transaction that commits
// late, a row released or skipped while locked, a projection resumed) or
// of a projection not named is left to the next claim from the head: the
// caller makes one regularly.
func (s *Store) ClaimAfter(ctx context.Context, epoch int64, limit int, lease time.Duration, latest []string, after *Cursor, projections []string) ([]Event, error) {
	if latest == nil {
		latest = []string{}
	}
	claim := s.claims.Add(1)
	sql, args := claimStatement(after, projections)
	for k, v := range map[string]any{"limit": limit, "lease_secs": lease.Seconds(), "claim": claim, "latest": latest} {
		args[k] = v
	}
	br, err := s.sendAfter(ctx, claimPlan, func(batch *pgx.Batch) {
		batch.Queue(sql, s.args(epoch, args))
		batch.Queue("COMMIT")
	})
	if err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	defer br.Close()
	events, err := scanClaimed(br, claim)
	if err != nil {
		return nil, err
	}
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("claim: commit: %w", err)
	}
	return events, nil
}

// claimPlan opens the claim's transaction with a plan that does not depend
// on the outbox's statistics. Right after the outbox was emptied and
// analyzed (a new install, a truncate), the planner thinks it has a few
// rows and reads every pending one through a bitmap scan, then sorts them:
// 64 ms a claim on 200k pending rows instead of 0.4 ms for the index walk,
// enough to put the leader minutes behind a burst until autovacuum analyzes
// the table again. With sorts priced out, the one sort left (of at most
// limit rows per projection) makes the statement look expensive enough for
// JIT, which would compile it on every claim (~200 ms): JIT is off too.
// Sequential scans are off too: Postgres caches the claim's plan on each
// connection, and one made while the outbox and the ledger were empty reads
// both whole, the ledger once per claimed event, until the next analyze
// (1.2 s a claim of 500 next to 30k ledger entries: 18 s of lag at 2,000
// events/s in the bench's emptied outbox). The settings go in one
// statement: the batch is one round trip, but each statement still costs
// the server a parse and an execution per claim.
var claimPlan = []string{"BEGIN",
	"SELECT set_config('enable_sort', 'off', true), set_config('enable_bitmapscan', 'off', true), set_config('enable_seqscan', 'off', true), set_config('jit', 'off', true)"}

func scanClaimed(br pgx.BatchResults, claim int64) ([]Event, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	defer rows.Close()
	var events []Event
	for rows.Next() {
		var e Event
		// Nullable columns scan into pgtype values: into a pointer, pgx
		// allocates its target by reflection.
		var version pgtype.Int8
		var scopeKey, traceparent pgtype.Text
		var payload []byte
		var applied []int64
		if err := rows.Scan(&e.ID, &e.Projection, &e.EntityType, &e.EntityID, &e.Op, &version,
			&payload, &scopeKey, &e.Attempts, &e.CreatedAt, &e.Repair, &traceparent, &e.DueAt, &applied); err != nil {
			return nil, fmt.Errorf("claim: %w", err)
		}
		e.Payload, e.Claim, e.Traceparent = payload, claim, traceparent.String
		e.setNullable(version, scopeKey, applied)
		events = append(events, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	slices.SortFunc(events, func(a, b Event) int { return int(a.ID - b.ID) })
	return events, nil
}

// setNullable sets the event's nullable fields from what a claim or a read
// of queued rows scanned: the producer's version and scope, and the
// document's ledger entry (version, event id, deleted as 0/1).
func (e *Event) setNullable(version pgtype.Int8, scopeKey pgtype.Text, applied []int64) {
	if version.Valid {
		e.EventVersion = &version.Int64
	}
	if scopeKey.Valid {
		e.ScopeKey = &scopeKey.String
	}
	if len(applied) == 3 {
		e.Applied = &Applied{Version: applied[0], EventID: applied[1], Deleted: applied[2] == 1}
	}
}

// ackDoneSQL marks rows done and, in the same statement, moves the ledger
// forward for the applied ones: it inserts the newest (version, id) per
// document, and a document's entry is its row of highest (version, id)
// (see outbox_ledger_entry), so an older one never moves it back. Nothing is
// updated: no dead version is left for a held horizon to keep. A fenced
// ack changes no row, so it moves no ledger entry.
// A done row's error columns are cleared, so that a query for rows failing
// with a reason finds no done ones; error_history keeps what happened.
const ackDoneSQL = `
WITH acked AS (
  UPDATE outbox_events
     SET status = 'done', processed_at = now(), updated_at = now(), lease_until = NULL,
         error_class = NULL, error_reason = NULL, last_error = NULL
   WHERE id = ANY(@ids) AND status = 'processing' AND locked_by = @owner AND claim_token = @epoch
     AND claim_seq = @claim AND ` + leaderGuard + `
  RETURNING id, projection, entity_type, entity_id, op, coalesce(event_version, id) AS version,
            extract(epoch FROM processed_at - created_at) AS secs
` + ackLedgerSQL

// ackQueuedSQL is ackDoneSQL for queued rows: it writes no row of theirs
// (they are done once the position passes them), only the ledger, and
// matches the rows still queued under the leader's fencing guard. It says
// whether the guard held (led) beside the rows, in the same snapshot: a
// row missing while the guard held left the queue meanwhile (an earlier
// read's failure made it pending, an operator discarded it), and its read
// may still be confirmed; missing because the guard failed, it is the
// next leader's.
const ackQueuedSQL = `
WITH acked AS (
  SELECT id, projection, entity_type, entity_id, op, coalesce(event_version, id) AS version,
         extract(epoch FROM now() - created_at) AS secs
    FROM outbox_events
   WHERE id = ANY(@ids) AND status = 'queued' AND ` + leaderGuard + `
` + ackLedgerCTEs + `
SELECT g.led, a.id, a.secs FROM (SELECT ` + leaderGuard + ` AS led) g LEFT JOIN acked a ON true`

// ackLedgerCTEs moves the ledger for the acked rows named in @applied. The
// partition is read once per statement (an InitPlan), not per row as the
// column's default would.
const ackLedgerCTEs = `), newest AS (
  SELECT DISTINCT ON (projection, entity_type, entity_id) projection, entity_type, entity_id, version, op, id
    FROM acked WHERE id = ANY(@applied)
   ORDER BY projection, entity_type, entity_id, version DESC, id DESC
), ledger AS (
  INSERT INTO outbox_ledger (slot, projection, entity_type, entity_id, version, deleted, event_id, applied_at)
  SELECT (SELECT outbox_ledger_slot()), projection, entity_type, entity_id, version, op = 'delete', id, now() FROM newest
)`

const ackLedgerSQL = ackLedgerCTEs + `
SELECT id, secs FROM acked`

// AckDone marks rows of one claim done and records the applied ones (a
// subset of ids: not superseded) in the ledger. It returns, per row actually
// changed, the seconds from insert to ack; rows missing from the result
// failed the fencing guard (another epoch, or another claim).
func (s *Store) AckDone(ctx context.Context, epoch, claim int64, ids, applied []int64) (map[int64]float64, error) {
	return s.ackDone(ctx, ackDoneSQL, epoch, claim, ids, applied)
}

// AckQueuedDone is AckDone of queued rows (read by position): it writes
// only the ledger, and returns the rows still queued when the fencing guard
// let it through; their position's next checkpoint makes them done.
// It returns ErrDeposed when the fencing guard refused it: the epoch is not this
// leader's any more, and nothing changed.
func (s *Store) AckQueuedDone(ctx context.Context, epoch int64, ids, applied []int64) (map[int64]float64, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	if applied == nil {
		applied = []int64{}
	}
	acked := make(map[int64]float64, len(ids))
	var secs pgtype.Float8
	led, err := s.guarded(ctx, ackQueuedSQL, s.args(epoch, map[string]any{"ids": ids, "applied": applied}),
		[]any{&secs}, func(id int64) { acked[id] = secs.Float64 })
	if err != nil {
		return nil, fmt.Errorf("ack done: %w", err)
	}
	if !led {
		return nil, fmt.Errorf("ack done: %w", ErrDeposed)
	}
	return acked, nil
}

// ErrDeposed says a queued row's ack was refused by the fencing guard: the
// leader's epoch is over. Rows missing from an ack that returns no error
// left the queue meanwhile instead.
var ErrDeposed = errors.New("deposed: the epoch is no longer this leader's")

// guarded runs a statement whose rows are (led, id, extra...): led on
// every row, with a null id on the one row when none matched; each is
// called for every row with an id, once extra holds its values.
func (s *Store) guarded(ctx context.Context, sql string, args pgx.NamedArgs, extra []any, each func(int64)) (bool, error) {
	var led bool
	var id pgtype.Int8
	dest := append([]any{&led, &id}, extra...)
	err := s.byKey(ctx, sql, args, func(rows pgx.Rows) error {
		if err := rows.Scan(dest...); err != nil {
			return err
		}
		if id.Valid {
			each(id.Int64)
		}
		return nil
	})
	return led, err
}

func (s *Store) ackDone(ctx context.Context, sql string, epoch, claim int64, ids, applied []int64) (map[int64]float64, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	if applied == nil {
		applied = []int64{}
	}
	acked := make(map[int64]float64, len(ids))
	err := s.byKey(ctx, sql, s.args(epoch, map[string]any{"ids": ids, "applied": applied, "claim": claim}),
		func(rows pgx.Rows) error {
			var id int64
			var secs float64
			err := rows.Scan(&id, &secs)
			acked[id] = secs
			return err
		})
	if err != nil {
		return nil, fmt.Errorf("ack done: %w", err)
	}
	return acked, nil
}

// sendAfter sends plan's statements, then those queue adds, in one round
// trip, and reads plan's results; the caller reads the rest and closes br.
func (s *Store) sendAfter(ctx context.Context, plan []string, queue func(*pgx.Batch)) (pgx.BatchResults, error) {
	batch := &pgx.Batch{}
	for _, stmt := range plan {
		batch.Queue(stmt)
	}
	queue(batch)
	br := s.Pool.SendBatch(ctx, batch)
	for range plan {
		if _, err := br.Exec(); err != nil {
			br.Close()
			return nil, err
		}
	}
	return br, nil
}

// byKeyPlan turns sequential scans off for one statement that finds its rows
// by key (ids): its plan, cached on the connection, may have been made when
// the outbox was empty, and would then read the whole outbox for each ack.
// JIT goes off with them: a plan that had to keep a disabled scan (a table
// without a usable index) costs enough to be compiled on every run.
var byKeyPlan = []string{"SELECT set_config('enable_seqscan', 'off', true), set_config('jit', 'off', true)"}

// byKey runs sql after byKeyPlan, in one round trip and one implicit
// transaction (the setting ends with it), and calls each for every row.
func (s *Store) byKey(ctx context.Context, sql string, args pgx.NamedArgs, each func(pgx.Rows) error) error {
	br, err := s.sendAfter(ctx, byKeyPlan, func(batch *pgx.Batch) { batch.Queue(sql, args) })
	if err != nil {
		return err
	}
	defer br.Close()
	rows, err := br.Query()
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := each(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// Failure is how one event failed and what happens to it next.
type Failure struct {
	ID      int64
	Class   string
	Reason  string
	Message string
	// Terminal sends the row to failed; otherwise it goes back to pending
	// and becomes due after RetryIn.
	Terminal bool
	RetryIn  time.Duration
}

const ackFailedSQLText = `
UPDATE outbox_events e
   SET status = CASE WHEN u.terminal THEN 'failed' ELSE 'pending' END,
       attempts = e.attempts + 1,
       next_retry_at = now() + make_interval(secs => u.retry_secs),
       error_class = u.class, error_reason = u.reason, last_error = u.message,
       error_history = outbox_append_error(e.error_history, jsonb_build_object(
           'at', now(), 'attempt', e.attempts + 1, 'class', u.class, 'reason', u.reason,
           'error', u.message, 'worker', @owner::text, 'epoch', @epoch::bigint), @keep),
       lease_until = NULL, processing_started_at = NULL, updated_at = now()
  FROM unnest(@ids::bigint[], @terminal::bool[], @retry_secs::float8[], @class::text[],
              @reason::text[], @message::text[]) AS u(id, terminal, retry_secs, class, reason, message)
 WHERE e.id = u.id AND {{match}}
RETURNING e.id`

// ackFailedSQL matches rows of one claim; ackQueuedFailedSQL rows still
// queued: a failure is the first write a queued row gets, and takes it out
// of the position's reach (pending with its backoff, or failed).
var (
	ackFailedSQL = strings.Replace(ackFailedSQLText, "{{match}}", `e.status = 'processing' AND e.locked_by = @owner
   AND e.claim_token = @epoch AND e.claim_seq = @claim AND `+leaderGuard, 1)
	ackQueuedFailedSQL = `WITH changed AS (` +
		strings.Replace(ackFailedSQLText, "{{match}}", `e.status = 'queued' AND `+leaderGuard, 1) + `)
SELECT g.led, c.id FROM (SELECT ` + leaderGuard + ` AS led) g LEFT JOIN changed c ON true`
)

// AckFailed records failures of one claim: retry (back to pending with
// backoff) or terminal. Errors are appended to error_history, never
// overwritten there. It returns the ids actually changed.
func (s *Store) AckFailed(ctx context.Context, epoch, claim int64, failures []Failure) ([]int64, error) {
	return s.ackFailed(ctx, ackFailedSQL, epoch, claim, failures)
}

// AckQueuedFailed is AckFailed of queued rows: each becomes pending with its
// backoff, or failed, with its error in history, as a claimed row would.
// Like AckQueuedDone, it returns ErrDeposed when the fencing guard refused
// it, and rows missing otherwise left the queue meanwhile.
func (s *Store) AckQueuedFailed(ctx context.Context, epoch int64, failures []Failure) ([]int64, error) {
	if len(failures) == 0 {
		return nil, nil
	}
	var changed []int64
	led, err := s.guarded(ctx, ackQueuedFailedSQL, s.args(epoch, failureColumns(failures)), nil,
		func(id int64) { changed = append(changed, id) })
	if err != nil {
		return nil, fmt.Errorf("ack failed: %w", err)
	}
	if !led {
		return nil, fmt.Errorf("ack failed: %w", ErrDeposed)
	}
	return changed, nil
}

func (s *Store) ackFailed(ctx context.Context, sql string, epoch, claim int64, failures []Failure) ([]int64, error) {
	if len(failures) == 0 {
		return nil, nil
	}
	cols := failureColumns(failures)
	cols["claim"] = claim
	return s.ids(ctx, "ack failed", sql, s.args(epoch, cols))
}

// failureColumns turns failures into the arrays ackFailedSQLText unnests.
func failureColumns(failures []Failure) map[string]any {
	n := len(failures)
	ids, terminal, retry := make([]int64, n), make([]bool, n), make([]float64, n)
	class, reason, message := make([]string, n), make([]string, n), make([]string, n)
	for i, f := range failures {
		ids[i], terminal[i], retry[i] = f.ID, f.Terminal, f.RetryIn.Seconds()
		class[i], reason[i], message[i] = f.Class, f.Reason, truncate(f.Message, 2000)
	}
	return map[string]any{"ids": ids, "terminal": terminal, "retry_secs": retry, "class": class,
		"reason": reason, "message": message, "keep": HistoryKeep}
}

const releaseSQL = `
UPDATE outbox_events
   SET status = 'pending', next_retry_at = now(), lease_until = NULL,
       processing_started_at = NULL, updated_at = now()
 WHERE id = ANY(@ids) AND status = 'processing' AND locked_by = @owner AND claim_token = @epoch
   AND ` + leaderGuard + `
RETURNING id`

// Release puts claimed rows back to pending without counting an attempt:
// the graceful drain uses it for work it did not finish, whichever of its
// claims took them.
func (s *Store) Release(ctx context.Context, epoch int64, ids []int64) ([]int64, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	return s.ids(ctx, "release", releaseSQL, s.args(epoch, map[string]any{"ids": ids}))
}

const reclaimSQL = `
UPDATE outbox_events e
   SET status = CASE WHEN e.attempts + 1 >= @max_attempts THEN 'failed' ELSE 'pending' END,
       attempts = e.attempts + 1,
       next_retry_at = now(),
       error_class = CASE WHEN e.attempts + 1 >= @max_attempts THEN 'transient' ELSE e.error_class END,
       error_reason = CASE WHEN e.attempts + 1 >= @max_attempts THEN 'stuck' ELSE e.error_reason END,
       last_error = CASE WHEN e.attempts + 1 >= @max_attempts
                         THEN 'stuck in processing until attempts ran out' ELSE e.last_error END,
       error_history = outbox_append_error(e.error_history, jsonb_build_object(
           'at', now(), 'attempt', e.attempts + 1, 'event', 'stuck_reclaimed',
           'why', CASE WHEN e.claim_token < @epoch THEN 'claimed by an earlier leader'
                       WHEN e.lease_until < now() THEN 'lease expired'
                       ELSE 'processing longer than max_processing_seconds' END,
           'worker', e.locked_by, 'epoch', e.claim_token, 'reclaimed_by', @owner::text), @keep),
       lease_until = NULL, processing_started_at = NULL, updated_at = now()
 WHERE e.status = 'processing'
   AND (e.lease_until < now()
        OR e.processing_started_at < now() - make_interval(secs => @max_processing_secs)
        OR e.claim_token < @epoch)
   AND ` + leaderGuard + `
RETURNING e.id, e.projection, e.status`

// Row names one changed row.
type Row struct {
	ID         int64
	Projection string
}

// ReclaimResult lists what Reclaim did.
type ReclaimResult struct {
	Pending []Row
	Failed  []Row
}

// Reclaim returns stuck rows to pending with one more attempt, or to failed
// with reason stuck once attempts run out. Stuck means: lease expired,
// processing longer than maxProcessing, or claimed under an older epoch (the
// previous leader died with them in flight).
func (s *Store) Reclaim(ctx context.Context, epoch int64, maxProcessing time.Duration, maxAttempts int) (ReclaimResult, error) {
	rows, err := s.Pool.Query(ctx, reclaimSQL, s.args(epoch, map[string]any{
		"max_attempts": maxAttempts, "max_processing_secs": maxProcessing.Seconds(), "keep": HistoryKeep,
	}))
	if err != nil {
		return ReclaimResult{}, fmt.Errorf("reclaim: %w", err)
	}
	defer rows.Close()
	var res ReclaimResult
	for rows.Next() {
		var r Row
		var status string
		if err := rows.Scan(&r.ID, &r.Projection, &status); err != nil {
			return res, fmt.Errorf("reclaim: %w", err)
		}
		if status == "failed" {
			res.Failed = append(res.Failed, r)
		} else {
			res.Pending = append(res.Pending, r)
		}
	}
	return res, rows.Err()
}

func (s *Store) args(epoch int64, extra map[string]any) pgx.NamedArgs {
	a := pgx.NamedArgs{"owner": s.Owner, "epoch": epoch, "leader": s.LeaderName}
	for k, v := range extra {
		a[k] = v
	}
	return a
}

func (s *Store) ids(ctx context.Context, what, sql string, args pgx.NamedArgs) ([]int64, error) {
	var ids []int64
	err := s.byKey(ctx, sql, args, func(rows pgx.Rows) error {
		var id int64
		err := rows.Scan(&id)
		ids = append(ids, id)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return ids, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
