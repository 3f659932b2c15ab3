package harness

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// Querier is a pool, a connection or a transaction.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// dbTimeout bounds the waits for Postgres itself, which a restart takes
// away for a few seconds.
const dbTimeout = 30 * time.Second

// Now is Postgres' clock, the one created_at and processed_at are on, so a
// fault's time and the acks after it compare without clock skew.
func Now(ctx context.Context, q Querier) (time.Time, error) {
	var now time.Time
	err := Poll(ctx, dbTimeout, "the database clock", func(ctx context.Context) (bool, error) {
		err := q.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now)
		return err == nil, err
	})
	return now, err
}

// AckedAfter is the earliest processed_at of a row acked done after after,
// or of a position checkpoint that confirmed queued rows, by worker by (any
// if empty); false if there is none yet. For queued rows it is the first
// checkpoint, saved at most once a second, not the first event applied:
// evidence that something was, which FirstAppliedAfter dates.
func AckedAfter(ctx context.Context, q Querier, after time.Time, by string) (time.Time, bool, error) {
	var at *time.Time
	err := q.QueryRow(ctx, `
		SELECT least((SELECT min(processed_at) FROM outbox_events
		               WHERE status = 'done' AND processed_at > $1 AND ($2 = '' OR locked_by = $2)),
		             (SELECT min(confirmed_at) FROM outbox_positions
		               WHERE confirmed_at > $1 AND ($2 = '' OR saved_by = $2)))`, after, by).Scan(&at)
	if err != nil || at == nil {
		return time.Time{}, false, err
	}
	return *at, true, nil
}

// firstAppliedSQL dates the first event applied after $1 by worker $2 (any
// if empty), on the database's clock, by the write that shows it applied
// for each kind of row and projection:
//   - a claimed row: its processed_at, set by the ack, with locked_by;
//   - a queued row of a search projection (one that keeps the ledger): the
//     ledger entry's applied_at, the now() of the ack that wrote it, which
//     the leader sends once the engine has answered the bulk: a few
//     milliseconds after the index write, never before it;
//   - a queued row of the chronicle: chronicle_events.appended_at, the
//     now() of the insert itself.
//
// Neither the ledger nor the chronicle says who wrote an entry; an entry
// dated at or after the start of by's term (outbox_leader.acquired_at, the
// now() of the epoch bump) is by's: a deposed leader's write that started
// later fails the fencing guard. Neither table has an index on the time:
// each read scans them, so callers read once they know an ack happened.
const firstAppliedSQL = `
WITH term AS (SELECT CASE WHEN $2 = '' THEN $1::timestamptz
                          ELSE (SELECT max(acquired_at) FROM outbox_leader WHERE holder = $2) END AS since)
SELECT least((SELECT min(processed_at) FROM outbox_events
               WHERE status = 'done' AND processed_at > $1 AND ($2 = '' OR locked_by = $2)),
             (SELECT min(applied_at) FROM outbox_ledger, term WHERE applied_at > $1 AND applied_at >= term.since),
             (SELECT min(appended_at) FROM chronicle_events, term WHERE appended_at > $1 AND appended_at >= term.since))`

// FirstAppliedAfter is when the first event applied after after by worker
// by (any if empty) was applied (firstAppliedSQL); false if none was yet.
func FirstAppliedAfter(ctx context.Context, q Querier, after time.Time, by string) (time.Time, bool, error) {
	var at *time.Time
	if err := q.QueryRow(ctx, firstAppliedSQL, after, by).Scan(&at); err != nil || at == nil {
		return time.Time{}, false, err
	}
	return *at, true, nil
}

// AppliedAfter is when the first event after after was applied by worker
// by (any if empty), once AckedAfter finds an ack: FirstAppliedAfter, what
// a user of the index or the timeline sees, not when the leader next saved
// its position. Where no write dates it (every event of the term
// superseded, a chronicle in a table of another name), the ack AckedAfter
// found. False while there is no ack: the ledger and the chronicle are
// scanned only once there is one.
func AppliedAfter(ctx context.Context, q Querier, after time.Time, by string) (time.Time, bool, error) {
	acked, ok, err := AckedAfter(ctx, q, after, by)
	if err != nil || !ok {
		return acked, ok, err
	}
	applied, ok, err := FirstAppliedAfter(ctx, q, after, by)
	if err != nil {
		return time.Time{}, false, err
	}
	if !ok || applied.After(acked) {
		return acked, true, nil
	}
	return applied, true, nil
}

// WaitFirstAck waits for AppliedAfter to find the first event applied.
func WaitFirstAck(ctx context.Context, timeout time.Duration, q Querier, after time.Time, by string) (time.Time, error) {
	var at time.Time
	what := "an event applied after " + after.Format(time.RFC3339Nano)
	if by != "" {
		what += " by " + by
	}
	err := Poll(ctx, timeout, what, func(ctx context.Context) (bool, error) {
		var ok bool
		var err error
		at, ok, err = AppliedAfter(ctx, q, after, by)
		return ok, err
	})
	return at, err
}

// WaitDrained waits until no event is pending or processing: no claimed
// row, nor a queued one no position has passed. Three EXISTS on indexes,
// not a count or the view of every row: cheap however long the outbox.
func WaitDrained(ctx context.Context, timeout time.Duration, q Querier) error {
	return Poll(ctx, timeout, "every event done or failed", func(ctx context.Context) (bool, error) {
		var busy bool
		err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM outbox_events WHERE status = 'pending')
		                            OR EXISTS (SELECT 1 FROM outbox_events WHERE status = 'processing')
		                            OR EXISTS (SELECT 1 FROM outbox_queue_backlog_rows(1))`).Scan(&busy)
		return err == nil && !busy, err
	})
}

// Drained is WaitDrained for tests.
func Drained(t testing.TB, q Querier, timeout time.Duration) {
	t.Helper()
	require.NoError(t, WaitDrained(context.Background(), timeout, q))
}
