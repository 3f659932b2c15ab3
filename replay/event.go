package replay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/wlproj/wlproj/outbox"
)

// One failed, discarded or archived row whole, with its payload and its
// error history: what a person reads before replaying it.

// ErrNotFound is an id that names no row.
var ErrNotFound = outbox.ErrNotFound

// EventDetail is one row of the outbox or the dead letter, whole.
type EventDetail struct {
	FailedEvent
	EventVersion *int64
	// Payload is the JSON payload, indented.
	Payload             string
	NextRetryAt         *time.Time
	LockedBy            string
	ClaimToken          *int64
	LeaseUntil          *time.Time
	ProcessingStartedAt *time.Time
	ProcessedAt         *time.Time
	CreatedAt           time.Time
	// History is error_history, oldest first: each failed attempt, reclaim,
	// replay, discard and restore, the newest outbox.HistoryKeep of them.
	History []HistoryEntry
}

// HistoryEntry is one element of error_history. Which fields are set
// depends on Event: empty for a failed attempt (Attempt, Class, Reason,
// Error, Worker, Epoch), else replayed, discarded, restored (By, Why,
// AuditID) or stuck_reclaimed (Why, Worker, ReclaimedBy).
type HistoryEntry struct {
	At            time.Time `json:"at"`
	Event         string    `json:"event"`
	Attempt       int       `json:"attempt"`
	Class         string    `json:"class"`
	Reason        string    `json:"reason"`
	Error         string    `json:"error"`
	Worker        string    `json:"worker"`
	Epoch         int64     `json:"epoch"`
	By            string    `json:"by"`
	Why           string    `json:"why"`
	AuditID       int64     `json:"audit_id"`
	ResetAttempts bool      `json:"reset_attempts"`
	ReclaimedBy   string    `json:"reclaimed_by"`
}

// The columns of a row that both tables have, in EventDetail's order; the
// ones only outbox_events has are NULL for the dead letter.
const eventDetailSQL = `
SELECT e.id, e.projection, e.entity_type, e.entity_id, e.op, e.attempts,
       coalesce(e.error_reason, ''), coalesce(e.error_class, ''), coalesce(e.last_error, ''), e.updated_at,
       e.replay_count, coalesce(e.scope_key, ''), s.status, NULL::timestamptz,
       e.event_version, jsonb_pretty(e.payload), e.next_retry_at, coalesce(s.locked_by, ''), e.claim_token,
       s.lease_until, e.processing_started_at, e.processed_at, e.created_at, e.error_history
  FROM outbox_events e JOIN outbox_event_states s ON s.id = e.id WHERE e.id = $1
UNION ALL
SELECT id, projection, entity_type, entity_id, op, attempts,
       coalesce(error_reason, ''), coalesce(error_class, ''), coalesce(last_error, ''), updated_at,
       replay_count, coalesce(scope_key, ''), status, archived_at,
       event_version, jsonb_pretty(payload), NULL, '', NULL,
       NULL, NULL, NULL, created_at, error_history
  FROM outbox_dead_letter WHERE id = $1`

// Event reads the row id from outbox_events or, archived, from the dead
// letter; ErrNotFound if neither holds it.
func Event(ctx context.Context, db outbox.Querier, id int64) (EventDetail, error) {
	var d EventDetail
	var history []byte
	row := db.QueryRow(ctx, eventDetailSQL, id)
	e, err := scanEvent(row, &d.EventVersion, &d.Payload, &d.NextRetryAt, &d.LockedBy, &d.ClaimToken,
		&d.LeaseUntil, &d.ProcessingStartedAt, &d.ProcessedAt, &d.CreatedAt, &history)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return d, fmt.Errorf("event %d: %w", id, ErrNotFound)
	case err != nil:
		return d, fmt.Errorf("event %d: %w", id, err)
	}
	d.FailedEvent = e
	if err := json.Unmarshal(history, &d.History); err != nil {
		return d, fmt.Errorf("event %d: error_history: %w", id, err)
	}
	return d, nil
}
