package outbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/policy"
)

// The audit log, outbox_replay_audit, is written and read here: every
// operator action that changes state writes one row in its own transaction
// (WriteAudit); the console and the auto-replay's budget read them.

// Audit is one row of outbox_replay_audit, the trail of every operator
// action that changes state (replay, discard, archive, restore, pause,
// resume, rebuild): who, why, what (Selector, as JSON) and on which events.
type Audit struct {
	Action, By, Why string
	Selector        any
	// EventIDs are the events acted on; Count is their number, or what the
	// action counts instead (a rebuild's rows).
	EventIDs []int64
	Count    int64
	// Projection is the projection an action takes as a whole (a pause,
	// a rebuild), recorded with every scope of it; empty for an action on
	// events, whose pairs of projection and scope key the insert reads.
	Projection string
}

// auditSQL records the row with the actor and request id of the context,
// and the (projection, scope key) pairs of the events it took, read from
// the outbox and the dead letter by primary key in the action's own
// transaction, where an archive or a restore has moved them already.
const auditSQL = `
INSERT INTO outbox_replay_audit (action, replayed_by, reason, selector, event_count, event_ids,
                                 actor, request_id, projections, scope_keys)
SELECT $1, $2, $3, $4::jsonb, $5, $6, $7::jsonb, $8, t.projections, t.scope_keys
  FROM (SELECT array_agg(p ORDER BY p, s) AS projections, array_agg(s ORDER BY p, s) AS scope_keys
          FROM (SELECT projection AS p, coalesce(scope_key, '') AS s FROM outbox_events WHERE id = ANY($6)
                UNION
                SELECT projection, coalesce(scope_key, '') FROM outbox_dead_letter WHERE id = ANY($6)
                UNION
                SELECT $9::text, NULL WHERE $9::text IS NOT NULL) pairs) t
RETURNING id, replayed_at`

// auditBefore27SQL records a row on a schema of before 27, which has no
// actor, request id or pairs: a rollback's own row (migrations), written
// before it undoes anything, on a database a rollback left there.
const auditBefore27SQL = `
INSERT INTO outbox_replay_audit (action, replayed_by, reason, selector, event_count, event_ids)
VALUES ($1, $2, $3, $4::jsonb, $5, $6)
RETURNING id, replayed_at`

// AuditActorVersion is the migration that adds the audit's actor columns.
const AuditActorVersion = 27

// WriteAuditBefore27 is WriteAudit on a schema of before 27.
func WriteAuditBefore27(ctx context.Context, tx pgx.Tx, a Audit) (int64, time.Time, error) {
	args, err := a.args()
	if err != nil {
		return 0, time.Time{}, err
	}
	return insertAudit(ctx, tx, auditBefore27SQL, args...)
}

// WriteAudit inserts a in tx, with the actor of ctx (policy.From), and
// returns its id and time.
func WriteAudit(ctx context.Context, tx pgx.Tx, a Audit) (int64, time.Time, error) {
	args, err := a.args()
	if err != nil {
		return 0, time.Time{}, err
	}
	var actor, requestID any
	if who := policy.From(ctx); who != nil {
		if who.User == "" {
			// The CLI's actor is named by each command's --by.
			cp := *who
			cp.User, who = a.By, &cp
		}
		b, err := json.Marshal(who)
		if err != nil {
			return 0, time.Time{}, fmt.Errorf("audit actor: %w", err)
		}
		actor, requestID = string(b), who.RequestID
	}
	return insertAudit(ctx, tx, auditSQL, append(args, actor, requestID, nullIfZero(a.Projection))...)
}

// args are the parameters both inserts begin with.
func (a Audit) args() ([]any, error) {
	sel, err := json.Marshal(a.Selector)
	if err != nil {
		return nil, fmt.Errorf("audit selector: %w", err)
	}
	ids := a.EventIDs
	if ids == nil {
		ids = []int64{}
	}
	return []any{a.Action, a.By, a.Why, string(sel), a.Count, ids}, nil
}

func insertAudit(ctx context.Context, tx pgx.Tx, sql string, args ...any) (int64, time.Time, error) {
	var id int64
	var at time.Time
	if err := tx.QueryRow(ctx, sql, args...).Scan(&id, &at); err != nil {
		return 0, time.Time{}, fmt.Errorf("audit: %w", err)
	}
	return id, at, nil
}

// The page of AuditLog.
const AuditLimitDefault = 50

// AuditLimitRange is what AuditFilter.Limit accepts.
var AuditLimitRange = bounds.Range[int]{Min: 1, Max: 1000}

// ErrNotFound is an id that names no row.
var ErrNotFound = errors.New("not found")

// AuditEntry is one row of outbox_replay_audit: one action by one person
// (or policy) on a set of rows.
type AuditEntry struct {
	ID     int64     `json:"id"`
	Action string    `json:"action"`
	By     string    `json:"by"`
	Why    string    `json:"why"`
	At     time.Time `json:"at"`
	Count  int       `json:"count"`
	IDs    []int64   `json:"ids"`
	// Selector is what was asked for, as stored: the resolved selector and,
	// under "given", what the person typed.
	Selector json.RawMessage `json:"selector"`
	// Actor is who acted, in full (policy.Actor as JSON), and RequestID the
	// id their log lines and trace carry; both empty on rows of before 27.
	Actor     json.RawMessage `json:"actor,omitempty"`
	RequestID string          `json:"request_id,omitempty"`
}

