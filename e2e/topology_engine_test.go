package e2e

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/faultproxy"
	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// TestTopologyEngineNodeListFailsOver: ELASTIC_URL lists two "nodes", each
// a fault proxy in front of the one stack engine. The leader spreads its
// requests over both; when one stops listening (refused, its open
// connections dropped) mid-stream, the bulks that went to it are retried
// on the other, and every event ends done: a node loss fails nothing.
func TestTopologyEngineNodeListFailsOver(t *testing.T) {
	t.Parallel()
	c, lost, kept := enginePair(t, "OUTBOX_BULK_SIZE=20", "OUTBOX_MAX_ATTEMPTS=5")
	c.run("a")

	c.produce(100, 2)
	harness.Eventually(t, 20*time.Second, "both nodes served bulks", func() bool {
		return kept.Requests() > 2 && lost.Requests() > 2 && c.count(`status = 'done'`) > 0
	})
	c.produce(100, 2)
	lost.Set(faultproxy.Fault{Refuse: true})
	before := kept.Requests()
	c.produce(100, 2)
	c.settle(60 * time.Second)
	require.Zero(t, c.count(`status = 'failed'`), "a lost node fails nothing")
	require.Greater(t, kept.Requests(), before, "the remaining node took over")
}

// enginePair is a cluster whose ELASTIC_URL lists two "nodes", each a
// fault proxy in front of the one stack engine, the first to be faulted.
func enginePair(t *testing.T, settings ...string) (c *cluster, faulty, healthy *faultproxy.Proxy) {
	t.Helper()
	c = &cluster{t: t, db: harness.NewDatabase(t), index: harness.NewIndex(t)}
	engine, _, _ := strings.Cut(harness.ElasticURL(t), ",") // one node of a cluster stack
	faulty = faultproxy.Start(t, engine)
	healthy = faultproxy.Start(t, engine)
	c.env = harness.ReplicaEnv(c.db.URL, faulty.URL()+","+healthy.URL(), c.index,
		slices.Concat(harness.Quick, settings)...)
	return c, faulty, healthy
}

// TestTopologyEngineNode503FailsNothing: of the two nodes, the first answers
// every request 503 (cluster_block_exception, as a node cut off from its
// master does) for the whole run, with two attempts per event at most. A
// bulk it refuses goes to the other node at once, the node stays out of the
// rotation while its cluster health answers 503, and not one of 1,000
// events fails.
func TestTopologyEngineNode503FailsNothing(t *testing.T) {
	t.Parallel()
	c, unavailable, healthy := enginePair(t, "OUTBOX_BULK_SIZE=10", "OUTBOX_MAX_ATTEMPTS=2")
	unavailable.Set(faultproxy.Fault{Status: 503})
	c.run("a")
	c.produce(500, 2)
	rep := c.settle(90 * time.Second)
	require.EqualValues(t, 1000, rep.Done)
	require.Zero(t, c.count(`status = 'failed'`), "events failed while a node answered")
	require.Zero(t, c.count(`attempts > 1`), "attempts spent on the node answering 503")
	require.LessOrEqual(t, unavailable.RequestsTo("/_bulk"), 2, "bulks sent to the node answering 503")
	require.Greater(t, healthy.RequestsTo("/_bulk"), 50)
}

// TestTopologyEngineNodeSilentFailsNothing: of the two nodes, both serving
// bulks, the first goes silent mid-stream: it accepts connections and
// never answers, as a lost host does (no FIN, no RST), with the default
// 30 s request timeout. The bulk that next goes to it waits a few seconds
// and goes to the other node; no event waits the 30 s timeout (that bulk's
// events would without the probe; the drain of the 1,000 queued at once,
// on a loaded two-core machine, left 70 events over 10 s, the next bucket
// down), none needs a second attempt, and the silent node gets no other
// bulk. (Silent from the start, it never got a bulk: the replica's first
// requests at its start found it out.)
func TestTopologyEngineNodeSilentFailsNothing(t *testing.T) {
	t.Parallel()
	c, silent, healthy := enginePair(t, "OUTBOX_BULK_SIZE=10", "ELASTIC_TIMEOUT_SECONDS=30")
	l := c.run("a")
	c.produce(50, 1)
	harness.Eventually(t, 20*time.Second, "both nodes served bulks", func() bool {
		return silent.RequestsTo("/_bulk") > 0 && healthy.RequestsTo("/_bulk") > 0
	})
	c.drained(20 * time.Second)
	silent.Set(faultproxy.Fault{Delay: time.Hour})
	before := silent.RequestsTo("/_bulk")
	c.produce(500, 2)
	rep := c.settle(90 * time.Second)
	require.EqualValues(t, 1050, rep.Done)
	require.Zero(t, c.count(`attempts > 1`), "attempts spent on the silent node")
	// Insert to ack, as the leader measured each ack: a queued row that
	// succeeds keeps no processed_at.
	lag, err := l.Histogram(harness.LatencyMetric)
	require.NoError(t, err)
	require.GreaterOrEqual(t, lag.Count(), 1050.0, "every event's lag observed")
	waited, err := lag.Above(30)
	require.NoError(t, err)
	require.Zero(t, waited, "events that waited over the 30 s timeout")
	sent := silent.RequestsTo("/_bulk") - before
	require.Positive(t, sent, "no bulk went to the node once silent: the test proves nothing")
	require.LessOrEqual(t, sent, 2, "bulks sent to the silent node")
	require.Greater(t, healthy.RequestsTo("/_bulk"), 50)
}
