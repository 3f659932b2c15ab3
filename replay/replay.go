package replay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/policy"
)

const (
	// MaxDefault is the most rows a selector-based replay or discard touches
	// without Yes; the CLI's --max takes its default from here.
	MaxDefault = 1000
	// maxIDs bounds what an ids list may expand to, so a typo like
	// 1-100000000 fails fast instead of allocating.
	maxIDs = 100_000
	// AutoBy is the audit name of the auto-replay policy; operators may not
	// use it, so the policy's rate budget counts only its own replays.
	AutoBy = "auto"
)

// Beginner opens a transaction: *pgxpool.Pool, *pgx.Conn and pgx.Tx (as a
// savepoint) all do.
type Beginner = outbox.Beginner

// Request is one replay, discard or restore. The selectors (IDs, Reason,
// Projection, Since, Until, EntityType, ScopeKey, Class, Text) combine with
// AND, and at least one is required; Limit keeps the lowest ids.
type Request struct {
	// IDs names rows explicitly. Every id must exist and be failed, or
	// nothing changes. Failed ids excluded by the other selectors or the
	// limit are reported in Report.Skipped, and left alone.
	IDs        []int64
	Reason     string
	Projection string
	// Since (inclusive) and Until (exclusive) bound the time of failure.
	Since, Until time.Time
	// EntityType, ScopeKey, Class (error_class) and Text (in last_error,
	// ignoring case) select as in Filter.
	EntityType, ScopeKey, Class, Text string
	// Limit caps the rows changed; zero means no cap besides Max.
	Limit int
	// By and Why go to the audit row and are required.
	By, Why string
	// DryRun reports what would change and changes nothing; it locks no
	// row, and reads a page per transaction.
	DryRun bool
	// ResetAttempts zeroes attempts on a replay or restore; by default they
	// are kept. A discard ignores it.
	ResetAttempts bool
	// Max is the most rows a request without IDs may touch unless Yes is
	// set. Defaults to 1000.
	Max int
	// Yes lifts the Max cap.
	Yes bool
	// Given is the selector as the operator typed it (flag name to value),
	// kept in the audit row next to the resolved selector, so "since 24h"
	// shows both as typed and as the time it meant.
	Given map[string]string
	// Expect, when set, is the Report.Token of a dry run: the action refuses,
	// changing nothing, unless it selects exactly the rows that dry run did.
	// So a confirmation given for N rows never applies to others, e.g. when
	// someone replayed some of them in between. Up to BatchDefault rows it
	// is one transaction; more go in transactions of BatchDefault, each
	// leaving alone a row changed since the check (action.confirmed).
	Expect string
	// Allowed holds the request to the rows the actor's grants allow for
	// this action (policy.Grants.Allowed), dry run and action alike; nil:
	// every row. It is not a selector: a request still needs one.
	Allowed *policy.Allowed
}

// filter is the Filter of the request's selectors other than IDs.
func (r Request) filter() Filter {
	return Filter{Projection: r.Projection, Reason: r.Reason, Since: r.Since, Until: r.Until,
		EntityType: r.EntityType, ScopeKey: r.ScopeKey, Class: r.Class, Text: r.Text, Allowed: r.Allowed}
}

// Report says what an action did, or would do, or why it refused.
type Report struct {
	DryRun bool `json:"dry_run"`
	// Events are the rows changed (or that a dry run would change), as they
	// were before, in id order.
	Events []FailedEvent `json:"events"`
	// Missing are requested ids that do not exist.
	Missing []int64 `json:"missing,omitempty"`
	// NotFailed are requested ids whose row is in a status the action does
	// not take (replay and discard take failed, archive failed or discarded).
	NotFailed []IDStatus `json:"not_failed,omitempty"`
	// Skipped are requested ids left out by the other selectors or the
	// limit.
	Skipped []int64 `json:"skipped,omitempty"`
	// Matching is the number of rows the selector matched, set when the cap
	// refused the request.
	Matching int64 `json:"matching,omitempty"`
	// AuditID is the outbox_replay_audit row written, zero if none; for an
	// archive in several batches, the first.
	AuditID int64 `json:"audit_id,omitempty"`
	// AuditIDs are the audit rows of an archive, one per batch.
	AuditIDs []int64   `json:"audit_ids,omitempty"`
	At       time.Time `json:"at,omitzero"`
	// Token names the selected rows (SelectionToken of their ids); a dry
	// run's, given back as Request.Expect, holds the action to those rows.
	Token string `json:"token,omitempty"`
}

// IDStatus is a requested row that is not in the status the action takes.
type IDStatus struct {
	ID     int64  `json:"id"`
	Status string `json:"status"`
}

