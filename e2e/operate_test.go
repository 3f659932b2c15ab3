package e2e

// Operator-surface tests against the real binary and the real stack:
// readiness as the database and the engine come and go, the scraped metrics,
// a replay once the cause is fixed, and the auto-replay policy.

import (
	"context"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/faultproxy"
	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/internal/testkit/tcpproxy"
)

// opGet is r's answer to path, or the error as the body.
func opGet(r *harness.Replica, path string) (int, string) {
	code, body, err := r.Get(path)
	if err != nil {
		return 0, err.Error()
	}
	return code, string(body)
}

// opWaitReady waits until /readyz answers want, and returns its body.
func opWaitReady(t *testing.T, r *harness.Replica, want int, timeout time.Duration) string {
	t.Helper()
	var code int
	var body string
	harness.Eventually(t, timeout, r.Name+" /readyz "+strconv.Itoa(want), func() bool {
		code, body = opGet(r, "/readyz")
		return code == want
	})
	return body
}

// opMetric reads one sample of the scrape; name includes its labels.
func opMetric(t *testing.T, scrape, name string) (float64, bool) {
	t.Helper()
	v, ok, err := harness.ParseMetric(scrape, name)
	require.NoError(t, err)
	return v, ok
}

func opScrape(t *testing.T, r *harness.Replica) string {
	t.Helper()
	scrape, err := r.Scrape()
	require.NoError(t, err)
	return scrape
}

func TestOperateReadyzFlipsWhenTheDatabaseGoesAway(t *testing.T) {
	t.Parallel()
	c := newCluster(t, "OUTBOX_TCP_KEEPALIVES_IDLE=1", "OUTBOX_TCP_KEEPALIVES_INTERVAL=1", "OUTBOX_TCP_KEEPALIVES_COUNT=2")
	u, err := url.Parse(c.db.URL)
	require.NoError(t, err)
	pg := tcpproxy.Start(t, u.Host)
	u.Host = pg.Addr()
	c.env = append(c.env, "DATABASE_URL="+u.String())
	r := c.run("a")
	opWaitReady(t, r, http.StatusOK, 10*time.Second)

	pg.Blackhole()
	body := opWaitReady(t, r, http.StatusServiceUnavailable, 15*time.Second)
	require.Contains(t, body, `"database":"`, "the body names the failed check")
	require.NotContains(t, body, `"database":"ok"`)
	require.Contains(t, body, `"draining":"no"`)
	// Liveness is not readiness: the process is fine, its database is not.
	code, _ := opGet(r, "/healthz")
	require.Equal(t, http.StatusOK, code)

	pg.DropUpstream()
	pg.Restore()
	opWaitReady(t, r, http.StatusOK, 30*time.Second)
	c.leader()
	c.produce(20, 3)
	c.settle(60 * time.Second)
}

func TestOperateReadyzEngineGate(t *testing.T) {
	t.Parallel()
	c := newCluster(t, "OUTBOX_REQUIRE_ES_READY=true")
	gated := c.start("gated")
	c.env = append(c.env, "OUTBOX_REQUIRE_ES_READY=false")
	plain := c.start("plain")
	c.leader()
	opWaitReady(t, gated, http.StatusOK, 10*time.Second)
	opWaitReady(t, plain, http.StatusOK, 10*time.Second)

	c.proxy.Set(faultproxy.Fault{Refuse: true})
	body := opWaitReady(t, gated, http.StatusServiceUnavailable, 10*time.Second)
	require.Contains(t, body, `"elasticsearch":"unreachable: `)
	require.Contains(t, body, `"database":"ok"`)
	code, body := opGet(plain, "/readyz")
	require.Equal(t, http.StatusOK, code, "without the gate the engine is not part of readiness: %s", body)
	require.NotContains(t, body, "elasticsearch")

	c.proxy.Clear()
	opWaitReady(t, gated, http.StatusOK, 10*time.Second)
	c.produce(10, 2)
	c.settle(60 * time.Second)
}

func TestOperateMetricsPassPromtoolAndShowLag(t *testing.T) {
	t.Parallel()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed (scripts/tools.sh installs it for make test)")
	}
	c := newCluster(t, "OUTBOX_MAX_ATTEMPTS=1000")
	r := c.run("a")
	c.produce(10, 1)
	c.drained(30 * time.Second)

	scrape := opScrape(t, r)
	file := filepath.Join(t.TempDir(), "metrics.txt")
	require.NoError(t, os.WriteFile(file, []byte(scrape), 0o644))
	check := exec.Command(promtool, "check", "metrics")
	check.Stdin = strings.NewReader(scrape)
	out, err := check.CombinedOutput()
	require.NoError(t, err, "promtool check metrics %s:\n%s", file, out)
	for _, name := range []string{"outbox_lag_events", "outbox_leader", "outbox_leader_epoch",
		`outbox_processed_total{projection="search"}`} {
		_, ok := opMetric(t, scrape, name)
		require.True(t, ok, "%s in the scrape", name)
	}

	var seen []float64
	lag := func() float64 {
		v, ok := opMetric(t, opScrape(t, r), "outbox_lag_events")
		require.True(t, ok)
		if len(seen) == 0 || seen[len(seen)-1] != v {
			seen = append(seen, v)
		}
		return v
	}
	defer func() { t.Logf("outbox_lag_events went through %v", seen) }()
	harness.Eventually(t, 15*time.Second, "lag 0 once drained", func() bool { return lag() == 0 })

	c.proxy.Set(faultproxy.Fault{Refuse: true})
	c.produce(100, 1)
	// The leader refreshes the gauges every 5s from one reading: the 100
	// books are pending, or in flight between two failed attempts.
	harness.Eventually(t, 30*time.Second, "lag rises while the engine is down", func() bool {
		scrape := opScrape(t, r)
		pending, ok := opMetric(t, scrape, "outbox_lag_events")
		require.True(t, ok)
		inflight, ok := opMetric(t, scrape, "outbox_inflight_events")
		require.True(t, ok)
		if len(seen) == 0 || seen[len(seen)-1] != pending {
			seen = append(seen, pending)
		}
		return pending > 0 && pending+inflight == 100
	})

	c.proxy.Clear()
	harness.Eventually(t, 30*time.Second, "lag falls back to 0 once it is back", func() bool { return lag() == 0 })
	c.settle(30 * time.Second)
}

