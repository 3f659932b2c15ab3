package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// TestBenchSmoke runs every step on tiny sizes, so the benchmark code
// cannot rot; the figures themselves are not judged here.
func TestBenchSmoke(t *testing.T) {
	cfg := defaultConfig().smoke()
	cfg.AdminURL, cfg.ElasticURL = harness.AdminDatabaseURL(t), harness.ElasticURL(t)
	cfg.Bin = harness.Binary(t)
	cfg.Out = filepath.Join(t.TempDir(), "results.json")
	cfg.CPUProfile = filepath.Join(t.TempDir(), "leader.pprof")
	// The soak's middle window runs beside an outside transaction.
	cfg.Soak.HoldFrom, cfg.Soak.HoldTo = cfg.Soak.Window, 2*cfg.Soak.Window
	// sqlscale runs `go test ./outbox`, whose scale test this suite runs
	// already; its reading of that output is TestSQLScaleReadsTheTestsLines.
	// river builds River (a module of its own) and runs it: make bench's
	// step, not the suite's; its parts are TestRiver*.
	for _, s := range (&bench{}).steps() {
		if s.flag != "sqlscale" && s.flag != "river" {
			cfg.Steps = append(cfg.Steps, s.flag)
		}
	}
	// A guard against a hang, not a speed target: on a loaded two-core
	// machine the run has taken 187 s.
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()

	_, err := Run(ctx, cfg)
	require.NoError(t, err)

	raw, err := os.ReadFile(cfg.Out)
	require.NoError(t, err)
	var rep Report
	require.NoError(t, json.Unmarshal(raw, &rep))
	// Any engine the stack runs (make bench ENGINE=...): the report names it.
	require.NotEmpty(t, rep.Versions.Engine)
	require.NotEmpty(t, rep.Engine.Name)
	require.Contains(t, rep.Versions.Engine, rep.Engine.Version)
	require.NotEmpty(t, rep.Versions.Postgres)

	pg := rep.PostgresPath
	require.NotNil(t, pg)
	throughputs := map[string]*Throughput{"raw": rep.RawBulk, "e2e": rep.EndToEnd, "at bare batch": pg.AtBareBatch}
	for name, v := range map[string]*Variant{"bare": pg.Bare, "ledger": pg.Ledger, "no ledger": pg.NoLedger} {
		require.NotNil(t, v, name)
		require.Len(t, v.Runs, cfg.PGRounds, "one run of %s per round", name)
		require.Positive(t, v.MedianEventsPerSec, name)
		for i, th := range v.Runs {
			throughputs[fmt.Sprintf("%s run %d", name, i+1)] = th
			require.Positive(t, th.DatabaseCPUSeconds, "%s run %d: the database's backends did the work", name, i+1)
		}
	}
	for name, th := range throughputs {
		require.NotNil(t, th, name)
		require.Equal(t, cfg.Docs, th.Events, name)
		require.Positive(t, th.EventsPerSec, name)
	}
	require.Positive(t, rep.EndToEnd.CPUSeconds["engine"], "the engine did the indexing of step 2")
	require.Equal(t, []string{"bare", "ledger", "no_ledger", "no_ledger", "ledger", "bare"}, pg.Order, "every other round reversed")
	require.Len(t, pg.Rounds, cfg.PGRounds)
	require.Equal(t, cfg.BareBatch, pg.AtBareBatch.Batch)
	require.Positive(t, rep.Ratios.EndToEndToRaw)
	require.Positive(t, rep.Ratios.DaemonPGToBareLoop)
	require.Positive(t, rep.Ratios.LedgerToNoLedger)
	require.Positive(t, rep.Ratios.NoLedgerToBareLoop)
	require.Positive(t, pg.LedgerDatabaseCPU)

	lat := rep.Latency
	require.NotNil(t, lat)
	// 200/s for 3 s: the producer's ticks may fall short by a few.
	require.InDelta(t, cfg.Rate*int(cfg.Duration.Seconds()), lat.Events, float64(cfg.Rate)/5)
	require.True(t, 0 < lat.P50ms && lat.P50ms <= lat.P95ms && lat.P95ms <= lat.P99ms && lat.P99ms <= lat.MaxMs, "%+v", lat)

	require.Len(t, rep.Sustained, 1)
	sus := rep.Sustained[0]
	require.Positive(t, sus.Base.Events)
	require.Len(t, sus.Runs, 2)
	for i, state := range []string{"history", "emptied"} {
		run := sus.Runs[i]
		require.Equal(t, state, run.State)
		rate := cfg.SustainedRates[0]
		require.InDelta(t, rate*int(cfg.SustainedDuration.Seconds()), run.Events, float64(rate)/5, state)
		require.Len(t, run.LagP99ByThird, 3, state)
		require.True(t, 0 < run.LagP50ms && run.LagP50ms <= run.LagP99ms, "%+v", run)
		require.Positive(t, run.ClaimP99ms, "%s: the leader's claim histogram was read", state)
		require.Positive(t, run.WlprojCPUPerEv, state)
		if statementsLoaded(t) {
			require.NotEmpty(t, run.Statements, state)
			require.Positive(t, run.StatementsPerEv, state)
		}
	}
	require.Equal(t, cfg.SustainedHistory, sus.Runs[0].HistoryRows)

	require.Equal(t, cfg.Failovers, rep.Failover.Rounds)
	require.Len(t, rep.Failover.Seconds.Samples, cfg.Failovers)
	require.Positive(t, rep.Failover.Seconds.Min)

	require.Positive(t, rep.ClaimCost.EmptyMedianMs)
	require.Positive(t, rep.ClaimCost.ScaleMedianMs)
	require.EqualValues(t, cfg.DoneRows, rep.ClaimCost.LedgerRows, "a ledger entry per done row of the history")
	require.Positive(t, rep.ClaimCost.PausedMedianMs)
	require.Positive(t, rep.ClaimCost.BackoffMedianMs)

	require.Nil(t, rep.SQLScale)
	require.Nil(t, rep.River)
	require.Positive(t, rep.Memory.PeakRSSMB)

	rt := rep.Retention
	require.NotNil(t, rt)
	require.Len(t, rt.Samples, int(cfg.RetentionDuration/cfg.RetentionSample))
	require.GreaterOrEqual(t, rt.ProducedSeconds, cfg.RetentionDuration.Seconds())
	require.InDelta(t, float64(cfg.RetentionRate)*rt.ProducedSeconds, rt.Produced, float64(cfg.RetentionRate)/5, "the producer kept its rate")
	require.GreaterOrEqual(t, rt.Pruned, int64(cfg.RetentionSeed), "the leader's first rotation dropped the seeded rows' partition")
	acked := 0
	for i, s := range rt.Samples {
		require.Positive(t, s.Rows, "sample %d", i)
		require.Positive(t, s.Bytes, "sample %d", i)
		require.LessOrEqual(t, s.DoneRows+s.Backlog, s.Rows, "sample %d", i)
		require.Positive(t, s.LedgerRows, "sample %d", i)
		require.LessOrEqual(t, s.LedgerRows, int64(cfg.RetentionDocs), "sample %d: one ledger entry per book at most", i)
		if i > 0 {
			require.Greater(t, s.T, rt.Samples[i-1].T, "sample %d", i)
			require.GreaterOrEqual(t, s.Rotations, rt.Samples[i-1].Rotations, "sample %d", i)
		}
		if s.Acked > 0 {
			// The claim statement's p99 and insert to ack's, from the
			// pair's histograms: no longer one the part of the other.
			require.True(t, 0 < s.ClaimWaitP99Ms && 0 < s.AckP99Ms, "sample %d: %+v", i, s)
		}
		acked += s.Acked
	}
	require.Positive(t, acked)
	require.NotNil(t, rt.Verdict)
	require.Positive(t, rt.Verdict.RowsRatio)
	require.Positive(t, rt.Verdict.BytesRatio)

	c := rep.Comparison
	require.NotNil(t, c)
	require.Len(t, c.Pairs, cfg.Pairs)
	for i, p := range c.Pairs {
		require.Equal(t, cfg.Docs, p.Raw.Events, "pair %d", i+1)
		require.Equal(t, cfg.Docs, p.EndToEnd.Events, "pair %d", i+1)
		require.Positive(t, p.Ratio, "pair %d", i+1)
		require.Positive(t, p.WlprojMicrosPerEvent, "pair %d: the leader's CPU", i+1)
		require.Positive(t, p.PostgresMicrosPerEvent, "pair %d: the database's CPU", i+1)
	}
	require.True(t, 0 < c.MinRatio && c.MinRatio <= c.MedianRatio && c.MedianRatio <= c.MaxRatio, "%+v", c)
	require.Equal(t, c.MedianRatio, rep.Ratios.EndToEndToRawMedian)

	rb := rep.Rebuild
	require.NotNil(t, rb)
	require.Equal(t, cfg.RebuildRows, rb.Rows)
	require.Positive(t, rb.RowsPerSec)
	require.Positive(t, rb.RawPerSec)
	require.Positive(t, rb.Ratio)
	require.InDelta(t, rb.RowsPerSec/rb.RawUnderLivePerSec, rb.RatioUnderLive, 1e-9)
	require.Positive(t, rb.LoadCPUSeconds["bench"], "the loader's CPU during the load")
	require.Positive(t, rb.Reads)
	require.Zero(t, rb.ReadsFailed)
	require.Zero(t, rb.ReadsMissing)

	con := rep.Console
	require.NotNil(t, con)
	require.Equal(t, cfg.ConsoleRows, con.FailedRows)
	for _, page := range []string{"first_screen", "filter_reason", "filter_scope", "filter_text", "last_page", "overview"} {
		require.Positive(t, con.Pages[page].MedianMs, page)
	}

	nd := rep.NetDelay
	require.NotNil(t, nd)
	require.Len(t, nd.Runs, 3, "0 ms with the defaults, 20 ms with the runbook's settings and with the defaults")
	for _, run := range nd.Runs {
		require.Len(t, run.EventsPerSec, cfg.NetDelay.Rounds, "%g ms %s", run.DelayMs, run.Settings)
		require.Positive(t, run.MedianEventsPerSec, "%g ms %s", run.DelayMs, run.Settings)
		require.Positive(t, run.ToZero, "%g ms %s", run.DelayMs, run.Settings)
	}
	require.Equal(t, nd.Runs[0].MedianEventsPerSec, nd.ZeroEventsPerSec)

	requireSoak(t, cfg, rep.Soak)

	tp := rep.TwoProjections
	require.NotNil(t, tp)
	require.Len(t, tp.Ratios, cfg.Pairs, "one round per pair")
	for i := range tp.Ratios {
		require.Positive(t, tp.One[i].EventsPerSec)
		require.Positive(t, tp.Two[i].EventsPerSec)
	}

	// Every step that runs wlproj under load runs the documented pair, and
	// the database's health during it is in the report: the standby is
	// seen waiting for the leader's lock from the database's side.
	var loaded []string
	for _, s := range (&bench{}).steps() {
		if s.load && slices.Contains(cfg.Steps, s.flag) {
			loaded = append(loaded, s.flag)
		}
	}
	require.Equal(t, loaded, harness.Map(rep.DatabaseHealth, func(h StepHealth) string { return h.Step }))
	for _, h := range rep.DatabaseHealth {
		require.Positive(t, h.Samples, h.Step)
		require.Zero(t, h.FailedSamples, "%s: %s", h.Step, h.FirstFailure)
		if h.Step != "failover" {
			// The failover step waits for its standby itself before each
			// kill, and in the smoke run its rounds are shorter than the
			// sampler's second: a sample may fall only on restarts.
			require.Positive(t, h.StandbySamples, "%s: a standby waited for the lock", h.Step)
		}
		require.Contains(t, h.Tables, outboxTable, h.Step)
	}

	require.Len(t, rep.Targets, 21+2*6+3+1+5+len(loaded),
		"six targets per sustained run, three of the verify step, one of the network delay, five of the soak, one per step under load")
	profile, err := os.Stat(cfg.CPUProfile)
	require.NoError(t, err, "the leader's CPU profile")
	require.Positive(t, profile.Size())

	// Nothing left behind: the database and the indices are gone.
	conn, err := pgx.Connect(ctx, cfg.AdminURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var dbs int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname = $1`, rep.Database).Scan(&dbs))
	require.Zero(t, dbs, "database %s dropped", rep.Database)
	for _, index := range []string{rep.Index, rep.Index + "-raw", rep.Index + "-rb", rep.Index + "-rb-raw"} {
		resp, err := http.Head(cfg.ElasticURL + "/" + index)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusNotFound, resp.StatusCode, "index %s deleted", index)
	}
}

// requireSoak checks the smoke run's soak step: every window summed up,
// the middle one beside the outside transaction.
func requireSoak(t *testing.T, cfg Config, so *Soak) {
	t.Helper()
	require.NotNil(t, so)
	require.Len(t, so.Replicas, 2, "the soak runs the documented pair")
	require.Len(t, so.Windows, int(cfg.Soak.Duration/cfg.Soak.Window))
	// The warm-up's events are not the windows' and not so.Events.
	require.NotNil(t, so.Warmup, "the warm-up summed up apart")
	require.Positive(t, so.Warmup.Events)
	require.Positive(t, so.Warmup.Acked)
	require.Equal(t, -cfg.Soak.Warmup.Seconds(), so.Warmup.StartSeconds)
	require.InDelta(t, cfg.Soak.Rate*int(cfg.Soak.Duration.Seconds()), so.Events-so.Warmup.Events, float64(cfg.Soak.Rate)/5)
	for i, w := range so.Windows {
		require.Positive(t, w.Events, "window %d", i)
		require.Positive(t, w.Acked, "window %d", i)
		require.Positive(t, w.LagP99ms, "window %d", i)
		require.Positive(t, w.WlprojCPUPerEv, "window %d: both replicas' CPU", i)
		require.Positive(t, w.Database.Samples, "window %d: the database sampled", i)
		require.Contains(t, w.Database.Tables, outboxTable, "window %d", i)
		require.Contains(t, w.Database.Tables, ledgerTable, "window %d", i)
		require.Contains(t, w.Churn, outboxTable, "window %d", i)
		require.Contains(t, w.Churn, ledgerTable, "window %d", i)
		require.Equal(t, i == 1, w.Held, "window %d", i)
		if statementsLoaded(t) {
			require.True(t, slices.ContainsFunc(w.Statements, func(s StatementCost) bool { return s.Producer }),
				"window %d: the producer's insert among the window's statements: %+v", i, w.Statements)
		}
	}
	require.NotNil(t, so.Hold)
	require.Equal(t, cfg.Soak.HoldTo.Seconds(), so.Hold.ToSeconds)
	require.GreaterOrEqual(t, so.Hold.CaughtUpSeconds, 0.0)
	require.Equal(t, "on", so.Autovacuum.On, "autovacuum as shipped")
	require.Contains(t, so.Reclaimed, outboxTable)
}

func TestBenchRefusesOutOfRangeSettings(t *testing.T) {
	for _, tc := range []struct {
		change func(*Config)
		want   string
	}{
		{func(c *Config) { c.Docs = 0 }, "-n=0 is out of range"},
		{func(c *Config) { c.Batch = 20_000 }, "-batch=20000 is out of range"},
		{func(c *Config) { c.Duration = 0 }, "-duration=0s is below 100ms"},
		{func(c *Config) { c.AdminURL = "" }, "DATABASE_URL is not set"},
		{func(c *Config) { c.Steps = []string{"e2e", "warp"} }, `-steps: unknown step "warp"`},
		{func(c *Config) { c.ReplicaSettings = []string{"OUTBOX_BULK_SIZE"} }, `-replica-env: "OUTBOX_BULK_SIZE" is not KEY=VALUE`},
		{func(c *Config) { c.SustainedRates = []int{2000, 0} }, `-sustained-rate=0 is outside 1..100000`},
		{func(c *Config) { c.RetentionSample = 40 * time.Second }, "-retention-sample=40s is over half of -retention=1m0s"},
		{func(c *Config) { c.PGRounds = 0 }, "-pg-rounds=0 is out of range"},
		{func(c *Config) { c.Pairs = 0 }, "-pairs=0 is out of range"},
		{func(c *Config) { c.River.Rounds = 0 }, "-river-rounds=0 is out of range"},
		{func(c *Config) { c.River.FetchCooldown = 0 }, "-river-fetch-cooldown=0s is below River's minimum of 1ms"},
		{func(c *Config) { c.Soak.Duration = time.Minute }, "-soak-duration=1m0s must hold 1 to 1000 windows of -soak-window=5m0s"},
		{func(c *Config) { c.Soak.Writers = 0 }, "-soak-writers=0 is out of range [1, 64]"},
		{func(c *Config) { c.Soak.HoldFrom = time.Minute }, "-soak-hold-from=1m0s needs -soak-hold-to"},
		{func(c *Config) { c.Soak.HoldFrom, c.Soak.HoldTo = 5*time.Minute, 31*time.Minute }, "must be 0 <= from < to <= -soak-duration=30m0s"},
	} {
		cfg := defaultConfig()
		cfg.AdminURL, cfg.ElasticURL = "postgres://unused", "http://unused"
		tc.change(&cfg)
		_, err := Run(context.Background(), cfg)
		require.ErrorContains(t, err, tc.want)
	}
}

func TestSQLScaleReadsTheTestsLines(t *testing.T) {
	t.Parallel()
	out := []byte(`=== RUN   TestStatementsAtScaleReadNoTableWhole
    scale_test.go:62: scale: 100000 done rows, 20000 ledger entries, loaded in 2s
    scale_test.go:111: scale: claim 9.610 ms 8080 buffers
    scale_test.go:111: scale: prune-done 61.5 ms 6061 buffers
--- PASS: TestStatementsAtScaleReadNoTableWhole (2.75s)
`)
	sts := scaleStatements(out)
	require.Equal(t, []ScaleStatement{{Name: "claim", Ms: 9.61, Buffers: 8080}, {Name: "prune-done", Ms: 61.5, Buffers: 6061}}, sts)

	var met []bool
	sqlScaleTargets(&Report{SQLScale: &SQLScale{Rows: 100000, NoTableScan: true, Statements: sts}},
		func(_, _ string, _ float64, _ string, ok bool) { met = append(met, ok) })
	require.Equal(t, []bool{true, true, false}, met, "no scan; claim under 50 ms; prune-done over")
}

// statementsLoaded says whether the stack's Postgres loads
// pg_stat_statements, as scripts/stack.sh starts it.
func statementsLoaded(t *testing.T) bool {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), harness.AdminDatabaseURL(t))
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var libs string
	require.NoError(t, conn.QueryRow(context.Background(), `SHOW shared_preload_libraries`).Scan(&libs))
	return strings.Contains(libs, "pg_stat_statements")
}
