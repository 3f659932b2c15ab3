package outbox_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/outbox"
)

// scaleRows is the done history the statements below run next to:
// WLPROJ_SCALE_ROWS, 1M by default (the bench's sql-at-scale step runs
// 10M).
func scaleRows(t *testing.T) int {
	v := os.Getenv("WLPROJ_SCALE_ROWS")
	if v == "" {
		return 1_000_000
	}
	n, err := strconv.Atoi(v)
	require.NoError(t, err, "WLPROJ_SCALE_ROWS")
	return n
}

// Every statement the leader runs per batch or on a schedule (the claim
// from the head and past its cursor among them), and the
// replicas' metrics poller, EXPLAIN ANALYZEd next to a long done history, a
// ledger of a fifth of it, and a backlog in every status: none may read
// outbox_events or the ledger sequentially. Each line it logs ("scale:
// <name> <ms> ms <buffers> buffers") is what `make bench`'s sql-at-scale
// step reads.
func TestStatementsAtScaleReadNoTableWhole(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Lead(t, 1)
	n := scaleRows(t)
	start := time.Now()
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, status, processed_at, created_at)
		SELECT 'book', (g % ($1 / 5))::text, 'upsert', g, 'done',
		       now() - make_interval(secs => ($1 - g) * 172800.0 / $1), now() - make_interval(secs => ($1 - g) * 172800.0 / $1)
		  FROM generate_series(1, $1) g`, n)
	b.Exec(t, `INSERT INTO outbox_ledger (slot, projection, entity_type, entity_id, version, deleted, event_id, applied_at)
		SELECT g % 3, 'search', 'book', g::text, g, g % 2 = 0, g, now() - make_interval(secs => (($1 / 5) - g) * 172800.0 / ($1 / 5))
		  FROM generate_series(0, $1 / 5 - 1) g`, n)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, status, error_class, error_reason, updated_at)
		SELECT 'book', 'f' || g, 'upsert', 1, 'failed', 'deterministic', CASE WHEN g % 2 = 0 THEN 'mapping_error' ELSE 'stuck' END,
		       now() - make_interval(secs => g)
		  FROM generate_series(1, 2000) g`)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, status)
		SELECT 'book', 'x' || g, 'upsert', 1, 'discarded' FROM generate_series(1, 500) g`)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, attempts, next_retry_at)
		SELECT 'book', 'r' || g, 'upsert', 1, 2, now() + interval '1 hour' FROM generate_series(1, 1000) g`)
	b.insert(t, 5_000)
	// Queued rows, as an application writes them: half of their documents
	// have a ledger entry (in each of the three partitions), half have
	// none, so the read's lookups both find and miss.
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, status)
		SELECT 'book', CASE WHEN g % 2 = 0 THEN g::text ELSE 'new' || g END, 'upsert', $1 + g, 'queued'
		  FROM generate_series(1, 5000) g`, n)
	b.Exec(t, `VACUUM ANALYZE outbox_events`)
	b.Exec(t, `VACUUM ANALYZE outbox_ledger`)
	t.Logf("scale: %d done rows, %d ledger entries, loaded in %s", n, n/5, time.Since(start).Round(time.Second))

	claimed := b.claim(t, 1, 500)
	require.Len(t, claimed, 500)
	ids := make([]int64, len(claimed))
	for i, e := range claimed {
		ids[i] = e.ID
	}
	claim := claimed[0].Claim
	failures := func() pgx.NamedArgs {
		k := 100
		terminal, retry, class, reason, msg := make([]bool, k), make([]float64, k), make([]string, k), make([]string, k), make([]string, k)
		for i := range k {
			terminal[i], retry[i], class[i], reason[i], msg[i] = i%2 == 0, 5, "transient", "engine_unavailable", "boom"
		}
		return pgx.NamedArgs{"owner": b.Store.Owner, "epoch": 1, "leader": b.Store.LeaderName, "claim": claim,
			"ids": ids[:k], "terminal": terminal, "retry_secs": retry, "class": class, "reason": reason,
			"message": msg, "keep": outbox.HistoryKeep}
	}
	fenced := func(extra pgx.NamedArgs) pgx.NamedArgs {
		a := pgx.NamedArgs{"owner": b.Store.Owner, "epoch": 1, "leader": b.Store.LeaderName}
		for k, v := range extra {
			a[k] = v
		}
		return a
	}

	queued, readArgs := queuedAtScale(t, b)
	holdHorizon(t, b)
	pastSQL, pastArgs := outbox.ClaimStatement(outbox.CursorOf(claimed), []string{"search"})
	for k, v := range (pgx.NamedArgs{"limit": 500, "lease_secs": 30.0, "claim": 99, "latest": []string{"search"}}) {
		pastArgs[k] = v
	}
	for _, st := range []struct {
		name string
		sql  string
		args []any
		plan []string
	}{
		{"claim", outbox.ClaimSQL, []any{fenced(pgx.NamedArgs{"limit": 500, "lease_secs": 30.0, "claim": 99,
			"latest": []string{"search"}})}, outbox.ClaimPlan},
		{"claim-past-cursor", pastSQL, []any{fenced(pastArgs)}, outbox.ClaimPlan},
		{"ack-done", outbox.AckDoneSQL, []any{fenced(pgx.NamedArgs{"ids": ids, "applied": ids, "claim": claim})}, nil},
		{"read-queued", outbox.ReadQueuedLedgerSQL, []any{readArgs}, outbox.QueuedPlan[1:]},
		{"ack-queued", outbox.AckQueuedSQL, []any{fenced(pgx.NamedArgs{"ids": queued, "applied": queued})}, nil},
		{"ack-failed", outbox.AckFailedSQL, []any{failures()}, nil},
		{"release", outbox.ReleaseSQL, []any{fenced(pgx.NamedArgs{"ids": ids})}, nil},
		{"reclaim", outbox.ReclaimSQL, []any{fenced(pgx.NamedArgs{"max_attempts": 10, "max_processing_secs": 300.0,
			"keep": outbox.HistoryKeep})}, nil},
		{"events-young", outbox.YoungEventsSQL(1), []any{86400.0}, nil},
		{"events-carry", outbox.CarryEventsSQL(1), []any{pgx.NamedArgs{"cur": 0, "page": 1000, "retention_secs": 86400.0}},
			outbox.CarryPlan},
		{"events-held", outbox.EventsHeldSQL(1), []any{pgx.NamedArgs{"retention_secs": 86400.0}}, outbox.CarryPlan},
		{"ledger-carry", outbox.CarryLedgerSQL(0), []any{carryArgs}, outbox.CarryPlan},
		{"ledger-carry-backlog", outbox.CarryBacklogSQL(0), []any{carryArgs}, outbox.CarryPlan},
		{"gauges", outbox.GaugesSQL, []any{300.0, outbox.GaugeCountCap}, nil},
		{"projection-states", outbox.StatesSQL, nil, nil},
		{"rebuild-writes", outbox.RebuildWritesSQL, nil, nil},
		{"leader", outbox.LeaderSQL, nil, nil},
	} {
		plan, ms, buffers := explainAnalyze(t, b, st.sql, st.args, st.plan)
		t.Logf("scale: %s %.3f ms %d buffers", st.name, ms, buffers)
		require.NotContains(t, plan, "JIT:", "%s is compiled on every run\n%s", st.name, plan)
		requireNoSeqScan(t, b, plan, "%s reads a table whole", st.name)
	}
}

// queuedAtScale is the read of the first 500 queued rows from the queue's
// origin, as a new leader's first read: its arguments, and the ids it
// returns, for the ack.
func queuedAtScale(t *testing.T, b bundle) ([]int64, pgx.NamedArgs) {
	t.Helper()
	origin, err := b.Store.Origin(context.Background())
	require.NoError(t, err)
	require.NotNil(t, origin)
	events, _, err := b.Store.ReadQueued(context.Background(), "search", *origin, 500, true)
	require.NoError(t, err)
	require.Len(t, events, 500)
	ids := make([]int64, len(events))
	for i, e := range events {
		ids[i] = e.ID
	}
	return ids, pgx.NamedArgs{"projection": "search", "tick": true, "cur": origin.Cur, "prev": origin.Cur,
		"xid": origin.XID, "after_id": origin.ID, "limit": 500}
}

// holdHorizon holds a snapshot open, as a long report or a stuck session
// would, until the test ends: the statements run while the vacuum horizon
// cannot pass it.
func holdHorizon(t *testing.T, b bundle) {
	t.Helper()
	ctx := context.Background()
	tx, err := b.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	var n int
	require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM outbox_leader`).Scan(&n))
}

// explainAnalyze runs sql under EXPLAIN (ANALYZE, BUFFERS) after settings,
// in a transaction it rolls back, and returns the plan, the execution time
// and the shared buffers touched.
func explainAnalyze(t *testing.T, b bundle, sql string, args []any, settings []string) (string, float64, int) {
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
	rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+sql, args...)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	plan, buffers := planBuffers(t, lines)
	var ms float64
	for _, l := range lines {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "Execution Time: "); ok {
			_, err := fmt.Sscanf(v, "%f ms", &ms)
			require.NoError(t, err)
		}
	}
	return plan, ms, buffers
}
