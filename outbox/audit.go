package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

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
}

const auditSQL = `
INSERT INTO outbox_replay_audit (action, replayed_by, reason, selector, event_count, event_ids)
VALUES ($1, $2, $3, $4::jsonb, $5, $6)
RETURNING id, replayed_at`

// WriteAudit inserts a in tx and returns its id and time.
func WriteAudit(ctx context.Context, tx pgx.Tx, a Audit) (int64, time.Time, error) {
	sel, err := json.Marshal(a.Selector)
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("audit selector: %w", err)
	}
	ids := a.EventIDs
	if ids == nil {
		ids = []int64{}
	}
	var id int64
	var at time.Time
	if err := tx.QueryRow(ctx, auditSQL, a.Action, a.By, a.Why, string(sel), a.Count, ids).Scan(&id, &at); err != nil {
		return 0, time.Time{}, fmt.Errorf("audit: %w", err)
	}
	return id, at, nil
}
