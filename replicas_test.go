package main

// Process-level tests: two real `wlproj run` replicas against the real
// Postgres and the real engine (behind the fault proxy), driven as an operator
// would. Every test ends by checking that no event was lost or regressed.

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/faultproxy"
	"github.com/wlproj/wlproj/internal/replica"
	"github.com/wlproj/wlproj/internal/testenv"
	"github.com/wlproj/wlproj/internal/verify"
)

type cluster struct {
	t        *testing.T
	db       testenv.DB
	index    string
	proxy    *faultproxy.Proxy
	env      []string
	replicas []*replica.Replica
}

func newCluster(t *testing.T, extraEnv ...string) *cluster {
	t.Helper()
	c := &cluster{t: t, db: testenv.NewDatabase(t), index: testenv.NewIndexName(t)}
	c.proxy = faultproxy.Start(t, testenv.ElasticURL(t))
	mapping, err := os.ReadFile(filepath.Join(testenv.RepoRoot(t), "testdata", "mapping.json"))
	require.NoError(t, err)
	req, _ := http.NewRequest(http.MethodPut, testenv.ElasticURL(t)+"/"+c.index, strings.NewReader(string(mapping)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	c.env = append([]string{
		"DATABASE_URL=" + c.db.URL,
		"ELASTIC_URL=" + c.proxy.URL(),
		"ELASTIC_INDEX=" + c.index,
		"OUTBOX_LEADER_NAME=" + c.index,
		"OUTBOX_POLL_INTERVAL_SECONDS=0.2",
		"OUTBOX_RECLAIM_INTERVAL_SECONDS=0.5",
		"OUTBOX_BASE_BACKOFF_SECONDS=0.2",
		"OUTBOX_MAX_BACKOFF_SECONDS=1",
		"OUTBOX_LEADER_CHECK_INTERVAL_SECONDS=0.1",
		"OUTBOX_SHUTDOWN_GRACE_SECONDS=5",
		"ELASTIC_TIMEOUT_SECONDS=5",
		"LOG_LEVEL=info",
	}, extraEnv...)
	return c
}

func (c *cluster) start(name string) *replica.Replica {
	c.t.Helper()
	r, err := replica.Start(testenv.Binary(c.t), name, c.env, nil)
	require.NoError(c.t, err)
	c.replicas = append(c.replicas, r)
	c.t.Cleanup(func() {
		r.Stop(10 * time.Second)
		if c.t.Failed() {
			c.t.Logf("logs of %s:\n%s", r.Name, tail(r.Logs(), 4000))
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(c.t, r.WaitHealthy(ctx))
	return r
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// leader waits until exactly one live replica says it leads.
func (c *cluster) leader() *replica.Replica {
	c.t.Helper()
	var l *replica.Replica
	testenv.Eventually(c.t, 15*time.Second, "exactly one leader", func() bool {
		n := 0
		for _, r := range c.live() {
			if r.IsLeader() {
				l = r
				n++
			}
		}
		return n == 1
	})
	return l
}

func (c *cluster) live() []*replica.Replica {
	var out []*replica.Replica
	for _, r := range c.replicas {
		select {
		case <-r.Exited():
		default:
			out = append(out, r)
		}
	}
	return out
}

func (c *cluster) exec(sql string, args ...any) {
	c.t.Helper()
	_, err := c.db.Pool.Exec(context.Background(), sql, args...)
	require.NoError(c.t, err)
}

func (c *cluster) count(where string) int {
	c.t.Helper()
	var n int
	require.NoError(c.t, c.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_events WHERE `+where).Scan(&n))
	return n
}

// produce inserts versions events for each of entities books, versions in a
// shuffled order, so older versions often arrive after newer ones.
func (c *cluster) produce(entities, versions int) {
	c.t.Helper()
	c.exec(`
		INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload, scope_key)
		SELECT 'book', e::text, 'upsert', v,
		       jsonb_build_object('kind', 'book', 'title', 'Book ' || e || ' v' || v,
		                          'body', repeat('lorem ipsum ', 20), 'library_id', 'lib-' || (e % 7),
		                          'position', v, 'updated_at', now()),
		       'lib-' || (e % 7)
		  FROM generate_series(1, $1) e, generate_series(1, $2) v
		 ORDER BY random()`, entities, versions)
}

func (c *cluster) docCount() int {
	c.t.Helper()
	base := testenv.ElasticURL(c.t) + "/" + c.index
	resp, err := http.Post(base+"/_refresh", "application/json", nil)
	require.NoError(c.t, err)
	resp.Body.Close()
	resp, err = http.Get(base + "/_count")
	require.NoError(c.t, err)
	defer resp.Body.Close()
	var body struct{ Count int }
	require.NoError(c.t, json.NewDecoder(resp.Body).Decode(&body))
	return body.Count
}

func (c *cluster) waitSettled(timeout time.Duration) {
	c.t.Helper()
	testenv.Eventually(c.t, timeout, "every event done or failed", func() bool {
		return c.count(`status IN ('pending', 'processing')`) == 0
	})
}

// verify is how every test ends: nothing lost, nothing regressed.
func (c *cluster) verify() verify.Report {
	c.t.Helper()
	rep, err := verify.Check(context.Background(), c.db.Pool, testenv.ElasticURL(c.t), c.index)
	require.NoError(c.t, err)
	require.True(c.t, rep.OK(), "%s\nregressed=%v missing=%v resurrected=%v", rep, rep.Regressed, rep.Missing, rep.Resurrected)
	return rep
}

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
	require.Zero(t, c.count(`locked_by <> '`+l.Name+`'`), "the standby processed nothing")
}

func TestReplicasKill9LeaderMidStream(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.start("a")
	c.start("b")
	l := c.leader()
	c.produce(2000, 5)
	testenv.Eventually(t, 30*time.Second, "leader is mid-stream", func() bool { return c.count(`status = 'done'`) > 1000 })

	l.Kill()
	killed := time.Now()
	next := c.leader()
	require.NotEqual(t, l.Name, next.Name)
	testenv.Eventually(t, 10*time.Second, "first ack by the new leader", func() bool {
		return c.count(`status = 'done' AND locked_by = '`+next.Name+`'`) > 0
	})
	t.Logf("takeover after kill -9: %s to the new leader's first ack", time.Since(killed))
	c.waitSettled(60 * time.Second)
	c.verify()
}

func TestReplicasTerminatedLockSessionFencesTheLeader(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.start("a")
	c.start("b")
	l := c.leader()
	epoch := func() int64 {
		var e int64
		require.NoError(t, c.db.Pool.QueryRow(context.Background(), `SELECT epoch FROM outbox_leader`).Scan(&e))
		return e
	}
	before := epoch()
	c.produce(1000, 3)

	var pid int
	require.NoError(t, c.db.Pool.QueryRow(context.Background(),
		`SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()`, "wlproj-leader:"+l.Name).Scan(&pid))
	cut := time.Now()
	c.exec(`SELECT pg_terminate_backend($1)`, pid)
	testenv.Eventually(t, 3*time.Second, "old leader steps down", func() bool {
		return strings.Contains(l.Logs(), "lost leadership; stopped writing")
	})
	t.Logf("old leader stopped writing %s after its lock session was terminated", time.Since(cut))
	c.leader()
	require.Greater(t, epoch(), before)
	c.waitSettled(60 * time.Second)
	c.verify()
}

func TestReplicasEngineDownThenBack(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.start("a")
	c.start("b")
	c.leader()

	c.proxy.Set(faultproxy.Fault{Status: http.StatusServiceUnavailable})
	c.produce(50, 2)
	testenv.Eventually(t, 20*time.Second, "events retried with growing attempts", func() bool {
		return c.count(`status = 'pending' AND attempts >= 2 AND next_retry_at > now()`) > 0
	})
	require.Zero(t, c.docCount(), "nothing reached the engine")
	require.Zero(t, c.count(`status = 'done' AND error_reason IS NULL AND attempts = 0 AND event_version = 2`),
		"only older versions superseded in their batch are done")
	c.proxy.Set(faultproxy.Fault{Refuse: true})
	testenv.Eventually(t, 20*time.Second, "connection errors classified", func() bool {
		return c.count(`error_reason = 'connection' AND status = 'pending'`) > 0
	})
	c.proxy.Clear()
	c.waitSettled(30 * time.Second)
	require.Zero(t, c.count(`status = 'failed'`), "no failures while attempts were not exhausted")
	require.Positive(t, c.count(`error_history @> '[{"reason":"server_error"}]'`), "the 503s are kept in the history")
	c.verify()
}

func TestReplicasHonourRetryAfter(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.start("a")
	c.leader()
	c.proxy.Set(faultproxy.Fault{Status: http.StatusTooManyRequests, RetryAfter: "3", Times: 1})
	c.produce(5, 1)
	testenv.Eventually(t, 10*time.Second, "rate limited", func() bool {
		return c.count(`error_reason = 'rate_limited'`) == 5
	})
	// Base backoff is 0.2 s and the cap 1 s: only Retry-After explains 3 s.
	require.Equal(t, 5, c.count(`status = 'pending' AND next_retry_at >= updated_at + interval '2.9 seconds'`))
	c.waitSettled(20 * time.Second)
	c.verify()
}

func TestReplicasDeterministicFailuresDoNotBlock(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.start("a")
	c.leader()
	c.produce(100, 2)
	c.exec(`INSERT INTO outbox_events (entity_type, entity_id, op, payload) VALUES
		('book', 'strict', 'upsert', '{"title": "x", "not_in_mapping": 1}'),
		('book', 'array', 'upsert', '[1, 2]')`)
	c.exec(`INSERT INTO outbox_events (projection, entity_type, entity_id, op) VALUES ('chronicle', 'book', 'c', 'upsert')`)
	c.produce(100, 1)
	c.waitSettled(30 * time.Second)
	for entity, reason := range map[string]string{"strict": "mapping_error", "array": "payload_invalid", "c": "unknown_projection"} {
		require.Equal(t, 1, c.count(`entity_id = '`+entity+`' AND status = 'failed' AND attempts = 1 AND error_reason = '`+reason+`' AND error_class = 'deterministic'`),
			"%s should fail as %s after one attempt", entity, reason)
	}
	require.Equal(t, 3, c.count(`status = 'failed'`), "nothing else failed")
	c.verify()
}

func TestReplicasReclaimStuckRow(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.exec(`INSERT INTO outbox_leader (name, holder, epoch) VALUES ($1, 'gone', 1)`, c.index)
	c.exec(`INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload, status, locked_by, claim_token, lease_until, processing_started_at)
		VALUES ('book', 'stuck', 'upsert', 1, '{"title": "stuck"}', 'processing', 'gone', 1, now() - interval '1 minute', now() - interval '2 minutes')`)
	c.start("a")
	c.leader()
	c.waitSettled(20 * time.Second)
	require.Equal(t, 1, c.count(`status = 'done' AND attempts = 1 AND error_history->0->>'event' = 'stuck_reclaimed'`))
	c.verify()
}

func TestReplicasSigtermUnderLoad(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.start("a")
	c.start("b")
	l := c.leader()
	c.proxy.Set(faultproxy.Fault{Delay: 300 * time.Millisecond}) // keep bulks in flight
	c.produce(2000, 2)
	testenv.Eventually(t, 20*time.Second, "leader has work in flight", func() bool {
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
	c.waitSettled(60 * time.Second)
	c.verify()
}
