package e2e

// Process tests of pause/resume and of the chronicle projection: real
// replicas, the CLI as an operator runs it, kill -9.

import (
	"bytes"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/cli"
	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// cli runs wlproj in-process against the cluster's database; it must exit 0.
func (c *cluster) cli(args ...string) string {
	c.t.Helper()
	var stdout, stderr bytes.Buffer
	code := cli.Run(append(args, "--database-url", c.db.URL), &stdout, &stderr)
	require.Zero(c.t, code, "wlproj %v: %s", args, stderr.String())
	return stdout.String()
}

// produceChronicle inserts n chronicle events over 20 books, each a new
// version, in a shuffled order; payloadBytes pads each payload.
func (c *cluster) produceChronicle(n, payloadBytes int) {
	c.t.Helper()
	c.db.Exec(c.t, `
		INSERT INTO outbox_events (projection, entity_type, entity_id, op, event_version, payload, scope_key)
		SELECT 'chronicle', 'book', (g % 20)::text, 'upsert', g,
		       jsonb_build_object('event', 'edited', 'n', g, 'pad', repeat('x', $2)), 'lib-' || (g % 7)
		  FROM generate_series(1, $1) g
		 ORDER BY random()`, n, payloadBytes)
}

// pending counts a projection's events not yet done or failed.
func (c *cluster) pending(projection string) int {
	c.t.Helper()
	return c.count(`projection = '` + projection + `' AND status IN ('pending', 'processing')`)
}

func (c *cluster) appended() int {
	c.t.Helper()
	return c.db.Int(c.t, `SELECT count(*) FROM chronicle_events`)
}

// chronicleExactlyOnce checks that chronicle_events holds each done
// chronicle event exactly once (event_id is its primary key), as the event
// was, and nothing else.
func (c *cluster) chronicleExactlyOnce() {
	c.t.Helper()
	done := c.count(`projection = 'chronicle' AND status = 'done'`)
	require.Equal(c.t, done, c.appended(), "one chronicle row per done chronicle event")
	require.Equal(c.t, done, c.db.Int(c.t, `
		SELECT count(*) FROM outbox_event_states e JOIN chronicle_events ch ON ch.event_id = e.id
		 WHERE e.projection = 'chronicle' AND e.status = 'done'
		   AND (ch.entity_type, ch.entity_id, ch.op, ch.version, ch.payload, ch.scope_key, ch.occurred_at)
		       IS NOT DISTINCT FROM
		       (e.entity_type, e.entity_id, e.op, coalesce(e.event_version, e.id), e.payload, e.scope_key, e.created_at)`),
		"each row is its event")
}

// A paused projection is not claimed while the other drains, and resumes
// where it stopped, across a leader failover.
func TestPauseSurvivesFailoverAndResumes(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.run("a", "b")
	out := c.cli("pause", "--projection", "chronicle", "--by", "pause-test", "--why", "chronicle table maintenance")
	require.Contains(t, out, "paused chronicle")

	c.produceChronicle(300, 10)
	c.produce(50, 3)
	harness.Eventually(t, 30*time.Second, "search drains", func() bool { return c.pending("search") == 0 })
	untouched := `projection = 'chronicle' AND status = 'pending' AND attempts = 0 AND locked_by IS NULL`
	require.Equal(t, 300, c.count(untouched), "no chronicle event was claimed")
	require.Zero(t, c.appended())

	old := c.leader()
	old.Kill()
	l := c.leader()
	c.start("a2")
	c.produce(30, 2)
	harness.Eventually(t, 30*time.Second, "search drains under the new leader", func() bool { return c.pending("search") == 0 })
	// Each projection is read from its own position: had the new leader
	// ignored the pause, it would have read the chronicle's rows as it read
	// the later search events.
	require.Equal(t, 300, c.count(untouched), "the new leader honours the pause")
	harness.Eventually(t, 10*time.Second, "the leader's gauge and /readyz show the pause", func() bool {
		v, ok, err := l.Metric(`outbox_projection_paused{projection="chronicle"}`)
		code, body, _ := l.Get("/readyz")
		return err == nil && ok && v == 1 && code == http.StatusOK && bytes.Contains(body, []byte(`"projection":"chronicle"`))
	})
	status := c.cli("status")
	require.Regexp(t, `(?m)^  chronicle\s+paused\s+300\s+\S+\s+\S+Z\s+pause-test\s+chronicle table maintenance$`, status)

	out = c.cli("resume", "--projection", "chronicle", "--by", "pause-test", "--why", "maintenance over")
	require.Contains(t, out, "resumed chronicle")
	c.settle(30 * time.Second)
	require.Equal(t, 300, c.count(`projection = 'chronicle' AND status = 'done'`))
	c.chronicleExactlyOnce()
	require.Equal(t, []string{"pause", "resume"}, c.auditActions())
}

// Both projections drain from one outbox; the chronicle holds each event
// exactly once after a kill -9 mid-drain and a replay of its failed events.
func TestChronicleExactlyOnceAfterKillsAndReplays(t *testing.T) {
	t.Parallel()
	c := newCluster(t, "OUTBOX_CHRONICLE_MAX_PAYLOAD_BYTES=2048", "OUTBOX_BULK_SIZE=20", "OUTBOX_CONCURRENCY=1")
	c.run("a", "b")
	c.cli("pause", "--projection", "chronicle", "--by", "chronicle-test", "--why", "build a backlog")
	const total, oversize = 4000, 5
	c.produceChronicle(total, 10)
	c.db.Exec(t, `
		INSERT INTO outbox_events (projection, entity_type, entity_id, op, payload)
		SELECT 'chronicle', 'book', 'big-' || g, 'upsert', jsonb_build_object('body', repeat('x', 4000))
		  FROM generate_series(1, $1) g`, oversize)
	c.produce(100, 2)

	c.cli("resume", "--projection", "chronicle", "--by", "chronicle-test", "--why", "drain it")
	var mid int
	harness.Eventually(t, 30*time.Second, "the chronicle drain under way", func() bool {
		mid = c.appended()
		return mid > 0
	})
	c.leader().Kill()
	t.Logf("killed the leader with %d of %d chronicle events appended", mid, total)
	require.Less(t, mid, total, "the kill came mid-drain")
	c.leader()
	c.drained(60 * time.Second)
	require.Equal(t, total, c.count(`projection = 'chronicle' AND status = 'done'`))
	require.Equal(t, oversize, c.count(`projection = 'chronicle' AND status = 'failed' AND error_reason = 'payload_invalid' AND attempts = 1`))
	c.chronicleExactlyOnce()

	// Raise the limit on every replica (a rolling restart), then replay.
	for _, r := range c.replicas {
		r.Stop(10 * time.Second)
	}
	c.env = append(c.env, "OUTBOX_CHRONICLE_MAX_PAYLOAD_BYTES=65536")
	c.run("c", "d")
	out := c.cli("replay", "--projection", "chronicle", "--reason", "payload_invalid",
		"--by", "chronicle-test", "--why", "raised OUTBOX_CHRONICLE_MAX_PAYLOAD_BYTES")
	require.Contains(t, out, "replayed 5 events")
	c.settle(30 * time.Second)
	require.Equal(t, total+oversize, c.count(`projection = 'chronicle' AND status = 'done'`))
	require.Equal(t, oversize, c.count(`projection = 'chronicle' AND status = 'done' AND replay_count = 1`))
	c.chronicleExactlyOnce()
	require.Equal(t, 200, c.count(`projection = 'search' AND status = 'done'`), "search drained alongside")
}

func (c *cluster) auditActions() []string {
	c.t.Helper()
	return harness.Column[string](c.t, c.db, `SELECT action FROM outbox_replay_audit ORDER BY id`)
}
