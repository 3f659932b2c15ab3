package replay

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

const (
	// maxDefault is the most rows a selector-based replay touches without Yes.
	maxDefault = 1000
	// maxIDs bounds what an --ids list may expand to, so a typo like
	// 1-100000000 fails fast instead of allocating.
	maxIDs = 100_000
	// historyKeep matches the bound the daemon keeps error_history to.
	historyKeep = 20
	// AutoBy is the audit name of the auto-replay policy; operators may not
	// use it, so the policy's rate budget counts only its own replays.
	AutoBy = "auto"
)

// Beginner opens a transaction: *pgxpool.Pool, *pgx.Conn and pgx.Tx (as a
// savepoint) all do.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Request is one replay. The selectors (IDs, Reason, Projection, Since,
// Until) combine with AND, and at least one is required; Limit keeps the
// lowest ids.
type Request struct {
	// IDs names rows explicitly. Every id must exist and be failed, or
	// nothing is replayed. Failed ids excluded by the other selectors or the
	// limit are reported in Report.Skipped, not replayed.
	IDs        []int64
	Reason     string
	Projection string
	// Since (inclusive) and Until (exclusive) bound the time of failure.
	Since, Until time.Time
	// Limit caps the rows replayed; zero means no cap besides Max.
	Limit int
	// By and Why go to the audit row and are required.
	By, Why string
	// DryRun reports what would be replayed and changes nothing.
	DryRun bool
	// ResetAttempts zeroes attempts; by default they are kept.
	ResetAttempts bool
	// Max is the most rows a replay without IDs may touch unless Yes is set.
	// Defaults to 1000.
	Max int
	// Yes lifts the Max cap.
	Yes bool
	// Given is the selector as the operator typed it (flag name to value),
	// kept in the audit row next to the resolved selector, so "since 24h"
	// shows both as typed and as the time it meant.
	Given map[string]string
}

// Report says what a replay did, or would do, or why it refused.
type Report struct {
	DryRun bool `json:"dry_run"`
	// Events are the rows replayed (or that a dry run would replay), as they
	// were before the replay, in id order.
	Events []FailedEvent `json:"events"`
	// Missing are requested ids that do not exist.
	Missing []int64 `json:"missing,omitempty"`
	// NotFailed are requested ids whose row is not failed.
	NotFailed []IDStatus `json:"not_failed,omitempty"`
	// Skipped are requested failed ids left out by the other selectors or
	// the limit.
	Skipped []int64 `json:"skipped,omitempty"`
	// Matching is the number of rows the selector matched, set when the cap
	// refused the replay.
	Matching int64 `json:"matching,omitempty"`
	// AuditID is the outbox_replay_audit row written, zero if none.
	AuditID int64     `json:"audit_id,omitempty"`
	At      time.Time `json:"at,omitzero"`
}

// IDStatus is a requested row that is not failed.
type IDStatus struct {
	ID     int64  `json:"id"`
	Status string `json:"status"`
}

// IDs returns the ids of the replayed rows.
func (r Report) IDs() []int64 {
	ids := make([]int64, len(r.Events))
	for i, e := range r.Events {
		ids[i] = e.ID
	}
	return ids
}

// Usage errors: the request itself is incomplete. Nothing was read or changed.
var (
	ErrAuditRequired = errors.New("--by and --why are required: say who is replaying and why")
	ErrNoSelector    = errors.New("no selector: give --ids, --reason, --projection or --since/--until")
)

// RefusedError is a replay that looked at the rows and refused; nothing was
// changed.
type RefusedError struct {
	Problems []string
}

func (e *RefusedError) Error() string {
	return "replay refused, nothing changed: " + strings.Join(e.Problems, "; ")
}

// selectIDsSQL locks every requested row, whatever its status, so missing and
// non-failed ids can be reported; matches applies the other selectors.
const selectIDsSQL = `SELECT ` + failedColumns + `, status, (` + failedWhere + `) AS matches
  FROM outbox_events
 WHERE id = ANY($7)
 ORDER BY id
 FOR UPDATE`

// selectFailedSQL locks the failed rows a selector matches, lowest id first.
// $7 is the limit, NULL for all.
const selectFailedSQL = `SELECT ` + failedColumns + `
  FROM outbox_events
 WHERE ` + failedWhere + `
 ORDER BY id
 LIMIT $7
 FOR UPDATE`

const countFailedSQL = `SELECT count(*) FROM outbox_events WHERE ` + failedWhere

// reviveSQL is the replay itself. The status check makes it a compare-and-set
// even though the rows are locked: a row that is not failed is never touched.
const reviveSQL = `
UPDATE outbox_events
   SET status = 'pending', next_retry_at = now(),
       locked_by = NULL, lease_until = NULL, processing_started_at = NULL, claim_token = NULL,
       replay_count = replay_count + 1,
       attempts = CASE WHEN @reset THEN 0 ELSE attempts END,
       error_history = outbox_append_error(error_history, jsonb_build_object(
           'event', 'replayed', 'by', @by::text, 'why', @why::text, 'at', now(),
           'audit_id', @audit_id::bigint, 'reset_attempts', @reset::bool), @keep),
       updated_at = now()
 WHERE id = ANY(@ids) AND status = 'failed'`