// IDs returns the ids of the changed rows.
func (r Report) IDs() []int64 {
	ids := make([]int64, len(r.Events))
	for i, e := range r.Events {
		ids[i] = e.ID
	}
	return ids
}

// Usage errors: the request itself is incomplete. Nothing was read or
// changed. Bad fields are *bounds.FieldError naming the Request field.
var (
	// ErrAuditRequired matches every *AuditRequiredError.
	ErrAuditRequired = errors.New("By and Why are required")
	ErrNoSelector    = errors.New("no selector: give IDs, Reason, Projection, Since/Until, EntityType, ScopeKey, Class or Text")
)

// AuditRequiredError is a request without By or Why.
type AuditRequiredError struct {
	// Doing is the action in the message: "replaying", "discarding".
	Doing string
}

func (e *AuditRequiredError) Error() string {
	return fmt.Sprintf("%s: say who is %s and why", ErrAuditRequired, e.Doing)
}

func (e *AuditRequiredError) Is(target error) bool { return target == ErrAuditRequired }

// RefusedError is an action that looked at the rows and refused; nothing
// was changed.
type RefusedError struct {
	// Action is replay, discard, archive or restore.
	Action   string
	Problems []string
	// Matching and Max are set when the refusal is the cap: more rows
	// matched than Max and Yes was not given.
	Matching int64
	Max      int
	// Changed is set when the refusal is Request.Expect: the rows selected
	// now are not the dry run's; Matching is how many are selected now.
	Changed bool
}

func (e *RefusedError) Error() string {
	return e.Action + " refused, nothing changed: " + strings.Join(e.Problems, "; ")
}

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

// replayAction returns failed rows to pending; the NOTIFY wakes the leader
// at commit, and is dropped on rollback.
var replayAction = action{name: "replay", doing: "replaying", rows: failedRows, capped: true, sql: reviveSQL, notify: true}

// Replay returns the selected failed rows to pending in one transaction, with
// one audit row, and wakes the leader; with Yes, by selector and without a
// Limit, in transactions of BatchDefault rows, each with its own audit row
// (see action.batches). On refusal it returns a *RefusedError and a Report
// naming the offending ids; nothing is changed.
func Replay(ctx context.Context, db Beginner, req Request) (Report, error) {
	return replayAction.run(ctx, db, req)
}

// revive replays ids (locked by the caller and known to be failed), writes
// the audit row and queues the wake-up. The caller commits.
func revive(ctx context.Context, tx pgx.Tx, ids []int64, by, why string, reset bool, selector any) (int64, time.Time, error) {
	return replayAction.on(ids, by, why, reset, selector).apply(ctx, tx)
}

// check trims By and Why and refuses an incomplete request before anything
// is read.
func (r *Request) check(doing string) error {
	r.By, r.Why = strings.TrimSpace(r.By), strings.TrimSpace(r.Why)
	switch {
	case r.By == "" || r.Why == "":
		return &AuditRequiredError{Doing: doing}
	case r.By == AutoBy:
		return bounds.Invalid("By", "%q is reserved for the auto-replay policy", AutoBy)
	case len(r.IDs) == 0 && r.filter() == Filter{Allowed: r.Allowed}:
		return ErrNoSelector
	case r.Limit < 0:
		return bounds.Invalid("Limit", "must not be negative, got %d", r.Limit)
	case r.Max < 0:
		return bounds.Invalid("Max", "must not be negative, got %d", r.Max)
	case len(r.IDs) > maxIDs:
		return bounds.Invalid("IDs", "names %d ids, more than %d", len(r.IDs), maxIDs)
	}
	return nil
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
	for k, v := range map[string]string{"entity_type": r.EntityType, "scope_key": r.ScopeKey, "class": r.Class, "text": r.Text} {
		if v != "" {
			sel[k] = v
		}
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
// without duplicates. Its errors quote the offending part.
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
			return nil, fmt.Errorf("%q: %w", part, err)
		}
		last := first
		if isRange {
			if last, err = parseID(hi); err != nil {
				return nil, fmt.Errorf("%q: %w", part, err)
			}
			if last < first {
				return nil, fmt.Errorf("%q: range ends before it starts", part)
			}
		}
		if last-first >= maxIDs || len(ids)+int(last-first) >= maxIDs {
			return nil, fmt.Errorf("more than %d ids", maxIDs)
		}
		for n := range last - first + 1 {
			ids = append(ids, first+n)
		}
	}
	if len(ids) == 0 {
		return nil, errors.New("no ids given")
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
