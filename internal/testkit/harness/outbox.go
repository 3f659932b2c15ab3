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
// if empty); false if there is none yet.
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

// WaitFirstAck waits for AckedAfter to find an ack.
func WaitFirstAck(ctx context.Context, timeout time.Duration, q Querier, after time.Time, by string) (time.Time, error) {
	var at time.Time
	what := "an ack after " + after.Format(time.RFC3339Nano)
	if by != "" {
		what += " by " + by
	}
	err := Poll(ctx, timeout, what, func(ctx context.Context) (bool, error) {
		var ok bool
		var err error
		at, ok, err = AckedAfter(ctx, q, after, by)
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
