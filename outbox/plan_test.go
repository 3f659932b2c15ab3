package outbox_test

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

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

	for name, after := range map[string]*outbox.Cursor{"from the head": nil, "past a cursor": {ID: 0}} {
		plan := b.explainClaimAfter(t, after)
		require.Regexp(t, `using outbox_events_\d_due_idx`, plan, "%s", name)
		// Each candidate is locked through the primary key: a partial index
		// of the pending rows, which empty statistics price as low, is
		// walked whole when its key is not the id.
		require.Regexp(t, `Index Scan using outbox_events_\d_pkey on outbox_events_\d o`, plan, "%s", name)
		require.NotContains(t, plan, "Bitmap", "%s\n%s", name, plan)
		requireNoSeqScan(t, b, plan, "%s", name)
		require.NotContains(t, plan, "Hash Join", "%s\n%s", name, plan)
		require.NotContains(t, plan, "Hash Semi Join", "%s\n%s", name, plan)
		// 500 rows claimed and updated (~15 pages each: heap, primary key
		// and processing index, before and after; ~3 more for the ledger's
		// three partitions probed, and ~6 for the outbox's: each id is
		// looked up in each partition's primary key, to lock it and to
		// update it), not a read of the 50k pending; the collapse read all
		// of them to lock each candidate.
		_, buffers := planBuffers(t, strings.Split(plan, "\n"))
		require.Less(t, buffers, 17_000, "%s\n%s", name, plan)
		require.Less(t, heapFetches(plan)+rowsRemoved(plan), 5_000, "%s\n%s", name, plan)
	}
}

// seqScanOfOutbox is a plan's sequential scan of a partition of the
// outbox or the ledger (or of the table, before it was partitioned).
var seqScanOfOutbox = regexp.MustCompile(`Seq Scan on ((outbox_events|outbox_ledger)(_\d)?)\b`)

// requireNoSeqScan fails when plan reads a partition of the outbox or the
// ledger that holds rows sequentially. An empty one (the outbox's and the
// ledger's are until they are current) costs nothing to scan, and the
// planner rightly scans it when its statistics say so.
func requireNoSeqScan(t *testing.T, b bundle, plan string, msgAndArgs ...any) {
	t.Helper()
	for _, m := range seqScanOfOutbox.FindAllStringSubmatch(plan, -1) {
		if b.Int(t, `SELECT count(*) FROM (SELECT 1 FROM `+m[1]+` LIMIT 1) x`) > 0 {
			require.Fail(t, "a sequential scan of "+m[1]+", which holds rows\n"+plan, msgAndArgs...)
		}
	}
}

var rowsRemovedLine = regexp.MustCompile(`Rows Removed by Filter: (\d+)`)

