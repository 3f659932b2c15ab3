package e2e

// Process-level tests: two real `wlproj run` replicas against the real
// Postgres and the real engine (behind the fault proxy), driven as an operator
// would. Every test ends by checking that no event was lost or regressed.

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/faultproxy"
	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/leader"
)

func TestReplicasOneLeaderDrainsEverything(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	a, b := c.start("a"), c.start("b")
	l := c.leader()
	c.produce(2000, 5)

	// While draining, never two leaders.
	deadline := time.Now().Add(60 * time.Second)
	for c.count(`status IN ('pending', 'processing')`) > 0 {
		require.True(t, time.Now().Before(deadline), "drain took too long")
		require.False(t, a.IsLeader() && b.IsLeader(), "two leaders at once")
		time.Sleep(50 * time.Millisecond)
	}
	require.True(t, l.IsLeader(), "leadership did not move without a reason")
	rep := c.verify()
	require.EqualValues(t, 10000, rep.Done)
	require.Equal(t, 2000, rep.Entities)
	standby := map[*harness.Replica]*harness.Replica{a: b, b: a}[l]
	require.Zero(t, metric(t, standby, processedMetric), "the standby processed nothing")
	require.EqualValues(t, 10000, metric(t, l, processedMetric), "the leader acked every event, each once")
}

func TestReplicasKill9LeaderMidStream(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	l := c.run("a", "b")
	c.slowBulks()
	c.produce(2000, 5)
	acked := c.midStream(l, 1000)

	l.Kill()
	c.proxy.Clear() // the takeover measured at the engine's own speed
	require.Less(t, acked, 10000.0, "the kill comes mid-stream")
	killed := time.Now()
	next := c.leader()
	require.NotEqual(t, l.Name, next.Name)
	harness.Eventually(t, 10*time.Second, "first ack by the new leader", func() bool {
		return metric(t, next, processedMetric) > 0
	})
	t.Logf("takeover after kill -9: %s to the new leader's first ack", time.Since(killed))
	c.settle(60 * time.Second)
}

func TestReplicasTerminatedLockSessionFencesTheLeader(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	l := c.run("a", "b")
	epoch := func() int { return c.db.Int(t, `SELECT epoch FROM outbox_leader`) }
	before := epoch()
	c.produce(1000, 3)

	pid := c.db.Int(t, `SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()`,
		leader.LockSessionName(l.Name))
	cut := time.Now()
	c.db.Exec(t, `SELECT pg_terminate_backend($1)`, pid)
	// The elector says standby only once its services have stopped writing.
	require.NoError(t, l.WaitRole(context.Background(), 3*time.Second, harness.RoleStandby), "old leader steps down")
	t.Logf("old leader stopped writing %s after its lock session was terminated", time.Since(cut))
	c.leader()
	require.Greater(t, epoch(), before)
	c.settle(60 * time.Second)
}

func TestReplicasEngineDownThenBack(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	l := c.run("a", "b")
	// The engine goes away once the leader has found its index: before,
	// the events would wait for the index, never sent, never retried (the
	// late engine's test covers that).
	harness.Eventually(t, 20*time.Second, "the leader's index set up", func() bool {
		_, ready, err := l.Get("/readyz")
		return err == nil && !strings.Contains(string(ready), `"waiting"`)
	})

	c.proxy.Set(faultproxy.Fault{Status: http.StatusServiceUnavailable})
	c.produce(50, 2)
	harness.Eventually(t, 20*time.Second, "events retried with growing attempts", func() bool {
		return c.count(`status = 'pending' AND attempts >= 2 AND next_retry_at > now()`) > 0
	})
	docs, err := harness.DocCount(context.Background(), harness.ElasticURL(t), c.index)
	require.NoError(t, err)
	require.Zero(t, docs, "nothing reached the engine")
	require.Zero(t, c.count(`status = 'done' AND error_reason IS NULL AND attempts = 0 AND event_version = 2`),
		"only older versions superseded in their batch are done")
	c.proxy.Set(faultproxy.Fault{Refuse: true})
	harness.Eventually(t, 20*time.Second, "connection errors classified", func() bool {
		return c.count(`error_reason = 'connection' AND status = 'pending'`) > 0
	})
	c.proxy.Clear()
	c.drained(30 * time.Second)
	require.Zero(t, c.count(`status = 'failed'`), "no failures while attempts were not exhausted")
	require.Positive(t, c.count(`error_history @> '[{"reason":"server_error"}]'`), "the 503s are kept in the history")
	c.verify()
}

