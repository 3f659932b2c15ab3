package outbox_test

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/outbox"
)

// The collapse the review measured: the outbox emptied and analyzed (what a
// new install or a truncate looks like to the planner), then a burst. With
// statistics that say "empty", a plain plan reads every pending row and
// sorts them all; the claim's own plan reads the due index one projection
// at a time whatever the statistics say.
func TestClaimPlanDoesNotDependOnStatistics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Lead(t, 1)
	b.Exec(t, `ANALYZE outbox_events`)
	b.insert(t, 50_000)

	plan, buffers := b.explainClaim(t, outbox.ClaimPlan)
	require.Contains(t, plan, "using outbox_events_due_idx", plan)
	require.NotContains(t, plan, "Bitmap", plan)
	require.NotContains(t, plan, "Seq Scan on outbox_events", plan)
	require.NotContains(t, plan, "Hash Join", plan)
	require.NotContains(t, plan, "Hash Semi Join", plan)
	// 500 rows claimed and updated (~15 pages each: heap, primary key and
	// processing index, before and after), not a read of the 50k pending.
	require.Less(t, buffers, 10_000, plan)
}

// Rows of a paused projection and rows waiting out a backoff are never
// walked past: a claim next to 100k of each reads what a claim of the same
// due rows reads next to as many done rows, an outbox of the same size (the
// review measured 56.7 ms a claim with 300k paused rows on the id-ordered
// walk).
func TestClaimReadsNeitherPausedNorBackoffRows(t *testing.T) {
	t.Parallel()
	alone := setup(t)
	alone.Lead(t, 1)
	alone.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, payload, status, processed_at)
		SELECT 'book', 'd' || g, 'upsert', '{}', 'done', now() FROM generate_series(1, 200000) g`)
	alone.insert(t, 1_000)
	alone.Exec(t, `VACUUM ANALYZE outbox_events`)
	_, base := alone.explainClaim(t, outbox.ClaimPlan)

	b := setup(t)
	b.Lead(t, 1)
	b.Exec(t, `INSERT INTO outbox_events (projection, entity_type, entity_id, op, payload)
		SELECT 'chronicle', 'book', g::text, 'upsert', '{}' FROM generate_series(1, 100000) g`)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, payload, attempts, next_retry_at)
		SELECT 'book', 'r' || g, 'upsert', '{}', 3, now() + interval '1 hour' FROM generate_series(1, 100000) g`)
	b.Exec(t, `INSERT INTO outbox_projection_state (projection, paused, changed_by, why) VALUES ('chronicle', true, 'test', 'test')`)
	b.insert(t, 1_000)
	b.Exec(t, `VACUUM ANALYZE outbox_events`)
	plan, buffers := b.explainClaim(t, outbox.ClaimPlan)
	require.LessOrEqual(t, buffers, base*12/10+20, "claim beside 200k parked rows read %d buffers, alone %d\n%s", buffers, base, plan)

	claimed := b.claim(t, 1, 2_000)
	require.Len(t, claimed, 1_000, "only the due rows of projections not paused")
	for _, e := range claimed {
		require.Equal(t, "search", e.Projection)
		require.NotContains(t, e.EntityID, "r")
	}
}

var buffersLine = regexp.MustCompile(`Buffers: shared(?: hit=(\d+))?(?: read=(\d+))?`)

// explainClaim runs the claim under EXPLAIN (ANALYZE, BUFFERS) with the
// given session settings, rolls it back, and returns its plan and the
// shared buffers the whole statement touched.
func (b bundle) explainClaim(t *testing.T, settings []string) (string, int) {
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
	rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+outbox.ClaimSQL, pgx.NamedArgs{
		"owner": "w1", "epoch": 1, "leader": "test", "limit": 500, "lease_secs": 30.0, "claim": 1,
		"latest": []string{"search"}})
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return planBuffers(t, lines)
}

// planBuffers joins an EXPLAIN (ANALYZE, BUFFERS) output and returns it
// with the shared buffers of its top node, which include its children's.
func planBuffers(t *testing.T, lines []string) (string, int) {
	t.Helper()
	plan := strings.Join(lines, "\n")
	m := buffersLine.FindStringSubmatch(plan)
	require.NotNil(t, m, plan)
	hit, _ := strconv.Atoi(m[1])
	read, _ := strconv.Atoi(m[2])
	return plan, hit + read
}
