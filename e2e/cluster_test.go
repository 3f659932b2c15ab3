package e2e

// The helpers the root package's process tests share: a cluster of real
// replicas on a database and index of the test's own, the engine behind a
// fault proxy. Everything else comes from internal/testkit/harness.

import (
	"slices"
	"testing"
	"time"

	"github.com/wlproj/wlproj/internal/testkit/faultproxy"
	"github.com/wlproj/wlproj/internal/testkit/harness"
)

type cluster struct {
	t        *testing.T
	db       harness.DB
	index    string
	proxy    *faultproxy.Proxy
	env      []string
	replicas []*harness.Replica
	// produced is the newest version produce handed out: each call goes
	// on from it, as a producer may not reuse a document's version.
	produced int
}

// newCluster prepares replicas with harness.Quick settings, then extraEnv.
func newCluster(t *testing.T, extraEnv ...string) *cluster {
	t.Helper()
	c := &cluster{t: t, db: harness.NewDatabase(t), index: harness.NewIndex(t)}
	c.proxy = faultproxy.Start(t, harness.ElasticURL(t))
	c.env = harness.ReplicaEnv(c.db.URL, c.proxy.URL(), c.index, slices.Concat(harness.Quick, extraEnv)...)
	return c
}

// start runs a replica with the cluster's environment as it is now, and
// waits until it serves /healthz.
func (c *cluster) start(name string) *harness.Replica {
	c.t.Helper()
	r := harness.StartReplica(c.t, name, c.env)
	c.replicas = append(c.replicas, r)
	harness.Healthy(c.t, r)
	return r
}

// run starts the named replicas and returns the one that leads.
func (c *cluster) run(names ...string) *harness.Replica {
	c.t.Helper()
	for _, name := range names {
		c.start(name)
	}
	return c.leader()
}

// leader waits until exactly one live replica says it leads.
func (c *cluster) leader() *harness.Replica {
	c.t.Helper()
	return harness.Leader(c.t, c.replicas...)
}

// produce inserts versions events for each of entities books, versions in a
// shuffled order, so older versions often arrive after newer ones. The
// first call writes versions 1 to versions, the next ones go on from there.
func (c *cluster) produce(entities, versions int) {
	c.t.Helper()
	c.db.Exec(c.t, `
		INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload, scope_key)
		SELECT 'book', e::text, 'upsert', v,
		       jsonb_build_object('kind', 'book', 'title', 'Book ' || e || ' v' || v,
		                          'body', repeat('lorem ipsum ', 20), 'library_id', 'lib-' || (e % 7),
		                          'position', v, 'updated_at', now()),
		       'lib-' || (e % 7)
		  FROM generate_series(1, $1) e, generate_series($3 + 1, $3 + $2) v
		 ORDER BY random()`, entities, versions, c.produced)
	c.produced += versions
}

// processedMetric counts the search events a replica acked done, the
// superseded ones included. It says who drained: a queued row that
// succeeds is never written, so it keeps no locked_by.
const processedMetric = `outbox_processed_total{projection="search"}`

// count is the number of events matching where, on outbox_event_states:
// a queued row's status there is what its projection's position says.
func (c *cluster) count(where string) int {
	c.t.Helper()
	return c.db.Count(c.t, where)
}

// slowBulks delays every bulk by 100 ms, so that a drain of thousands of
// events takes seconds and a fault can come in the middle of it.
func (c *cluster) slowBulks() {
	c.proxy.Set(faultproxy.Fault{Delay: 100 * time.Millisecond, PathSuffix: "/_bulk"})
}

// midStream waits until the leader l has acked more than n search events,
// by its own counter: the view shows a queued row done only at the next
// save of its position, up to a second later, by when a leader may have
// drained everything produced. It returns how many l had acked.
func (c *cluster) midStream(l *harness.Replica, n float64) float64 {
	c.t.Helper()
	var acked float64
	harness.Eventually(c.t, 30*time.Second, l.Name+" is mid-stream", func() bool {
		acked = metric(c.t, l, processedMetric)
		return acked > n
	})
	return acked
}

func (c *cluster) drained(timeout time.Duration) {
	c.t.Helper()
	harness.Drained(c.t, c.db.Pool, timeout)
}

// verify is how every test ends: nothing lost, nothing regressed, every
// document at its newest applied event, nothing failed but expected.
func (c *cluster) verify(expected ...harness.Failure) harness.Verdict {
	c.t.Helper()
	return harness.Verified(c.t, c.db.Pool, c.index, expected...)
}

// settle waits until every event is done or failed, then verifies.
func (c *cluster) settle(timeout time.Duration, expected ...harness.Failure) harness.Verdict {
	c.t.Helper()
	c.drained(timeout)
	return c.verify(expected...)
}

// expectFailed is the events matching where, expected to fail with reason.
func (c *cluster) expectFailed(reason, where string, args ...any) []harness.Failure {
	c.t.Helper()
	return harness.ExpectFailed(c.t, c.db, reason, where, args...)
}
