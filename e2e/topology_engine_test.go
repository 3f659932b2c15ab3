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
	c := &cluster{t: t, db: harness.NewDatabase(t), index: harness.NewIndex(t)}
	engine, _, _ := strings.Cut(harness.ElasticURL(t), ",") // one node of a cluster stack
	n1 := faultproxy.Start(t, engine)
	n2 := faultproxy.Start(t, engine)
	c.env = harness.ReplicaEnv(c.db.URL, n1.URL()+","+n2.URL(), c.index,
		slices.Concat(harness.Quick, []string{"OUTBOX_BULK_SIZE=20", "OUTBOX_MAX_ATTEMPTS=5"})...)
	c.run("a")

	c.produce(100, 2)
	harness.Eventually(t, 20*time.Second, "both nodes served bulks", func() bool {
		return n1.Requests() > 2 && n2.Requests() > 2 && c.count(`status = 'done'`) > 0
	})
	c.produce(100, 2)
	n2.Set(faultproxy.Fault{Refuse: true})
	before := n1.Requests()
	c.produce(100, 2)
	c.settle(60 * time.Second)
	require.Zero(t, c.count(`status = 'failed'`), "a lost node fails nothing")
	require.Greater(t, n1.Requests(), before, "the remaining node took over")
}