func TestOperateReplayAfterMappingFix(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.run("a")
	ctx := context.Background()

	// testdata/mapping.json is strict and has no isbn.
	var id int64
	require.NoError(t, c.db.Pool.QueryRow(ctx, `
		INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload)
		VALUES ('book', '42', 'upsert', 3, '{"kind": "book", "title": "Dune", "isbn": "978-0441013593"}')
		RETURNING id`).Scan(&id))
	harness.Eventually(t, 20*time.Second, "the event fails", func() bool { return c.count(`status = 'failed'`) == 1 })
	var class, reason, lastError string
	require.NoError(t, c.db.Pool.QueryRow(ctx, `SELECT error_class, error_reason, last_error FROM outbox_events WHERE id = $1`, id).
		Scan(&class, &reason, &lastError))
	require.Equal(t, []string{"deterministic", "mapping_error"}, []string{class, reason})
	require.Contains(t, lastError, "isbn")

	require.NoError(t, harness.ES(ctx, harness.ElasticURL(t), http.MethodPut, "/"+c.index+"/_mapping",
		[]byte(`{"properties": {"isbn": {"type": "keyword"}}}`), nil))

	cmd := exec.Command(harness.Binary(t), "replay", "--ids", strconv.FormatInt(id, 10),
		"--by", "alice", "--why", "isbn added to the mapping")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+c.db.URL)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)

	harness.Eventually(t, 20*time.Second, "the replayed event is done", func() bool { return c.count(`status = 'done'`) == 1 })
	require.Equal(t, 1, c.count(`replay_count = 1`))
	require.Equal(t, 1, c.db.Int(t, `
		SELECT count(*) FROM outbox_replay_audit
		 WHERE replayed_by = 'alice' AND reason = 'isbn added to the mapping' AND event_ids = ARRAY[$1::bigint]`, id))
	require.Equal(t, 1, c.count(`true`))

	var doc struct {
		Version int64 `json:"_version"`
		Source  struct {
			ISBN string `json:"isbn"`
		} `json:"_source"`
	}
	require.NoError(t, harness.ES(ctx, harness.ElasticURL(t), http.MethodGet, "/"+c.index+"/_doc/book:42", nil, &doc))
	require.Equal(t, int64(3), doc.Version, "indexed at the event's version")
	require.Equal(t, "978-0441013593", doc.Source.ISBN)
	c.verify()
}

func TestOperateAutoReplayRevivesTransientOnly(t *testing.T) {
	t.Parallel()
	const budget = 3
	c := newCluster(t, "OUTBOX_AUTO_REPLAY=true", "OUTBOX_AUTO_REPLAY_PER_MINUTE="+strconv.Itoa(budget))
	// Seven valid events that failed earlier: five for a transient reason,
	// two for a deterministic one. Revived, any of them would succeed.
	c.db.Exec(t, `
		INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload, status, attempts,
		                           error_class, error_reason, last_error, created_at, updated_at)
		SELECT 'book', g::text, 'upsert', 1, jsonb_build_object('kind', 'book', 'title', 'Book ' || g), 'failed',
		       CASE WHEN g <= 5 THEN 10 ELSE 1 END,
		       CASE WHEN g <= 5 THEN 'transient' ELSE 'deterministic' END,
		       CASE WHEN g <= 5 THEN 'server_error' ELSE 'mapping_error' END,
		       'seeded', now() - interval '1 hour', now() - make_interval(mins => 60 - g)
		  FROM generate_series(1, 7) g`)
	r := c.run("a")

	// The policy ticks every 10s; one tick spends the whole budget.
	harness.Eventually(t, 25*time.Second, "the budget's worth revived and done", func() bool {
		return c.count(`status = 'done'`) == budget
	})
	time.Sleep(2 * time.Second)
	require.Equal(t, budget, c.count(`status = 'done'`), "no more than the budget within the minute")
	require.Equal(t, budget, c.count(`status = 'done' AND error_reason IS NULL AND last_error IS NULL AND replay_count = 1`),
		"a done row carries no error of an earlier attempt")
	require.Equal(t, budget, c.count(`status = 'done' AND entity_id::int <= 3`), "oldest failure first")
	require.Equal(t, 5-budget, c.count(`status = 'failed' AND error_class = 'transient' AND replay_count = 0`))
	require.Equal(t, 2, c.count(`status = 'failed' AND error_class = 'deterministic' AND replay_count = 0`),
		"deterministic failures are never auto-replayed")

	require.Equal(t, budget, c.db.Int(t, `SELECT coalesce(sum(event_count), 0) FROM outbox_replay_audit WHERE replayed_by = 'auto'`))
	require.Zero(t, c.db.Int(t, `SELECT count(*) FROM outbox_replay_audit WHERE replayed_by <> 'auto'`))
	v, ok := opMetric(t, opScrape(t, r), `outbox_replayed_total{by="auto"}`)
	require.True(t, ok)
	require.Equal(t, float64(budget), v)
	c.verify(slices.Concat(c.expectFailed("server_error", `entity_id::int BETWEEN $1 + 1 AND 5`, budget),
		c.expectFailed("mapping_error", `entity_id::int > 5`))...)
}
