package outbox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/outbox"
)

// The collapse the review measured: the outbox emptied and analyzed (what a
// new install or a truncate looks like to the planner), then a burst. With
// statistics that say "empty", the claim's plain plan reads every pending
// row through a bitmap scan and sorts them all; the claim's own plan walks
// the pending index in id order whatever the statistics say.
func TestClaimPlanDoesNotDependOnStatistics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Lead(t, 1)
	b.Exec(t, `ANALYZE outbox_events`)
	b.insert(t, 50_000)

	plain := b.explain(t, nil)
	require.Contains(t, plain, "Sort", "the trap this test guards against: without the claim's settings the planner sorts")

	plan := b.explain(t, outbox.ClaimPlan)
	require.Contains(t, plan, "Index Scan using outbox_events_pending_idx", plan)
	require.NotContains(t, plan, "Sort", plan)
	require.NotContains(t, plan, "Bitmap", plan)
	require.NotContains(t, plan, "Seq Scan on outbox_events", plan)
}

// explain returns the claim's plan under the given session settings.
func (b bundle) explain(t *testing.T, settings []string) string {
	t.Helper()
	ctx := context.Background()
	tx, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	for _, s := range settings {
		if s != "BEGIN" {
			_, err := tx.Exec(ctx, s)
			require.NoError(t, err)
		}
	}
	rows, err := tx.Query(ctx, "EXPLAIN "+outbox.ClaimSQL, pgx.NamedArgs{
		"owner": "w1", "epoch": 1, "leader": "test", "limit": 500, "lease_secs": 30.0, "claim": 1,
		"latest": []string{"search"}})
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return strings.Join(lines, "\n")
}
