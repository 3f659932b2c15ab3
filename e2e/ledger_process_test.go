package e2e

// A process test of the applied-version ledger: "correct for months" in a
// few seconds. Deletes, versions out of order, events without a version, a
// kill -9 of the leader mid-stream, and failed upserts replayed after the
// engine has forgotten their books' deletes; it ends with harness.Verified,
// which holds the ledger to the newest version of every document.

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/replay"
)

func TestLedgerKillsDeletesAndReplays(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	l := c.run("a", "b")

	// Upserts the strict mapping refuses (an isbn), one per book; once they
	// have failed, their books are deleted at a higher version or without
	// one, or upserted at a higher version, or left alone.
	const perStory = 3
	failed := c.ids(`
		INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload)
		SELECT 'book', s || '-' || k, 'upsert', CASE WHEN s = 'unversioned' THEN NULL ELSE 1 END,
		       '{"kind": "book", "title": "refused", "isbn": "978-0441013593"}'
		  FROM unnest(ARRAY['deleted', 'unversioned', 'overwritten', 'left-alone']) s, generate_series(1, $1) k
		RETURNING id`, perStory)
	harness.Eventually(t, 20*time.Second, "the refused upserts fail", func() bool {
		return c.count(`status = 'failed' AND error_reason = 'mapping_error'`) == len(failed)
	})
	c.db.Exec(t, `
		INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload)
		SELECT entity_type, entity_id, CASE WHEN entity_id LIKE 'overwritten-%' THEN 'upsert' ELSE 'delete' END,
		       event_version + 1, '{"kind": "book", "title": "v2"}'
		  FROM outbox_events WHERE id = ANY($1) AND entity_id NOT LIKE 'left-alone-%'
		 ORDER BY id`, failed)
	c.drained(20 * time.Second)
	harness.DeletesForgotten(t, c.index)

	// The mapping is fixed and the stream starts; mid-stream the leader is
	// killed and the failed upserts are replayed through the binary while
	// the other takes over.
	require.NoError(t, harness.ES(context.Background(), harness.ElasticURL(t), http.MethodPut, "/"+c.index+"/_mapping",
		[]byte(`{"properties": {"isbn": {"type": "keyword"}}}`), nil))
	before := metric(t, l, processedMetric)
	c.slowBulks()
	c.produceOutOfOrder(1000, 5)
	require.Less(t, c.midStream(l, before+1000), before+5000, "the kill comes mid-stream")
	l.Kill()
	cmd := exec.Command(harness.Binary(t), "replay", "--ids", replay.FormatIDs(failed),
		"--by", "ledger-test", "--why", "isbn added to the mapping, after the deletes")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+c.db.URL)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	t.Logf("replayed with %d events pending or processing", c.count(`status IN ('pending', 'processing')`))
	next := c.leader()
	require.NotEqual(t, l.Name, next.Name)
	v := c.settle(60 * time.Second)
	require.Zero(t, v.Failed)
	require.Equal(t, len(failed), c.db.Count(t, `id = ANY($1) AND status = 'done' AND replay_count = 1`, failed))

	// Each book's ledger entry names its last row: the delete or newer
	// upsert where there was one, the replayed upsert dropped unsent; the
	// replayed upsert itself where the book was left alone.
	require.Equal(t, len(failed), c.db.Int(t, `
		SELECT count(*) FROM outbox_ledger_entries a
		 WHERE a.entity_id IN (SELECT entity_id FROM outbox_events WHERE id = ANY($1))
		   AND a.event_id = (SELECT max(id) FROM outbox_events e WHERE e.entity_id = a.entity_id)`, failed))
}

// ids runs an insert and returns the ids it returns.
func (c *cluster) ids(sql string, args ...any) []int64 {
	c.t.Helper()
	return harness.Column[int64](c.t, c.db, sql, args...)
}

// produceOutOfOrder inserts versions events for each of entities books in a
// shuffled order, so older versions often arrive after newer ones; about one
// in seven is a delete, and every tenth book has no versions at all (the
// outbox id orders its events).
func (c *cluster) produceOutOfOrder(entities, versions int) {
	c.t.Helper()
	c.db.Exec(c.t, `
		INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload, scope_key)
		SELECT 'book', 's' || e, op, CASE WHEN e % 10 = 0 THEN NULL ELSE v END,
		       CASE WHEN op = 'delete' THEN '{}'::jsonb ELSE
		       jsonb_build_object('kind', 'book', 'title', 'Book ' || e || ' v' || v,
		                          'body', repeat('lorem ipsum ', 20), 'library_id', 'lib-' || (e % 7),
		                          'position', v, 'updated_at', now()) END,
		       'lib-' || (e % 7)
		  FROM (SELECT e, v, CASE WHEN random() < 0.15 THEN 'delete' ELSE 'upsert' END AS op
		          FROM generate_series(1, $1) e, generate_series(1, $2) v) s
		 ORDER BY random()`, entities, versions)
}