func TestReplicasHonourRetryAfter(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.run("a")
	c.proxy.Set(faultproxy.Fault{Status: http.StatusTooManyRequests, RetryAfter: "3", Times: 1, PathSuffix: "/_bulk"})
	c.produce(5, 1)
	harness.Eventually(t, 10*time.Second, "rate limited", func() bool {
		return c.count(`error_reason = 'rate_limited'`) == 5
	})
	// Base backoff is 0.2 s and the cap 1 s: only Retry-After explains 3 s.
	require.Equal(t, 5, c.count(`status = 'pending' AND next_retry_at >= updated_at + interval '2.9 seconds'`))
	c.settle(20 * time.Second)
}

func TestReplicasDeterministicFailuresDoNotBlock(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.run("a")
	c.produce(100, 2)
	c.db.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, payload) VALUES
		('book', 'strict', 'upsert', '{"title": "x", "not_in_mapping": 1}'),
		('book', 'array', 'upsert', '[1, 2]')`)
	c.db.Exec(t, `INSERT INTO outbox_events (projection, entity_type, entity_id, op) VALUES ('wordcount', 'book', 'c', 'upsert')`)
	c.produce(100, 1)
	c.drained(30 * time.Second)
	for entity, reason := range map[string]string{"strict": "mapping_error", "array": "payload_invalid", "c": "unknown_projection"} {
		require.Equal(t, 1, c.count(`entity_id = '`+entity+`' AND status = 'failed' AND attempts = 1 AND error_reason = '`+reason+`' AND error_class = 'deterministic'`),
			"%s should fail as %s after one attempt", entity, reason)
	}
	require.Equal(t, 3, c.count(`status = 'failed'`), "nothing else failed")
	c.verify(slices.Concat(c.expectFailed("mapping_error", `entity_id = 'strict'`),
		c.expectFailed("payload_invalid", `entity_id = 'array'`))...)
}

func TestReplicasReclaimStuckRow(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.db.Exec(t, `INSERT INTO outbox_leader (name, holder, epoch) VALUES ($1, 'gone', 1)`, c.index)
	c.db.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload, status, locked_by, claim_token, lease_until, processing_started_at)
		VALUES ('book', 'stuck', 'upsert', 1, '{"title": "stuck"}', 'processing', 'gone', 1, now() - interval '1 minute', now() - interval '2 minutes')`)
	c.run("a")
	c.drained(20 * time.Second)
	require.Equal(t, 1, c.count(`status = 'done' AND attempts = 1 AND error_history->0->>'event' = 'stuck_reclaimed'`))
	c.verify()
}

func TestReplicasSigtermUnderLoad(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	l := c.run("a", "b")
	c.proxy.Set(faultproxy.Fault{Delay: 300 * time.Millisecond}) // keep bulks in flight
	c.produce(2000, 2)
	harness.Eventually(t, 20*time.Second, "leader has work in flight", func() bool {
		return c.count(`status = 'processing' AND locked_by = '`+l.Name+`'`) > 0
	})
	require.NoError(t, l.Signal(syscall.SIGTERM))
	code, err := l.ExitCode(10 * time.Second)
	require.NoError(t, err, "the leader exits within its grace period")
	require.Zero(t, code)
	require.Zero(t, c.count(`status = 'processing' AND locked_by = '`+l.Name+`'`), "it leaves nothing in processing")
	c.proxy.Clear()
	next := c.leader()
	require.NotEqual(t, l.Name, next.Name)
	c.settle(60 * time.Second)
}
