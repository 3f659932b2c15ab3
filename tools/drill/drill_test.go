package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// TestDrillSmoke runs every scenario but the Postgres restart on tiny sizes,
// the soak, the replay after deletes and the deposed leader's late write
// included, so the drill cannot rot between
// `make drill` runs. The restart is left out
// because the cluster is shared with the tests running beside this one.
func TestDrillSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("drill smoke runs replicas for ~20 s")
	}
	var out bytes.Buffer
	cfg := Config{
		Rate: 100, Entities: 50, Kills: 1, Replays: 2, Outage: 2 * time.Second, Soak: 3 * time.Second, SoakRate: 300,
		Settle: 500 * time.Millisecond, DrainTimeout: time.Minute,
		MaxAttempts: maxAttemptsDefault,
		// Short enough that each table rotates during the few seconds of
		// each scenario, and each new leader's first round rotates both.
		Retention: 2 * time.Second, MinRotations: 2,
		ReportPath: filepath.Join(t.TempDir(), "report.json"),
		Bin:        harness.Binary(t),
		AdminURL:   harness.AdminDatabaseURL(t),
		ElasticURL: harness.ElasticURL(t),
		Out:        &out,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	rep, err := Run(ctx, cfg)
	require.NoError(t, err, out.String())
	require.True(t, rep.OK, "drill failed:\n%s", out.String())

	raw, err := os.ReadFile(cfg.ReportPath)
	require.NoError(t, err)
	var got Report
	require.NoError(t, json.Unmarshal(raw, &got))
	require.True(t, got.OK)
	require.Positive(t, got.Events.Produced)
	require.Zero(t, got.Events.Lost)
	require.Zero(t, got.Regressed)
	require.Zero(t, got.Resurrected)
	require.Zero(t, got.LedgerMismatch)
	// What the writers committed, not what the outbox still holds: a row a
	// faulty prune or archive removed would be missing from both sides.
	require.Positive(t, got.Events.DrillWritten)
	require.Equal(t, got.Events.ProducerCommitted+got.Events.DrillWritten, got.Events.Done+got.Events.Failed+got.Events.Discarded)
	require.EqualValues(t, 2*len(stories), got.ReplayedRows)
	names := map[string]bool{}
	for _, sc := range got.Scenarios {
		require.True(t, sc.OK, "scenario %s: %s", sc.Name, sc.Error)
		names[sc.Name] = true
	}
	require.Equal(t, map[string]bool{"soak": true, "kill-9": true, "engine-down": true, "network-cut": true, "rolling-sigterm": true,
		"replay-after-delete": true, "deposed-leader-late-write": true}, names)
	for _, sc := range got.Scenarios {
		require.NotNil(t, sc.Database, "scenario %s: the database's health", sc.Name)
		require.Positive(t, sc.Database.Samples, "scenario %s", sc.Name)
		require.Contains(t, sc.Database.Tables, "outbox_events", "scenario %s", sc.Name)
	}
	soak := got.Scenarios[0]
	require.Equal(t, "soak", soak.Name)
	require.NotNil(t, soak.Soak)
	require.Len(t, soak.Soak.LagP99ByThirdMs, 3)
	require.Positive(t, soak.Soak.Events)
	require.Positive(t, soak.Soak.Database.StandbySamples, "a standby waited for the lock all through the soak")
	require.LessOrEqual(t, soak.Soak.Database.OursSeconds, soakSnapshotLimit.Seconds())
	require.LessOrEqual(t, soak.Soak.VacuumSeconds, soakVacuumLimit.Seconds())
	// Both tables rotated, by the replicas' counters and by the rotation
	// archive, and the verdict above judged the rows the rotation emptied.
	require.GreaterOrEqual(t, got.Rotations.Events, int64(cfg.MinRotations))
	require.GreaterOrEqual(t, got.Rotations.Ledger, int64(cfg.MinRotations))
	require.GreaterOrEqual(t, got.Rotations.Archive.Events, got.Rotations.Events)
	require.GreaterOrEqual(t, got.Rotations.Archive.Ledger, got.Rotations.Ledger)
	require.Positive(t, got.Rotations.Archive.EventRows)
	require.Equal(t, 2*time.Second, time.Duration(got.Settings.RetentionSeconds*float64(time.Second)))
	late := got.Scenarios[len(got.Scenarios)-1]
	require.Equal(t, "deposed-leader-late-write", late.Name)
	require.Equal(t, "dropped", late.HeldOutcome, "the killed leader's held bulk must die with its connection")
	require.Equal(t, ptr(false), late.Resurrected)
}

