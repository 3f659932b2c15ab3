package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/wlproj/wlproj/internal/bounds"
)

// ProjectionState is a row of outbox_projection_state: whether an operator
// paused a projection, who, why and when. A projection without a row runs.
type ProjectionState struct {
	Projection string    `json:"projection"`
	Paused     bool      `json:"paused"`
	ChangedBy  string    `json:"changed_by"`
	Why        string    `json:"why"`
	ChangedAt  time.Time `json:"changed_at"`
}

// Beginner is what *pgxpool.Pool and *pgx.Conn have in common for a
// transaction.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// PauseRequest pauses (Paused) or resumes a projection.
type PauseRequest struct {
	Projection string
	Paused     bool
	// By and Why are recorded in the state row and the audit row. Required.
	By, Why string
	// Known are the projections the binary knows: the outbox cannot tell a
	// typo from a projection with no events yet, and a typo must not pause
	// nothing. Required.
	Known []string
}

// UnknownProjectionError is a pause or resume of a projection the binary
// does not know; nothing changed.
type UnknownProjectionError struct {
	Name  string
	Known []string
}

func (e *UnknownProjectionError) Error() string {
	return fmt.Sprintf("unknown projection %q; this wlproj knows %s; nothing changed", e.Name, strings.Join(e.Known, ", "))
}

// PauseResult is what SetPaused did.
type PauseResult struct {
	// State is the projection's state after the call.
	State ProjectionState `json:"state"`
	// Changed is false when the projection already was as asked; then
	// nothing was written, not even an audit row.
	Changed bool  `json:"changed"`
	AuditID int64 `json:"audit_id,omitempty"`
	// InFlight counts the projection's events in processing when it was
	// paused: claimed before the pause, they finish.
	InFlight int64 `json:"in_flight"`
}

// pauseSQL and resumeSQL are compare-and-set: they change the row only if
// the projection is not already as asked, so of two operators acting at
// once one changes it and the other is told it already was.
const pauseSQL = `
INSERT INTO outbox_projection_state AS s (projection, paused, changed_by, why, changed_at)
VALUES (@projection, true, @by, @why, now())
ON CONFLICT (projection) DO UPDATE
   SET paused = true, changed_by = excluded.changed_by, why = excluded.why, changed_at = excluded.changed_at
 WHERE NOT s.paused
RETURNING projection, paused, changed_by, why, changed_at`

const resumeSQL = `
UPDATE outbox_projection_state
   SET paused = false, changed_by = @by, why = @why, changed_at = now()
 WHERE projection = @projection AND paused
RETURNING projection, paused, changed_by, why, changed_at`

const inFlightSQL = `SELECT count(*) FROM outbox_events WHERE status = 'processing' AND projection = $1`

const stateSQL = `
SELECT projection, paused, changed_by, why, changed_at FROM outbox_projection_state WHERE projection = $1`

// SetPaused pauses or resumes a projection in one transaction with its
// audit row (action pause or resume). The leader stops claiming a paused
// projection's events at its next claim; a resume wakes it. A projection
// outside req.Known is an *UnknownProjectionError.
func SetPaused(ctx context.Context, db Beginner, req PauseRequest) (PauseResult, error) {
	req.Projection, req.By, req.Why = strings.TrimSpace(req.Projection), strings.TrimSpace(req.By), strings.TrimSpace(req.Why)
	action, doing := "resume", "resuming"
	if req.Paused {
		action, doing = "pause", "pausing"
	}
	if err := required("Projection", req.Projection, "name the projection"); err != nil {
		return PauseResult{}, err
	}
	if !slices.Contains(req.Known, req.Projection) {
		return PauseResult{}, &UnknownProjectionError{Name: req.Projection, Known: req.Known}
	}
	if err := bounds.First(
		required("By", req.By, "say who is "+doing),
		required("Why", req.Why, "say why"),
	); err != nil {
		return PauseResult{}, err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return PauseResult{}, fmt.Errorf("%s: %w", action, err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	res, err := setPaused(ctx, tx, req, action)
	if err != nil {
		return PauseResult{}, fmt.Errorf("%s %s: %w", action, req.Projection, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return PauseResult{}, fmt.Errorf("%s %s: %w", action, req.Projection, err)
	}
	return res, nil
}

func setPaused(ctx context.Context, tx pgx.Tx, req PauseRequest, action string) (PauseResult, error) {
	sql := resumeSQL
	if req.Paused {
		sql = pauseSQL
	}
	args := pgx.NamedArgs{"projection": req.Projection, "by": req.By, "why": req.Why}
	var res PauseResult
	st, err := scanState(tx.QueryRow(ctx, sql, args))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		res.State, err = currentState(ctx, tx, req.Projection)
		return res, err
	case err != nil:
		return res, err
	}
	res.State, res.Changed = st, true
	if res.AuditID, _, err = WriteAudit(ctx, tx, Audit{Action: action, By: req.By, Why: req.Why,
		Selector: map[string]string{"projection": req.Projection}, Projection: req.Projection}); err != nil {
		return res, err
	}
	if req.Paused {
		err = tx.QueryRow(ctx, inFlightSQL, req.Projection).Scan(&res.InFlight)
	} else {
		// Delivered at commit: the leader claims the resumed events from
		// the head at once; they are behind its claim cursor.
		_, err = tx.Exec(ctx, NotifyHeadSQL)
	}
	return res, err
}

// currentState is the projection's row, or a running state with no row.
func currentState(ctx context.Context, q Querier, projection string) (ProjectionState, error) {
	st, err := scanState(q.QueryRow(ctx, stateSQL, projection))
	if errors.Is(err, pgx.ErrNoRows) {
		return ProjectionState{Projection: projection}, nil
	}
	return st, err
}

func scanState(row pgx.Row) (ProjectionState, error) {
	var st ProjectionState
	err := row.Scan(&st.Projection, &st.Paused, &st.ChangedBy, &st.Why, &st.ChangedAt)
	return st, err
}

func required(field, v, problem string) error {
	if v == "" {
		return bounds.Invalid(field, "is required: %s", problem)
	}
	return nil
}

const statesSQL = `
SELECT projection, paused, changed_by, why, changed_at FROM outbox_projection_state ORDER BY projection`

// ProjectionStates returns every projection's state row, paused or not, by
// name. A projection never paused has none.
func ProjectionStates(ctx context.Context, db Querier) ([]ProjectionState, error) {
	rows, err := db.Query(ctx, statesSQL)
	if err != nil {
		return nil, fmt.Errorf("projection states: %w", err)
	}
	states, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ProjectionState, error) { return scanState(r) })
	if err != nil {
		return nil, fmt.Errorf("projection states: %w", err)
	}
	return states, nil
}
