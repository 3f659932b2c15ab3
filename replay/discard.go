package replay

import "context"

// discardSQL closes failed rows for good. updated_at stays the time of
// failure, which archive goes by; when and why the row was discarded is in
// its history and the audit row.
const discardSQL = `
UPDATE outbox_events
   SET status = 'discarded',
       error_history = outbox_append_error(error_history, jsonb_build_object(
           'event', 'discarded', 'by', @by::text, 'why', @why::text, 'at', now(),
           'audit_id', @audit_id::bigint), @keep)
 WHERE id = ANY(@ids) AND status = 'failed'`

var discardAction = action{name: "discard", doing: "discarding", rows: failedRows, capped: true, sql: discardSQL}

// Discard moves the selected failed rows to discarded, a terminal status
// nothing revives, in one transaction with one audit row, or in batches as
// Replay does. It takes the same requests as Replay, refuses the same way,
// and changes nothing on a refusal.
func Discard(ctx context.Context, db Beginner, req Request) (Report, error) {
	return discardAction.run(ctx, db, req)
}