// AuditFilter selects audit rows; zero fields do not filter.
type AuditFilter struct {
	Action string
	By     string
	// Text matches rows whose why contains it, ignoring case.
	Text string
	// Since (inclusive) and Until (exclusive) bound the time of the action.
	Since, Until time.Time
	// EventID selects the actions that took this row.
	EventID int64
	// Before pages back: only rows with a smaller id.
	Before int64
	// Limit caps the rows. Defaults to AuditLimitDefault.
	Limit int
	// Allowed holds the rows to those whose every (projection, scope key)
	// pair it allows (policy.Grants.Allowed); rows that record no pairs
	// (of before 27) only a nil Allowed, every scope, sees. Nil: all rows.
	Allowed *policy.Allowed
}

const auditListSQL = `
SELECT id, action, replayed_by, reason, replayed_at, event_count, event_ids, selector, actor, coalesce(request_id, '')
  FROM outbox_replay_audit
 WHERE ($1::text IS NULL OR action = $1)
   AND ($2::text IS NULL OR replayed_by = $2)
   AND ($3::text IS NULL OR strpos(lower(reason), lower($3)) > 0)
   AND ($4::timestamptz IS NULL OR replayed_at >= $4)
   AND ($5::timestamptz IS NULL OR replayed_at < $5)
   AND ($6::bigint IS NULL OR event_ids @> ARRAY[$6::bigint])
   AND ($7::bigint IS NULL OR id < $7)
   AND ($9::text[] IS NULL OR (projections IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM unnest(projections, scope_keys) AS took(p, s)
         WHERE NOT EXISTS (SELECT 1 FROM unnest($9::text[], $10::text[]) AS g(p, s)
                            WHERE took.p LIKE g.p AND CASE WHEN took.s IS NULL THEN g.s = '%' ELSE took.s LIKE g.s END))))
 ORDER BY id DESC
 LIMIT $8`

// AuditLog lists audit rows matching f, newest first.
func AuditLog(ctx context.Context, db Querier, f AuditFilter) ([]AuditEntry, error) {
	f.Limit = cmp.Or(f.Limit, AuditLimitDefault)
	if err := bounds.Check("Limit", f.Limit, AuditLimitRange); err != nil {
		return nil, err
	}
	var eventID, before any
	if f.EventID != 0 {
		eventID = f.EventID
	}
	if f.Before != 0 {
		before = f.Before
	}
	rows, err := db.Query(ctx, auditListSQL, nullIfZero(f.Action), nullIfZero(f.By), nullIfZero(f.Text),
		nullIfZero(f.Since), nullIfZero(f.Until), eventID, before, f.Limit, f.Allowed.ProjectionsArg(), f.Allowed.ScopesArg())
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	entries, err := pgx.CollectRows(rows, scanAudit)
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	return entries, nil
}

// ReadAudit reads one audit row; ErrNotFound if there is none.
func ReadAudit(ctx context.Context, db Querier, id int64) (AuditEntry, error) {
	rows, err := db.Query(ctx, `
SELECT id, action, replayed_by, reason, replayed_at, event_count, event_ids, selector, actor, coalesce(request_id, '')
  FROM outbox_replay_audit WHERE id = $1`, id)
	if err != nil {
		return AuditEntry{}, fmt.Errorf("audit %d: %w", id, err)
	}
	a, err := pgx.CollectExactlyOneRow(rows, scanAudit)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return a, fmt.Errorf("audit %d: %w", id, ErrNotFound)
	case err != nil:
		return a, fmt.Errorf("audit %d: %w", id, err)
	}
	return a, nil
}

func scanAudit(r pgx.CollectableRow) (AuditEntry, error) {
	var a AuditEntry
	var sel []byte
	var actor []byte
	err := r.Scan(&a.ID, &a.Action, &a.By, &a.Why, &a.At, &a.Count, &a.IDs, &sel, &actor, &a.RequestID)
	a.Selector, a.Actor = sel, actor
	return a, err
}

const auditedSinceSQL = `
SELECT coalesce(sum(event_count), 0) FROM outbox_replay_audit
 WHERE replayed_by = $1 AND replayed_at > now() - make_interval(secs => $2)`

// AuditedSince is how many events the actions of by took within the last
// window: the auto-replay's spent budget.
func AuditedSince(ctx context.Context, db Querier, by string, window time.Duration) (int, error) {
	var n int
	if err := db.QueryRow(ctx, auditedSinceSQL, by, window.Seconds()).Scan(&n); err != nil {
		return 0, fmt.Errorf("audited since: %w", err)
	}
	return n, nil
}

// nullIfZero is v, or NULL for an empty string or a zero time: an unset
// filter.
func nullIfZero(v any) any {
	switch x := v.(type) {
	case string:
		if x == "" {
			return nil
		}
	case time.Time:
		if x.IsZero() {
			return nil
		}
	}
	return v
}
