package outbox_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/outbox"
)

// carrySize is WLPROJ_CARRY_ROWS, the queued rows of a paused projection
// and the failed rows TestLedgerCarryPageCostIgnoresBacklogAndFailedRows
// puts beside the ledger: 20,000 each by default, so that `make test`
// stays fast; the issue measured 300,000.
func carrySize(t *testing.T) int {
	v := os.Getenv("WLPROJ_CARRY_ROWS")
	if v == "" {
		return 20_000
	}
	n, err := strconv.Atoi(v)
	require.NoError(t, err, "WLPROJ_CARRY_ROWS")
	return n
}

// A page of the ledger's carry reads what it carries, whatever else the
// outbox holds: beside a paused projection's queued rows and as many
// failed rows (none of them of the page's documents), one page reads about
// the buffers it reads beside none. The issue measured a page growing with
// both: the whole backlog recomputed per page, and each entry checked
// against every failed row (over 60 s a page at 300,000). Each line it
// logs ("carry: ...") is the measure.
func TestLedgerCarryPageCostIgnoresBacklogAndFailedRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Lead(t, 1)
	n := carrySize(t)
	// 20 pages of old live entries in partition 0, none needed.
	b.Exec(t, `INSERT INTO outbox_ledger (slot, projection, entity_type, entity_id, version, deleted, event_id, applied_at)
		SELECT 0, 'search', 'book', 'l' || g, 1, false, g, now() - interval '2 hours' FROM generate_series(1, 20000) g`)
	b.Exec(t, `VACUUM ANALYZE outbox_events, outbox_ledger`)
	alonePlan, aloneMs, alone := explainAnalyze(t, b, outbox.CarryLedgerSQL(0), []any{carryArgs}, outbox.CarryPlan)
	t.Logf("carry: one page beside nothing: %.1f ms, %d buffers", aloneMs, alone)

	b.Exec(t, `INSERT INTO outbox_events (projection, entity_type, entity_id, op, event_version, status)
		SELECT 'search', 'book', 'q' || g, 'upsert', 1, 'queued' FROM generate_series(1, $1) g`, n)
	b.Exec(t, `INSERT INTO outbox_projection_state (projection, paused, changed_by, why) VALUES ('search', true, 'test', 'test')`)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, status, error_class, error_reason, updated_at)
		SELECT 'book', 'f' || g, 'upsert', 1, 'failed', 'deterministic', 'mapping_error', now() FROM generate_series(1, $1) g`, n)
	b.Exec(t, `VACUUM ANALYZE outbox_events`)
	plan, ms, beside := explainAnalyze(t, b, outbox.CarryLedgerSQL(0), []any{carryArgs}, outbox.CarryPlan)
	t.Logf("carry: one page beside %d queued and %d failed rows: %.1f ms, %d buffers\n%s", n, n, ms, beside, plan)
	requireNoSeqScan(t, b, plan, "a page reads a table whole")
	require.Regexp(t, `outbox_events_\d_open_doc_idx`, plan, "an entry's open events are one probe by its document")
	backlogPlan, backlogMs, backlogBuffers := explainAnalyze(t, b, outbox.CarryBacklogSQL(0), []any{carryArgs}, outbox.CarryPlan)
	t.Logf("carry: the backlog's entries, once a rotation, beside %d queued rows: %.1f ms, %d buffers\n%s", n, backlogMs, backlogBuffers, backlogPlan)
	requireNoSeqScan(t, b, backlogPlan, "the backlog's carry reads a table whole")
	require.LessOrEqual(t, beside, alone*12/10+50,
		"a page beside %d queued and %d failed rows read %d buffers, beside none %d\n%s\nalone:\n%s", n, n, beside, alone, plan, alonePlan)

	b.rotationDue(t, 2)
	start := time.Now()
	r, err := b.Store.RotateLedger(context.Background(), 1, time.Hour, 3*time.Hour, 1000)
	require.NoError(t, err)
	require.True(t, r.Rotated)
	require.Zero(t, r.Carried)
	t.Logf("carry: the rotation of 20 pages beside %d queued and %d failed rows: %s", n, n, time.Since(start).Round(time.Millisecond))
}
