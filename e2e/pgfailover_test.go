package e2e

// Postgres with a standby: the replicas' DATABASE_URL names several hosts
// with target_session_attrs=read-write, on a primary and standby of the
// test's own (harness.StartPGPair), which the test may kill and promote.

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/faultproxy"
	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// newPairCluster is newCluster on pair, the replicas' DATABASE_URL naming
// hosts in order with target_session_attrs=read-write.
func newPairCluster(t *testing.T, pair *harness.PGPair, hosts ...string) *cluster {
	t.Helper()
	url := pair.URL(hosts, "target_session_attrs=read-write")
	c := &cluster{t: t, db: pair.NewDatabase(t, url), index: harness.NewIndex(t)}
	c.proxy = faultproxy.Start(t, harness.ElasticURL(t))
	c.env = harness.ReplicaEnv(c.db.URL, c.proxy.URL(), c.index, harness.Quick...)
	return c
}

func closedAddr(t *testing.T) string {
	t.Helper()
	port, err := harness.FreePort()
	require.NoError(t, err)
	return "127.0.0.1:" + strconv.Itoa(port)
}

// A replica whose DATABASE_URL lists a closed port and a read-only standby
// before the primary leads and drains on the primary.
func TestTopologyPostgresMultiHostSkipsClosedAndStandby(t *testing.T) {
	t.Parallel()
	pair := harness.StartPGPair(t)
	c := newPairCluster(t, pair, closedAddr(t), pair.Standby.Addr(), pair.Primary.Addr())
	c.run("a")
	c.produce(200, 3)
	rep := c.settle(60 * time.Second)
	require.EqualValues(t, 600, rep.Done)
}

// Under a steady producer, kill -9 the primary's postmaster and promote the
// standby: both replicas find the new primary through DATABASE_URL's second
// host, one leads, and every event committed is done with its document at
// the newest version.
func TestPostgresFailoverPromoteUnderLoad(t *testing.T) {
	t.Parallel()
	pair := harness.StartPGPair(t)
	c := newPairCluster(t, pair, pair.Primary.Addr(), pair.Standby.Addr())
	first := c.run("a", "b")
	epoch := c.db.Int(t, `SELECT epoch FROM outbox_leader`)

	var version atomic.Int64
	prod := harness.Produce(context.Background(), c.db.Pool, harness.ProducerConfig{Rate: 300, InsertTimeout: 2 * time.Second,
		Next: func(n int) []harness.Event {
			events := make([]harness.Event, n)
			for i := range events {
				v := version.Add(1)
				payload, _ := json.Marshal(map[string]any{"kind": "book", "title": fmt.Sprintf("v%d", v), "position": v})
				events[i] = harness.Event{EntityType: "book", EntityID: strconv.FormatInt(v%50, 10), Op: "upsert",
					Version: v, Payload: payload, ScopeKey: "lib"}
			}
			return events
		}})
	defer prod.Stop()
	harness.Eventually(t, 10*time.Second, "the leader mid-stream", func() bool { return c.count(`status = 'done'`) > 200 })

	// Postgres' clock, which acks are stamped with; the standby shares it.
	killed, err := harness.Now(context.Background(), c.db.Pool)
	require.NoError(t, err)
	require.NoError(t, pair.KillPrimary())
	pair.Promote(t)
	next := harness.Leader(t, c.replicas...)
	// Only the promoted standby can hold an ack after the kill.
	acked, err := harness.WaitFirstAck(context.Background(), 20*time.Second, c.db.Pool, killed, "")
	require.NoError(t, err, "an ack on the promoted standby")
	t.Logf("primary killed; %s (first leader %s) acked on the promoted standby %s after the kill", next.Name, first.Name, acked.Sub(killed))
	require.Greater(t, c.db.Int(t, `SELECT epoch FROM outbox_leader`), epoch, "a new election on the new primary")
	time.Sleep(500 * time.Millisecond) // a few inserts on the new primary too
	prod.Stop()

	rep := c.settle(60 * time.Second)
	// An insert whose commit reached the standby but whose answer was lost
	// with the primary counts as failed here and is in the outbox: at least
	// every committed event, never fewer.
	require.GreaterOrEqual(t, rep.Done, prod.Committed(), "committed events lost in the failover")
	require.LessOrEqual(t, rep.Done, prod.Committed()+int64(prod.FailedInserts())*50)
}

// TestTopologyPostgresStandbyBehindListedFirst: the standby, listed first in
// DATABASE_URL, has flushed the test's database but not applied it (replay
// paused, as on a standby that is behind; the primary's commits wait for the
// flush only, synchronous_commit=on). It answers 3D000, with which pgx, like
// libpq, stops trying hosts. The replicas' lock connections and pools go on
// to the primary: one leads and drains.
func TestTopologyPostgresStandbyBehindListedFirst(t *testing.T) {
	t.Parallel()
	pair := harness.StartPGPair(t)
	ctx := context.Background()
	standby, err := pgx.Connect(ctx, pair.URL([]string{pair.Standby.Addr()}))
	require.NoError(t, err)
	_, err = standby.Exec(ctx, `SELECT pg_wal_replay_pause()`)
	require.NoError(t, err)
	require.NoError(t, standby.Close(ctx))

	c := &cluster{t: t, db: pair.NewDatabase(t, pair.URL([]string{pair.Primary.Addr()}, "synchronous_commit=on")),
		index: harness.NewIndex(t)}
	url := strings.Replace(pair.URL([]string{pair.Standby.Addr(), pair.Primary.Addr()},
		"target_session_attrs=read-write", "synchronous_commit=on"), "/postgres?", "/"+c.db.Name+"?", 1)
	_, err = pgx.Connect(ctx, url)
	var pe *pgconn.PgError
	require.ErrorAs(t, err, &pe, "pgx alone stops at the standby")
	require.Equal(t, "3D000", pe.Code)

	c.proxy = faultproxy.Start(t, harness.ElasticURL(t))
	c.env = harness.ReplicaEnv(url, c.proxy.URL(), c.index, harness.Quick...)
	c.run("a", "b")
	c.produce(200, 3)
	rep := c.settle(60 * time.Second)
	require.EqualValues(t, 600, rep.Done)

	// wlproj migrate goes past the standby to the primary too.
	out, err := exec.Command(harness.Binary(t), "migrate", "--database-url", url, "--expect-db", c.db.Name).CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "schema is up to date")
}
