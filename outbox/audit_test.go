package outbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/outbox"
)

func TestAuditLogFilters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Exec(t, `
		INSERT INTO outbox_replay_audit (action, replayed_by, reason, selector, event_count, event_ids, replayed_at)
		SELECT CASE WHEN g <= 4 THEN 'replay' ELSE 'discard' END, CASE WHEN g % 2 = 0 THEN 'bob' ELSE 'alice' END,
		       'Ticket ' || g, '{}', 1, ARRAY[g::bigint, 100], now() - make_interval(hours => g)
		  FROM generate_series(1, 6) g`)
	for f, want := range map[outbox.AuditFilter][]int64{
		{}:                       {6, 5, 4, 3, 2, 1},
		{Action: "discard"}:      {6, 5},
		{By: "bob"}:              {6, 4, 2},
		{Text: "ticket 3"}:       {3},
		{EventID: 100, Limit: 2}: {6, 5},
		{EventID: 2}:             {2},
		{Before: 3}:              {2, 1},
		{Since: time.Now().Add(-150 * time.Minute)}: {2, 1},
		{Until: time.Now().Add(-330 * time.Minute)}: {6},
	} {
		got, err := outbox.AuditLog(context.Background(), b.Pool, f)
		require.NoError(t, err)
		var gotIDs []int64
		for _, a := range got {
			gotIDs = append(gotIDs, a.ID)
		}
		require.Equal(t, want, gotIDs, "%+v", f)
	}
	_, err := outbox.AuditLog(context.Background(), b.Pool, outbox.AuditFilter{Limit: -1})
	require.ErrorContains(t, err, "Limit")
}

// The auto-replay's budget reads only one actor's recent rows, through the
// audit table's index by actor and time, however long the trail.
func TestAuditedSinceUsesItsIndex(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.Exec(t, `INSERT INTO outbox_replay_audit (action, replayed_by, reason, selector, event_count, event_ids, replayed_at)
		VALUES ('replay', 'auto', 'x', '{}', 3, '{}', now()), ('replay', 'auto', 'x', '{}', 5, '{}', now() - interval '2 minutes'),
		       ('replay', 'alice', 'x', '{}', 7, '{}', now())`)
	n, err := outbox.AuditedSince(ctx, b.Pool, "auto", time.Minute)
	require.NoError(t, err)
	require.Equal(t, 3, n)

	tx, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // read only
	_, err = tx.Exec(ctx, `SET LOCAL enable_seqscan = off`)
	require.NoError(t, err)
	rows, err := tx.Query(ctx, `EXPLAIN `+outbox.AuditedSinceSQL, "auto", 60.0)
	require.NoError(t, err)
	plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Contains(t, strings.Join(plan, "\n"), "outbox_replay_audit_by_time_idx")
}