const auditSQL = `
INSERT INTO outbox_replay_audit (replayed_by, reason, selector, event_count, event_ids)
VALUES ($1, $2, $3::jsonb, $4, $5)
RETURNING id, replayed_at`

// Replay returns the selected failed rows to pending in one transaction, with
// one audit row, and wakes the leader. On refusal it returns a *RefusedError
// and a Report naming the offending ids; nothing is changed.
func Replay(ctx context.Context, db Beginner, req Request) (Report, error) {
	rep := Report{DryRun: req.DryRun}
	req.By, req.Why = strings.TrimSpace(req.By), strings.TrimSpace(req.Why)
	switch {
	case req.By == "" || req.Why == "":
		return rep, ErrAuditRequired
	case req.By == AutoBy:
		return rep, fmt.Errorf("--by %q is reserved for the auto-replay policy", AutoBy)
	case len(req.IDs) == 0 && req.Reason == "" && req.Projection == "" && req.Since.IsZero() && req.Until.IsZero():
		return rep, ErrNoSelector
	case req.Limit < 0:
		return rep, fmt.Errorf("--limit must not be negative, got %d", req.Limit)
	case req.Max < 0:
		return rep, fmt.Errorf("--max must not be negative, got %d", req.Max)
	case len(req.IDs) > maxIDs:
		return rep, fmt.Errorf("--ids names %d ids, more than %d", len(req.IDs), maxIDs)
	}
	req.Max = cmp.Or(req.Max, maxDefault)

	tx, err := db.Begin(ctx)
	if err != nil {
		return rep, fmt.Errorf("replay: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit

	f := Filter{Projection: req.Projection, Reason: req.Reason, Since: req.Since, Until: req.Until}
	if len(req.IDs) > 0 {
		err = selectByIDs(ctx, tx, req, f, &rep)
	} else {
		err = selectBySelector(ctx, tx, req, f, &rep)
	}
	if err != nil || len(rep.Events) == 0 || req.DryRun {
		return rep, err
	}

	rep.AuditID, rep.At, err = revive(ctx, tx, rep.IDs(), req.By, req.Why, req.ResetAttempts, req.auditSelector())
	if err != nil {
		return rep, err
	}
	if err := tx.Commit(ctx); err != nil {
		return rep, fmt.Errorf("replay: commit: %w", err)
	}
	return rep, nil
}

func selectByIDs(ctx context.Context, tx pgx.Tx, req Request, f Filter, rep *Report) error {
	ids := slices.Clone(req.IDs)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	rows, err := tx.Query(ctx, selectIDsSQL, append(f.args(), ids)...)
	if err != nil {
		return fmt.Errorf("replay: select ids: %w", err)
	}
	defer rows.Close()
	found := make(map[int64]bool, len(ids))
	for rows.Next() {
		var e FailedEvent
		var status string
		var matches bool
		if err := rows.Scan(&e.ID, &e.Projection, &e.EntityType, &e.EntityID, &e.Op, &e.Attempts,
			&e.ErrorReason, &e.ErrorClass, &e.LastError, &e.UpdatedAt, &e.ReplayCount, &e.ScopeKey,
			&status, &matches); err != nil {
			return fmt.Errorf("replay: select ids: %w", err)
		}
		found[e.ID] = true
		switch {
		case status != "failed":
			rep.NotFailed = append(rep.NotFailed, IDStatus{ID: e.ID, Status: status})
		case !matches || (req.Limit > 0 && len(rep.Events) >= req.Limit):
			rep.Skipped = append(rep.Skipped, e.ID)
		default:
			rep.Events = append(rep.Events, e)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("replay: select ids: %w", err)
	}
	for _, id := range ids {
		if !found[id] {
			rep.Missing = append(rep.Missing, id)
		}
	}
	var problems []string
	if len(rep.Missing) > 0 {
		problems = append(problems, "unknown ids: "+FormatIDs(rep.Missing))
	}
	// One line per status, ids compacted, so a wide range stays readable.
	byStatus := map[string][]int64{}
	var statuses []string
	for _, nf := range rep.NotFailed {
		if byStatus[nf.Status] == nil {
			statuses = append(statuses, nf.Status)
		}
		byStatus[nf.Status] = append(byStatus[nf.Status], nf.ID)
	}
	for _, st := range statuses {
		if ids := byStatus[st]; len(ids) == 1 {
			problems = append(problems, fmt.Sprintf("id %d is %s, not failed", ids[0], st))
		} else {
			problems = append(problems, fmt.Sprintf("ids %s are %s, not failed", FormatIDs(ids), st))
		}
	}
	if len(problems) > 0 {
		rep.Events = nil
		return &RefusedError{Problems: problems}
	}
	return nil
}

func selectBySelector(ctx context.Context, tx pgx.Tx, req Request, f Filter, rep *Report) error {
	// Without Yes, read one row past the cap: enough to know it is exceeded
	// without locking the whole match.
	limit := req.Limit
	if !req.Yes && (limit == 0 || limit > req.Max) {
		limit = req.Max + 1
	}
	var limitArg any
	if limit > 0 {
		limitArg = limit
	}
	rows, err := tx.Query(ctx, selectFailedSQL, append(f.args(), limitArg)...)
	if err != nil {
		return fmt.Errorf("replay: select: %w", err)
	}
	rep.Events, err = pgx.CollectRows(rows, scanFailed)
	if err != nil {
		return fmt.Errorf("replay: select: %w", err)
	}
	if req.Yes || len(rep.Events) <= req.Max {
		return nil
	}
	rep.Events = nil
	if err := tx.QueryRow(ctx, countFailedSQL, f.args()...).Scan(&rep.Matching); err != nil {
		return fmt.Errorf("replay: count: %w", err)
	}
	if req.Limit > 0 {
		rep.Matching = min(rep.Matching, int64(req.Limit))
	}
	return &RefusedError{Problems: []string{fmt.Sprintf(
		"%d failed events match, more than --max %d; narrow the selector, raise --max, or add --yes",
		rep.Matching, req.Max)}}
}

// revive replays ids (locked by the caller and known to be failed), writes
// the audit row and queues the wake-up. The caller commits.
func revive(ctx context.Context, tx pgx.Tx, ids []int64, by, why string, reset bool, selector any) (int64, time.Time, error) {
	sel, err := json.Marshal(selector)
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("replay: selector: %w", err)
	}
	var auditID int64
	var at time.Time
	if err := tx.QueryRow(ctx, auditSQL, by, why, string(sel), len(ids), ids).Scan(&auditID, &at); err != nil {
		return 0, time.Time{}, fmt.Errorf("replay: audit: %w", err)
	}
	tag, err := tx.Exec(ctx, reviveSQL, pgx.NamedArgs{
		"ids": ids, "by": by, "why": why, "reset": reset, "audit_id": auditID, "keep": historyKeep,
	})
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("replay: update: %w", err)
	}
	if tag.RowsAffected() != int64(len(ids)) {
		// Cannot happen while the rows are locked; refuse rather than audit a
		// count that is not true.
		return 0, time.Time{}, fmt.Errorf("replay: updated %d rows, expected %d; rolled back", tag.RowsAffected(), len(ids))
	}
	// A NOTIFY is delivered at commit and dropped on rollback, so the leader
	// wakes only for rows that are really pending.
	if _, err := tx.Exec(ctx, `SELECT pg_notify('outbox_events', '')`); err != nil {
		return 0, time.Time{}, fmt.Errorf("replay: notify: %w", err)
	}
	return auditID, at, nil
}

// auditSelector is the selector stored in the audit row: the resolved
// request, plus what the operator typed.
func (r Request) auditSelector() map[string]any {
	sel := map[string]any{}
	if len(r.IDs) > 0 {
		sel["ids"] = FormatIDs(r.IDs)
	}
	if r.Reason != "" {
		sel["reason"] = r.Reason
	}
	if r.Projection != "" {
		sel["projection"] = r.Projection
	}
	if !r.Since.IsZero() {
		sel["since"] = r.Since.UTC()
	}
	if !r.Until.IsZero() {
		sel["until"] = r.Until.UTC()
	}
	if r.Limit > 0 {
		sel["limit"] = r.Limit
	}
	if r.ResetAttempts {
		sel["reset_attempts"] = true
	}
	if r.Yes {
		sel["yes"] = true
	}
	if len(r.Given) > 0 {
		sel["given"] = r.Given
	}
	return sel
}

// ParseIDs parses a comma list of ids and ranges ("3,10-20"), sorted and
// without duplicates.
func ParseIDs(s string) ([]int64, error) {
	var ids []int64
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(part, "-")
		first, err := parseID(lo)
		if err != nil {
			return nil, fmt.Errorf("--ids: %q: %w", part, err)
		}
		last := first
		if isRange {
			if last, err = parseID(hi); err != nil {
				return nil, fmt.Errorf("--ids: %q: %w", part, err)
			}
			if last < first {
				return nil, fmt.Errorf("--ids: %q: range ends before it starts", part)
			}
		}
		if last-first >= maxIDs || len(ids)+int(last-first) >= maxIDs {
			return nil, fmt.Errorf("--ids: more than %d ids", maxIDs)
		}
		for n := range last - first + 1 {
			ids = append(ids, first+n)
		}
	}
	if len(ids) == 0 {
		return nil, errors.New("--ids: no ids given")
	}
	slices.Sort(ids)
	return slices.Compact(ids), nil
}

func parseID(s string) (int64, error) {
	id, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || id <= 0 {
		return 0, errors.New("not a positive id")
	}
	return id, nil
}

// FormatIDs writes sorted ids compactly, runs as ranges: "3,10-20".
func FormatIDs(ids []int64) string {
	ids = slices.Clone(ids)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	var b strings.Builder
	for i := 0; i < len(ids); {
		j := i
		for j+1 < len(ids) && ids[j+1] == ids[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(ids[i], 10))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.FormatInt(ids[j], 10))
		}
		i = j + 1
	}
	return b.String()
}
