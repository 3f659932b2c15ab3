package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// DocEvent is one event of a document, as `wlproj doc` shows it.
type DocEvent struct {
	ID          int64      `json:"id"`
	Op          string     `json:"op"`
	Version     int64      `json:"version"`
	Status      string     `json:"status"`
	ErrorReason *string    `json:"error_reason"`
	CreatedAt   time.Time  `json:"created_at"`
	ProcessedAt *time.Time `json:"processed_at"`
	// ArchivedAt is set for an event in the dead letter (outbox_dead_letter),
	// which `wlproj replay --archived` can still bring back.
	ArchivedAt *time.Time `json:"archived_at,omitempty"`
}

// Document is a document's ledger entry next to its events.
type Document struct {
	Projection string     `json:"projection"`
	EntityType string     `json:"entity_type"`
	EntityID   string     `json:"entity_id"`
	Applied    *Applied   `json:"applied"`
	AppliedAt  *time.Time `json:"applied_at"`
	Events     []DocEvent `json:"events"`
	// Omitted counts the done and discarded events left out of Events past
	// docEventsMax; none of them can change the document any more.
	Omitted int64 `json:"omitted"`
}

const docLedgerSQL = `SELECT version, event_id, deleted, applied_at FROM outbox_ledger_entry($1, $2, $3)`

// docEventsMax is how many events ReadDocument lists at most.
const docEventsMax = 50

// docEventsSQL reads the document's events that can still change it
// (through the partial indexes of pending, processing and failed rows, the
// queued rows no position has passed, and the dead letter's index by
// document), the event the ledger names, and,
// with $5, every other row too (a table scan: there is no index by entity,
// which would cost every claim and ack). Those that can still change it
// come first, so that the cut at docEventsMax only ever leaves out done and
// discarded ones, and every row carries how many there were in all.
const docEventsSQL = `
WITH doc AS (
  SELECT id, op, coalesce(event_version, id) AS version, status, error_reason, created_at, processed_at,
         NULL::timestamptz AS archived_at
    FROM outbox_events
   WHERE status IN ('pending', 'processing', 'failed')
     AND projection = $1 AND entity_type = $2 AND entity_id = $3
  UNION
  SELECT e.id, e.op, coalesce(e.event_version, e.id), CASE WHEN b.in_flight THEN 'processing' ELSE 'pending' END,
         NULL, e.created_at, NULL, NULL
    FROM outbox_queue_backlog b JOIN outbox_events e ON e.id = b.id
   WHERE b.projection = $1 AND b.entity_type = $2 AND b.entity_id = $3
  UNION
  SELECT id, op, coalesce(event_version, id), status, error_reason, created_at, processed_at, NULL
    FROM outbox_event_states WHERE id = $4
  UNION
  SELECT id, op, coalesce(event_version, id), status, error_reason, created_at, processed_at, NULL
    FROM outbox_event_states WHERE $5 AND projection = $1 AND entity_type = $2 AND entity_id = $3
  UNION
  SELECT id, op, coalesce(event_version, id), status, error_reason, created_at, NULL, archived_at
    FROM outbox_dead_letter WHERE projection = $1 AND entity_type = $2 AND entity_id = $3
)
SELECT id, op, version, status, error_reason, created_at, processed_at, archived_at, count(*) OVER ()
  FROM doc
 ORDER BY (status IN ('pending', 'processing', 'failed') OR archived_at IS NOT NULL OR id = $4) DESC,
          version DESC, id DESC
 LIMIT $6`

// ReadDocument returns the ledger entry and the events of one document.
func ReadDocument(ctx context.Context, q Querier, projection, entityType, entityID string, all bool) (Document, error) {
	d := Document{Projection: projection, EntityType: entityType, EntityID: entityID, Events: []DocEvent{}}
	var a Applied
	var at time.Time
	err := q.QueryRow(ctx, docLedgerSQL, projection, entityType, entityID).Scan(&a.Version, &a.EventID, &a.Deleted, &at)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return d, fmt.Errorf("ledger: %w", err)
	default:
		d.Applied, d.AppliedAt = &a, &at
	}
	rows, err := q.Query(ctx, docEventsSQL, projection, entityType, entityID, a.EventID, all, docEventsMax)
	if err != nil {
		return d, fmt.Errorf("events: %w", err)
	}
	var total int64
	d.Events, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (DocEvent, error) {
		var e DocEvent
		err := r.Scan(&e.ID, &e.Op, &e.Version, &e.Status, &e.ErrorReason, &e.CreatedAt, &e.ProcessedAt, &e.ArchivedAt, &total)
		return e, err
	})
	if err != nil {
		return d, fmt.Errorf("events: %w", err)
	}
	d.Omitted = total - int64(len(d.Events))
	// Newest first, as a document's history reads.
	slices.SortFunc(d.Events, func(x, y DocEvent) int {
		return cmp.Or(cmp.Compare(y.Version, x.Version), cmp.Compare(y.ID, x.ID))
	})
	return d, nil
}
