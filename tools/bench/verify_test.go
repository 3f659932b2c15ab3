package main

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// TestBenchVerifySmoke runs the verify step alone on tiny sizes: the three
// timings per round, the peak RSS, the drain's two windows, the scheduled
// run clean against the live drain, and the targets in the report.
func TestBenchVerifySmoke(t *testing.T) {
	cfg := defaultConfig().smoke()
	cfg.AdminURL, cfg.ElasticURL = harness.AdminDatabaseURL(t), harness.ElasticURL(t)
	cfg.Bin = harness.Binary(t)
	cfg.Out = filepath.Join(t.TempDir(), "results.json")
	cfg.Steps = []string{"verify"}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	rep, err := Run(ctx, cfg)
	require.NoError(t, err)
	v := rep.Verify
	require.NotNil(t, v)
	require.Len(t, v.Rounds, cfg.Verify.Rounds)
	for _, r := range v.Rounds {
		require.Positive(t, r.ScanSeconds)
		require.Positive(t, r.ReadSeconds)
		require.Positive(t, r.VerifySeconds)
		require.Positive(t, r.RSSMB)
	}
	require.Positive(t, v.MedianRatio)
	d := v.Drain
	require.NotNil(t, d)
	require.Positive(t, d.BaselineEvents)
	require.Positive(t, d.DuringEvents)
	require.EqualValues(t, cfg.Verify.Docs, d.Checked)
	require.Zero(t, d.Drift, "the scheduled run found the live drain's updates in flight or applied, not drift")
	var measures []string
	for _, tg := range rep.Targets {
		measures = append(measures, tg.Measure)
	}
	require.Contains(t, measures, "verify peak RSS")
	require.Contains(t, measures, "drain p99 during a scheduled verify / without")
}