// A row gone from the outbox (a faulty prune or archive) is lost, though
// the outbox's own counts add up: the drill compares them with what was
// written.
func TestSettleCountsVanishedRowsLost(t *testing.T) {
	t.Parallel()
	v := harness.Verdict{Events: 97, Done: 90, Failed: 3, Discarded: 1, Lost: 3}
	require.Equal(t, Events{Produced: 97, Done: 90, Failed: 3, Discarded: 1, Lost: 6, Vanished: 3}, settle(v, 100))
	require.Equal(t, Events{Produced: 97, Done: 90, Failed: 3, Discarded: 1, Lost: 3, Unaccounted: 2}, settle(v, 95),
		"an insert that failed on the client but committed is more, not lost")
}

// A table that rotated fewer times than -min-rotations fails the drill,
// naming the table and what to change.
func TestRotationsCheck(t *testing.T) {
	t.Parallel()
	require.Empty(t, Rotations{Events: 2, Ledger: 5}.check(2))
	require.Empty(t, Rotations{}.check(0), "-min-rotations 0 checks nothing")
	require.Equal(t, []string{"outbox_ledger rotated 1 times, fewer than 2: lengthen the run or shorten -retention"},
		Rotations{Events: 3, Ledger: 1}.check(2))
	require.Len(t, Rotations{}.check(2), 2)
}

// -retention must be one the replicas accept.
func TestConfigRefusesRetentionOutOfRange(t *testing.T) {
	t.Parallel()
	cfg := Config{Rate: 1, Entities: 1, Outage: time.Second, MaxAttempts: 1, AdminURL: "postgres://x", ElasticURL: "http://x",
		Retention: time.Millisecond}
	require.ErrorContains(t, cfg.validate(), "-retention 1ms: out of range [1s, ")
	cfg.Retention = 30 * time.Second
	require.NoError(t, cfg.validate())
}

// postgres-failover without a standby is refused before anything starts,
// naming what is missing: `make drill` must never skip it silently.
func TestConfigRefusesFailoverWithoutStandby(t *testing.T) {
	t.Parallel()
	cfg := Config{Rate: 1, Entities: 1, Outage: time.Second, MaxAttempts: 1, AdminURL: "postgres://x", ElasticURL: "http://x",
		PGFailover: true, PG: PGControl{Data: "/pg", BinDir: "/bin"}}
	require.ErrorContains(t, cfg.validate(), "postgres-failover needs a Postgres standby (STACK_PG_STANDBY_DATA")
	cfg.PG.StandbyData = "/pg-standby"
	require.NoError(t, cfg.validate())
}

// The soak fails on a lag that grows, or on a wlproj snapshot held too
// long; a p99 that doubles at tens of ms is noise, not a trend.
func TestSoakVerdict(t *testing.T) {
	t.Parallel()
	ok := SoakResult{LagP99ByThirdMs: []float64{40, 60, 90}, Database: harness.HealthSummary{OursSeconds: 1}}
	require.NoError(t, ok.verdict())
	growing := ok
	growing.LagP99ByThirdMs = []float64{200, 4000, 112_000}
	require.ErrorContains(t, growing.verdict(), "the lag is not flat")
	held := ok
	held.Database.OursSeconds, held.Database.OursHolder = 725, "wlproj-leader:b (pid 7, active, 725s old)"
	require.ErrorContains(t, held.verdict(), "a wlproj session held a snapshot for 725.0 s (limit 5s): wlproj-leader:b")
}

// -scenarios names known scenarios only; without the Postgres ones it
// needs no way to restart Postgres.
func TestConfigScenarios(t *testing.T) {
	t.Parallel()
	cfg := Config{Rate: 1, Entities: 1, Outage: time.Second, MaxAttempts: 1, AdminURL: "postgres://x", ElasticURL: "http://x",
		PGRestart: true, PGFailover: true, Scenarios: []string{"soak", "kill-9"}}
	require.NoError(t, cfg.validate())
	cfg.Scenarios = []string{"soak", "nap"}
	require.ErrorContains(t, cfg.validate(), `-scenarios: unknown scenario "nap" (known: soak,kill-9,`)
	require.True(t, Config{}.wants("engine-down"), "every scenario when none is named")
}
