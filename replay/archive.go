package replay

import (
	"cmp"
	"context"
	"time"

	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/policy"
)

// BatchDefault is the most rows one transaction of a batched action
// (archive, or a replay or discard with Yes) changes, so that no
// transaction holds many row locks, or its xid and with it vacuum, for
// long: moving 10,000 rows to the dead letter took two seconds.
const BatchDefault = 1000

// ArchiveRequest is one archive: failed and discarded rows whose failure is
// older than OlderThan move from outbox_events to outbox_dead_letter, each
// keeping its status, so a discarded row stays one that nothing revives.
type ArchiveRequest struct {
	// OlderThan is how long ago, on this host's clock, a row must have
	// failed (updated_at) to move. It or Before is required.
	OlderThan time.Duration
	// Before is the cut-off itself, in place of OlderThan: a confirmation
	// acts on the cut-off its dry run resolved.
	Before time.Time
	// IDs, Projection and Reason narrow the selection and combine with AND.
	// Every id must exist and be failed or discarded, or nothing moves.
	IDs        []int64
	Projection string
	Reason     string
	// By and Why go to the audit rows and are required.
	By, Why string
	// DryRun reports what would move and changes nothing, locking no row.
	DryRun bool
	// BatchSize is the most rows one transaction, with its own audit row,
	// moves. Defaults to 1000.
	BatchSize int
	// Given is the selector as the operator typed it, as in Request.
	Given map[string]string
	// Expect, when set, is a dry run's Report.Token: the archive moves
	// those rows, in transactions of BatchSize, or refuses and moves
	// nothing when the selection changed, as Request.Expect does.
	Expect string
	// Max, when set, caps a selection without IDs that a dry run shows (and
	// so one held by Expect) as Request.Max caps a replay; Yes lifts it.
	// The batched archive needs no cap.
	Max int
	Yes bool
	// Allowed holds the archive to the rows the actor may archive, as
	// Request.Allowed.
	Allowed *policy.Allowed
}

// archiveSQL moves rows in one statement; the status check makes it a
// compare-and-set. History is kept as it was: archived_at and the audit id
// say when and by whom the row was archived.
const archiveSQL = `
WITH moved AS (
  DELETE FROM outbox_events
   WHERE id = ANY(@ids) AND (status = 'failed' OR status = 'discarded')
  RETURNING id, projection, entity_type, entity_id, op, event_version, payload, scope_key, status,
            attempts, error_class, error_reason, last_error, error_history, replay_count, created_at, updated_at
)
INSERT INTO outbox_dead_letter (id, projection, entity_type, entity_id, op, event_version, payload, scope_key, status,
            attempts, error_class, error_reason, last_error, error_history, replay_count, created_at, updated_at,
            archived_at, archive_audit_id)
SELECT id, projection, entity_type, entity_id, op, event_version, payload, scope_key, status,
       attempts, error_class, error_reason, last_error, error_history, replay_count, created_at, updated_at,
       now(), @audit_id::bigint
  FROM moved`

var archiveAction = action{name: "archive", doing: "archiving", rows: closedRows, sql: archiveSQL}

// Archive moves the selected failed and discarded rows, with every column,
// to the dead letter under the same ids. Selected by IDs, it is one
// transaction and refuses like Replay; a dry run reads without locking,
// and a confirmation held to it by Expect moves its rows as
// action.confirmed does; otherwise it moves batches of BatchSize rows,
// oldest failure first, each committed with its own audit row, until none
// is left, and a failure stops it after the batches already committed.
func Archive(ctx context.Context, db Beginner, ar ArchiveRequest) (Report, error) {
	ar.BatchSize = cmp.Or(ar.BatchSize, BatchDefault)
	now := time.Now()
	req := Request{IDs: ar.IDs, Projection: ar.Projection, Reason: ar.Reason, Until: cmp.Or(ar.Before, now.Add(-ar.OlderThan)),
		By: ar.By, Why: ar.Why, DryRun: ar.DryRun, Given: ar.Given, Expect: ar.Expect, Max: ar.Max, Yes: ar.Yes,
		Allowed: ar.Allowed}
	rep := Report{DryRun: ar.DryRun}
	if err := req.check(archiveAction.doing); err != nil {
		return rep, err
	}
	switch {
	case ar.Before.IsZero() && ar.OlderThan <= 0:
		return rep, bounds.Invalid("OlderThan", "must be positive, got %s", ar.OlderThan)
	case !ar.Before.IsZero() && !ar.Before.Before(now):
		return rep, bounds.Invalid("Before", "must be in the past, got %s", ar.Before.UTC().Format(time.RFC3339))
	case ar.BatchSize < 0:
		return rep, bounds.Invalid("BatchSize", "must not be negative, got %d", ar.BatchSize)
	case len(ar.IDs) > ar.BatchSize:
		return rep, bounds.Invalid("IDs", "names %d ids, more than the %d one archive moves at once", len(ar.IDs), ar.BatchSize)
	}
	one := archiveAction
	one.capped = ar.Max > 0
	switch {
	case req.DryRun:
		return one.preview(ctx, db, req, 0)
	case req.Expect != "":
		rep, err := one.confirmed(ctx, db, req, ar.BatchSize)
		if rep.AuditID != 0 && rep.AuditIDs == nil {
			rep.AuditIDs = []int64{rep.AuditID}
		}
		return rep, err
	case len(req.IDs) > 0:
		rep, err := one.once(ctx, db, req, 0)
		if rep.AuditID != 0 {
			rep.AuditIDs = []int64{rep.AuditID}
		}
		return rep, err
	}
	return archiveAction.batches(ctx, db, req, ar.BatchSize)
}

// restoreSQL brings archived failed rows back as pending under the same id,
// with their history and one more replay; the insert trigger wakes the
// leader at commit. Whether an event is stale by then is the claim's
// business. The status check keeps a discarded row in the dead letter even
// if a caller got past the selection.
const restoreSQL = `
WITH back AS (
  DELETE FROM outbox_dead_letter WHERE id = ANY(@ids) AND status = 'failed'
  RETURNING id, projection, entity_type, entity_id, op, event_version, payload, scope_key,
            attempts, error_class, error_reason, last_error, error_history, replay_count, created_at
)
INSERT INTO outbox_events (id, projection, entity_type, entity_id, op, event_version, payload, scope_key,
            status, attempts, next_retry_at, error_class, error_reason, last_error, error_history,
            replay_count, created_at, updated_at)
SELECT id, projection, entity_type, entity_id, op, event_version, payload, scope_key,
       'pending', CASE WHEN @reset THEN 0 ELSE attempts END, now(), error_class, error_reason, last_error,
       outbox_append_error(error_history, jsonb_build_object(
           'event', 'restored', 'by', @by::text, 'why', @why::text, 'at', now(),
           'audit_id', @audit_id::bigint, 'reset_attempts', @reset::bool), @keep),
       replay_count + 1, created_at, now()
  FROM back`

var restoreAction = action{name: "restore", doing: "restoring", rows: restorableRows, sql: restoreSQL, lockedDryRun: true}

// Restore brings archived failed rows back into outbox_events as pending,
// by id only, in one transaction with one audit row. Discarded is terminal
// for good: an id of an archived discarded row, like an unknown one, refuses
// the whole request. The other Request fields work as in Replay.
func Restore(ctx context.Context, db Beginner, req Request) (Report, error) {
	if len(req.IDs) == 0 {
		return Report{DryRun: req.DryRun}, bounds.Invalid("IDs", "are required: archived rows come back by id only")
	}
	return restoreAction.run(ctx, db, req)
}