// rowsRemoved sums the rows a plan's nodes read and dropped.
func rowsRemoved(plan string) int {
	n := 0
	for _, m := range rowsRemovedLine.FindAllStringSubmatch(plan, -1) {
		v, _ := strconv.Atoi(m[1])
		n += v
	}
	return n
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
	plan, _, buffers := explainAnalyze(t, b, outbox.ClaimSQL, []any{pgx.NamedArgs{
		"owner": "w1", "epoch": 1, "leader": "test", "limit": 500, "lease_secs": 30.0, "claim": 1,
		"latest": []string{"search"}}}, settings)
	return plan, buffers
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

// Rows claimed and acked while an old snapshot is open (a long report, an
// analyze, a backup) stay in the due index as entries the claim cannot
// skip: each one costs a heap visit on every claim until the snapshot ends
// and vacuum runs. The review counted ~9,600 such entries read per claim
// at 2,000 events/s. The leader's claims start past the last row they
// claimed, so they do not walk them.
func TestClaimPastTheCursorSkipsRowsClaimedBefore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.Lead(t, 1)
	old, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	defer old.Rollback(ctx) //nolint:errcheck
	_, err = old.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ`)
	require.NoError(t, err)
	_, err = old.Exec(ctx, `SELECT 1 FROM outbox_events LIMIT 1`)
	require.NoError(t, err)

	b.insert(t, 20_000)
	var last *outbox.Cursor
	for range 40 {
		events, err := b.Store.ClaimAfter(ctx, 1, 500, time.Minute, []string{"search"}, last, []string{"search"})
		require.NoError(t, err)
		require.Len(t, events, 500)
		last = outbox.CursorOf(events)
		ids := make([]int64, len(events))
		for i, e := range events {
			ids[i] = e.ID
		}
		_, err = b.Store.AckDone(ctx, 1, events[0].Claim, ids, ids)
		require.NoError(t, err)
	}
	b.insert(t, 500)

	head := b.explainClaimAfter(t, nil)
	cursor := b.explainClaimAfter(t, last)
	t.Logf("claim of 500 beside 20k claimed rows an old snapshot still sees: %d heap fetches from the head, %d past the cursor",
		heapFetches(head), heapFetches(cursor))
	require.Greater(t, heapFetches(head), 20_000, "the trap this test guards against: from the head every claimed row is visited\n%s", head)
	require.LessOrEqual(t, heapFetches(cursor), 1_000, "past the cursor only the rows claimed are\n%s", cursor)

	claimed, err := b.Store.ClaimAfter(ctx, 1, 1000, time.Minute, []string{"search"}, last, []string{"search"})
	require.NoError(t, err)
	require.Len(t, claimed, 500, "the rows inserted after the cursor")

	// A row that falls due behind the cursor is the head claim's.
	b.Exec(t, `UPDATE outbox_events SET status = 'pending', lease_until = NULL WHERE id = (SELECT min(id) FROM outbox_events)`)
	past, err := b.Store.ClaimAfter(ctx, 1, 1000, time.Minute, []string{"search"}, outbox.CursorOf(claimed), []string{"search"})
	require.NoError(t, err)
	require.Empty(t, past)
	fromHead, err := b.Store.Claim(ctx, 1, 1000, time.Minute, []string{"search"})
	require.NoError(t, err)
	require.Len(t, fromHead, 1)
}

var heapFetchesLine = regexp.MustCompile(`Heap Fetches: (\d+)`)

// heapFetches sums the heap visits of a plan's index-only scans.
func heapFetches(plan string) int {
	n := 0
	for _, m := range heapFetchesLine.FindAllStringSubmatch(plan, -1) {
		v, _ := strconv.Atoi(m[1])
		n += v
	}
	return n
}

// explainClaimAfter is the EXPLAIN ANALYZE of the claim past after (nil:
// from the head).
func (b bundle) explainClaimAfter(t *testing.T, after *outbox.Cursor) string {
	t.Helper()
	sql, args := outbox.ClaimStatement(after, []string{"search"})
	args["owner"], args["epoch"], args["leader"], args["limit"], args["lease_secs"], args["claim"], args["latest"] =
		"w1", 1, "test", 500, 30.0, 99, []string{"search"}
	plan, _, _ := explainAnalyze(t, b, sql, []any{args}, outbox.ClaimPlan)
	return plan
}

// cachedPlan prepares sql (named args) on one connection and runs it once
// under force_generic_plan after settings: the plan Postgres caches for a
// prepared statement once it finds it no costlier than planning each time.
// The returned func runs it again with EXPLAIN (ANALYZE, BUFFERS), on that
// plan, whatever the tables hold by then.
func cachedPlan(t *testing.T, b bundle, sql string, args pgx.NamedArgs, settings []string) (explain func() string) {
	t.Helper()
	ctx := context.Background()
	conn, err := b.Pool.Acquire(ctx)
	require.NoError(t, err)
	t.Cleanup(conn.Release)
	sql, params, err := args.RewriteQuery(ctx, conn.Conn(), sql, nil)
	require.NoError(t, err)
	// EXECUTE takes literals, not parameters.
	literals := make([]string, len(params))
	for i, p := range params {
		switch v := p.(type) {
		case string:
			literals[i] = "'" + v + "'"
		case []string:
			literals[i] = "ARRAY['" + strings.Join(v, "','") + "']::text[]"
		case []int64:
			parts := make([]string, len(v))
			for k, n := range v {
				parts[k] = strconv.FormatInt(n, 10)
			}
			literals[i] = "ARRAY[" + strings.Join(parts, ",") + "]::bigint[]"
		default:
			literals[i] = fmt.Sprint(v)
		}
	}
	_, err = conn.Exec(ctx, "PREPARE cached AS "+sql)
	require.NoError(t, err)
	run := func(explain bool) string {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck
		for _, s := range append(slices.Clone(settings), "SET LOCAL plan_cache_mode = force_generic_plan") {
			if s != "BEGIN" {
				_, err := tx.Exec(ctx, s)
				require.NoError(t, err)
			}
		}
		stmt := "EXECUTE cached(" + strings.Join(literals, ", ") + ")"
		if explain {
			stmt = "EXPLAIN (ANALYZE, BUFFERS) " + stmt
		}
		rows, err := tx.Query(ctx, stmt)
		require.NoError(t, err)
		defer rows.Close()
		var lines []string
		for rows.Next() {
			if explain {
				var l string
				require.NoError(t, rows.Scan(&l))
				lines = append(lines, l)
			}
		}
		require.NoError(t, rows.Err())
		return strings.Join(lines, "\n")
	}
	run(false)
	return func() string { return run(true) }
}

// cachedOnEmpty is cachedPlan on a new outbox where w1 leads epoch 1 and
// table, empty, was just analyzed: a new install's statistics.
func cachedOnEmpty(t *testing.T, table, sql string, args pgx.NamedArgs, settings []string) (bundle, func() string) {
	t.Helper()
	b := setup(t)
	b.Lead(t, 1)
	b.Exec(t, `ANALYZE `+table)
	return b, cachedPlan(t, b, sql, args, settings)
}

// A claim planned while the ledger was empty (a new install, a truncate)
// keeps that plan on its connection until the ledger is analyzed again: the
// sustained bench's emptied outbox fell 18 s behind at 2,000 events/s when
// each claim of 500 read a 30k-entry ledger whole for every event (1.2 s a
// claim). Here the plan is made on an empty ledger and run on a full one.
func TestClaimReadsTheLedgerByKeyWhateverItsStatistics(t *testing.T) {
	t.Parallel()
	b, explain := cachedOnEmpty(t, "outbox_ledger", outbox.ClaimSQL, pgx.NamedArgs{"owner": "w1", "epoch": 1, "leader": "test",
		"limit": 500, "lease_secs": 30.0, "claim": 1, "latest": []string{"search"}}, outbox.ClaimPlan)

	b.Exec(t, `INSERT INTO outbox_ledger (projection, entity_type, entity_id, version, deleted, event_id)
		SELECT 'search', 'book', g::text, 1, false, g FROM generate_series(1, 30000) g`)
	b.insert(t, 500)
	plan := explain()
	require.Contains(t, plan, "rows=500 loops=1", "the claim took the 500 rows\n%s", plan)
	require.NotContains(t, plan, "Seq Scan on outbox_ledger", "each event's ledger entry is read by its key\n%s", plan)
	requireNoSeqScan(t, b, plan, "the candidates are read through the indexes")
}

// The ack, planned likewise on an empty outbox, finds its rows by key once
// the outbox is full.
func TestAckFindsItsRowsByKeyWhateverTheStatistics(t *testing.T) {
	t.Parallel()
	b, explain := cachedOnEmpty(t, "outbox_events", outbox.AckDoneSQL, pgx.NamedArgs{"owner": "w1", "epoch": 1, "leader": "test",
		"claim": 1, "ids": []int64{1, 2, 3}, "applied": []int64{1, 2, 3}}, outbox.ByKeyPlan)

	b.insert(t, 30000)
	plan := explain()
	requireNoSeqScan(t, b, plan, "the acked rows are read by their ids")
}
