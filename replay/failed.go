package replay

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/wlproj/wlproj/outbox"
)

// Filter selects failed rows. Zero fields do not filter; set fields combine
// with AND.
type Filter struct {
	Projection string
	Reason     string
	// Since (inclusive) and Until (exclusive) bound the time of failure, the
	// row's updated_at.
	Since, Until time.Time
	EntityType   string
	ScopeKey     string
	// Limit caps List; zero lists every match. Stats ignores it.
	Limit int
}

// FailedEvent is a failed row as triage sees it.
type FailedEvent struct {
	ID          int64     `json:"id"`
	Projection  string    `json:"projection"`
	EntityType  string    `json:"entity_type"`
	EntityID    string    `json:"entity_id"`
	Op          string    `json:"op"`
	Attempts    int       `json:"attempts"`
	ErrorReason string    `json:"error_reason"`
	ErrorClass  string    `json:"error_class"`
	LastError   string    `json:"last_error"` // the first 300 characters
	UpdatedAt   time.Time `json:"updated_at"` // time of failure
	ReplayCount int       `json:"replay_count"`
	ScopeKey    string    `json:"scope_key"`
}

// Stat counts the failed rows of one projection and reason.
type Stat struct {
	Projection string    `json:"projection"`
	Reason     string    `json:"reason"`
	Class      string    `json:"class"`
	Count      int64     `json:"count"`
	Oldest     time.Time `json:"oldest"`
	Newest     time.Time `json:"newest"`
}

// failedWhere is shared by listing, stats and replay, with the parameters
// $1 projection, $2 reason, $3 since, $4 until, $5 entity_type, $6 scope_key,
// each NULL when not filtering. status = 'failed' as a literal lets the
// planner use the partial failed index.
const failedWhere = `status = 'failed'
   AND ($1::text IS NULL OR projection = $1)
   AND ($2::text IS NULL OR error_reason = $2)
   AND ($3::timestamptz IS NULL OR updated_at >= $3)
   AND ($4::timestamptz IS NULL OR updated_at < $4)
   AND ($5::text IS NULL OR entity_type = $5)
   AND ($6::text IS NULL OR scope_key = $6)`

// A listing carries only the start of last_error; the full text and the
// history stay in the row.
const failedColumns = `id, projection, entity_type, entity_id, op, attempts,
       coalesce(error_reason, ''), coalesce(error_class, ''),
       left(coalesce(last_error, ''), 300), updated_at, replay_count, coalesce(scope_key, '')`

// Newest failures first: triage usually starts from what just broke. $7 is
// the limit, NULL for all.
const listSQL = `SELECT ` + failedColumns + `
  FROM outbox_events
 WHERE ` + failedWhere + `
 ORDER BY updated_at DESC, id DESC
 LIMIT $7`

const statsSQL = `SELECT projection, coalesce(error_reason, ''), coalesce(max(error_class), ''),
       count(*), min(updated_at), max(updated_at)
  FROM outbox_events
 WHERE ` + failedWhere + `
 GROUP BY 1, 2
 ORDER BY 4 DESC, 1, 2`

func (f Filter) args() []any {
	return []any{nullString(f.Projection), nullString(f.Reason), nullTime(f.Since), nullTime(f.Until),
		nullString(f.EntityType), nullString(f.ScopeKey)}
}

// List returns failed rows matching f, newest failure first.
func List(ctx context.Context, db outbox.Querier, f Filter) ([]FailedEvent, error) {
	if f.Limit < 0 {
		return nil, fmt.Errorf("--limit must not be negative, got %d", f.Limit)
	}
	var limit any
	if f.Limit > 0 {
		limit = f.Limit
	}
	rows, err := db.Query(ctx, listSQL, append(f.args(), limit)...)
	if err != nil {
		return nil, fmt.Errorf("list failed events: %w", err)
	}
	events, err := pgx.CollectRows(rows, scanFailed)
	if err != nil {
		return nil, fmt.Errorf("list failed events: %w", err)
	}
	return events, nil
}

// Stats counts failed rows matching f by projection and reason, largest
// group first.
func Stats(ctx context.Context, db outbox.Querier, f Filter) ([]Stat, error) {
	rows, err := db.Query(ctx, statsSQL, f.args()...)
	if err != nil {
		return nil, fmt.Errorf("failed stats: %w", err)
	}
	stats, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Stat, error) {
		var s Stat
		err := r.Scan(&s.Projection, &s.Reason, &s.Class, &s.Count, &s.Oldest, &s.Newest)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("failed stats: %w", err)
	}
	return stats, nil
}

func scanFailed(r pgx.CollectableRow) (FailedEvent, error) {
	var e FailedEvent
	err := r.Scan(&e.ID, &e.Projection, &e.EntityType, &e.EntityID, &e.Op, &e.Attempts,
		&e.ErrorReason, &e.ErrorClass, &e.LastError, &e.UpdatedAt, &e.ReplayCount, &e.ScopeKey)
	return e, err
}

func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func nullTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
}
