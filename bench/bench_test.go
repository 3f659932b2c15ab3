package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testenv"
)

// TestBenchSmoke runs every step on tiny sizes, so the benchmark code
// cannot rot; the figures themselves are not judged here.
func TestBenchSmoke(t *testing.T) {
	cfg := defaultConfig().smoke()
	cfg.AdminURL, cfg.ElasticURL = testenv.AdminDatabaseURL(t), testenv.ElasticURL(t)
	cfg.Bin = testenv.Binary(t)
	cfg.Out = filepath.Join(t.TempDir(), "results.json")
	cfg.CPUProfile = filepath.Join(t.TempDir(), "leader.pprof")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	_, err := Run(ctx, cfg)
	require.NoError(t, err)

	raw, err := os.ReadFile(cfg.Out)
	require.NoError(t, err)
	var rep Report
	require.NoError(t, json.Unmarshal(raw, &rep))
	require.Contains(t, rep.Versions.Engine, "7.")
	require.NotEmpty(t, rep.Versions.Postgres)

	for name, th := range map[string]*Throughput{"raw": rep.RawBulk, "e2e": rep.EndToEnd, "bare": rep.PostgresPath.Bare} {
		require.NotNil(t, th, name)
		require.Equal(t, cfg.Docs, th.Events, name)
		require.Positive(t, th.EventsPerSec, name)
	}
	require.Positive(t, rep.EndToEnd.CPUSeconds["engine"], "the engine did the indexing of step 2")
	require.Len(t, rep.PostgresPath.Daemon, 2, "the daemon loop at its batch and at the bare loop's")
	require.Positive(t, rep.Ratios.EndToEndToRaw)
	require.Positive(t, rep.Ratios.DaemonPGToBareLoop)

	lat := rep.Latency
	require.NotNil(t, lat)
	// 200/s for 3 s: the producer's ticks may fall short by a few.
	require.InDelta(t, cfg.Rate*int(cfg.Duration.Seconds()), lat.Events, float64(cfg.Rate)/5)
	require.True(t, 0 < lat.P50ms && lat.P50ms <= lat.P95ms && lat.P95ms <= lat.P99ms && lat.P99ms <= lat.MaxMs, "%+v", lat)

	require.Equal(t, cfg.Failovers, rep.Failover.Rounds)
	require.Len(t, rep.Failover.Seconds.Samples, cfg.Failovers)
	require.Positive(t, rep.Failover.Seconds.Min)

	require.Positive(t, rep.ClaimCost.EmptyMedianMs)
	require.Positive(t, rep.ClaimCost.ScaleMedianMs)
	require.Positive(t, rep.Memory.PeakRSSMB)
	require.Len(t, rep.Targets, 7)
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
	for _, index := range []string{rep.Index, rep.Index + "-raw"} {
		resp, err := http.Head(cfg.ElasticURL + "/" + index)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusNotFound, resp.StatusCode, "index %s deleted", index)
	}
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
	} {
		cfg := defaultConfig()
		cfg.AdminURL, cfg.ElasticURL = "postgres://unused", "http://unused"
		tc.change(&cfg)
		_, err := Run(context.Background(), cfg)
		require.ErrorContains(t, err, tc.want)
	}
}
