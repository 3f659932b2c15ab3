package outbox_test

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// entry is outbox_ledger_entry's answer for one document of 'search',
// nil when there is none.
func (b bundle) entry(t *testing.T, entity string) []int64 {
	t.Helper()
	var e []int64
	err := b.Pool.QueryRow(context.Background(), `SELECT ARRAY[version, event_id] FROM outbox_ledger_entry('search', 'book', $1)`,
		entity).Scan(&e)
	if err == pgx.ErrNoRows {
		return nil
	}
	require.NoError(t, err)
	return e
}

// TestLedgerEntryComesFromTheNewestPartitionHoldingIt: the lookup reads
// the current partition, and only when that holds nothing of the
// document, the newest entry of the two older ones; entries are written in
// order (migration 00029), so that is the newest partition's newest. While
// the current partition holds the document, the older two are never read;
// a document no partition holds costs one index probe of each, in two
// steps (migration 00030), not three.
func TestLedgerEntryComesFromTheNewestPartitionHoldingIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Slot 1 is current, 0 the one before it, 2 the oldest.
	b.Exec(t, `UPDATE outbox_ledger_rotation SET slot = 1`)
	b.Exec(t, `INSERT INTO outbox_ledger (slot, projection, entity_type, entity_id, version, deleted, event_id) VALUES
		(2, 'search', 'book', 'everywhere', 1, false, 1), (0, 'search', 'book', 'everywhere', 2, false, 2),
		(1, 'search', 'book', 'everywhere', 3, false, 3), (1, 'search', 'book', 'everywhere', 4, false, 4),
		(2, 'search', 'book', 'older-two', 5, false, 5), (0, 'search', 'book', 'older-two', 6, false, 6),
		(2, 'search', 'book', 'oldest-only', 7, false, 7)`)
	require.Equal(t, []int64{4, 4}, b.entry(t, "everywhere"), "the current partition's newest")
	require.Equal(t, []int64{6, 6}, b.entry(t, "older-two"), "the partition before the current one")
	require.Equal(t, []int64{7, 7}, b.entry(t, "oldest-only"))
	require.Nil(t, b.entry(t, "nowhere"))

	plan := b.explain(t, `SELECT * FROM outbox_ledger_entry('search', 'book', 'everywhere')`)
	read := regexp.MustCompile(`Index Scan using \S+ on (outbox_ledger_\d) \S+ \(actual`).FindAllStringSubmatch(plan, -1)
	require.Len(t, read, 1, "one index read:\n%s", plan)
	require.Equal(t, "outbox_ledger_1", read[0][1], "the current partition's:\n%s", plan)

	plan = b.explain(t, `SELECT * FROM outbox_ledger_entry('search', 'book', 'nowhere')`)
	read = regexp.MustCompile(`Index Scan using \S+ on (outbox_ledger_\d) \S+ \(actual`).FindAllStringSubmatch(plan, -1)
	require.Len(t, read, 3, "one index read of each partition:\n%s", plan)
	require.Equal(t, 3, strings.Count(plan, "Limit (actual"), "two steps, each with its limit, under the function's own (00029 took three):\n%s", plan)
}

// explain is sql's plan as it ran, without costs.
func (b bundle) explain(t *testing.T, sql string) string {
	t.Helper()
	lines, err := pgx.CollectRows(must(b.Pool.Query(context.Background(), "EXPLAIN (ANALYZE, COSTS OFF, TIMING ON) "+sql)),
		pgx.RowTo[string])
	require.NoError(t, err)
	return strings.Join(lines, "\n")
}

// TestTermWaitsForTheLastTermsLedgerWrites: a deposed leader's ack still
// in flight (its transaction has inserted into the ledger and not yet
// committed) is waited for when the next term takes the ledger, so the new
// leader never judges an event by a ledger that misses it, and never
// writes an older entry into a newer partition after it. Readers of the
// ledger are not waited for.
func TestTermWaitsForTheLastTermsLedgerWrites(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	reader, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	defer reader.Rollback(ctx) //nolint:errcheck
	_, err = reader.Exec(ctx, `SELECT * FROM outbox_ledger_entry('search', 'book', 'r1')`)
	require.NoError(t, err)
	start := time.Now()
	_, _, err = b.Store.LoadQueue(ctx)
	require.NoError(t, err)
	require.Less(t, time.Since(start), 2*time.Second, "a reader of the ledger is not waited for")

	late, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	defer late.Rollback(ctx) //nolint:errcheck
	_, err = late.Exec(ctx, `INSERT INTO outbox_ledger (projection, entity_type, entity_id, version, deleted, event_id)
		VALUES ('search', 'book', 'r1', 6, false, 6)`)
	require.NoError(t, err)
	taken := make(chan error, 1)
	go func() { _, _, err := b.Store.LoadQueue(ctx); taken <- err }()
	harness.Eventually(t, 5*time.Second, "the term's start waits for the ledger write's lock", func() bool {
		select {
		case err := <-taken:
			t.Fatalf("the term took the ledger while a ledger write of the term before was in flight (err %v)", err)
		default:
		}
		return b.Int(t, `SELECT count(*) FROM pg_locks WHERE relation = 'outbox_ledger'::regclass AND NOT granted`) > 0
	})
	require.NoError(t, late.Commit(ctx))
	select {
	case err := <-taken:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("the term did not take the ledger once the write committed")
	}
	require.Equal(t, []int64{6, 6}, b.entry(t, "r1"))
}
