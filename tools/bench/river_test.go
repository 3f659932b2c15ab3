package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// riverbench's lines as the step reads them: one result per line, blank
// lines skipped, anything else refused.
func TestRiverParsesTheProgramsLines(t *testing.T) {
	t.Parallel()
	out := []byte(`{"river_version":"v0.51.1","jobs":20000,"workers":500,"fetch_cooldown_ms":1,"fetch_poll_interval_ms":20,"pool_max_conns":4,"seconds":0.963,"jobs_per_s":20768.8,"cpu_seconds":0.45,"database_cpu_seconds":0.73}

{"river_version":"v0.51.1","jobs":20000,"workers":500,"fetch_cooldown_ms":1,"fetch_poll_interval_ms":20,"pool_max_conns":4,"seconds":0.836,"jobs_per_s":23923,"cpu_seconds":0.387,"database_cpu_seconds":0.78}
`)
	runs, err := parseRiverRuns(out)
	require.NoError(t, err)
	require.Equal(t, []RiverRun{
		{RiverVersion: "v0.51.1", Jobs: 20000, Workers: 500, FetchCooldownMs: 1, FetchPollIntervalMs: 20, PoolMaxConns: 4,
			Seconds: 0.963, JobsPerSec: 20768.8, CPUSeconds: 0.45, DatabaseCPUSeconds: 0.73},
		{RiverVersion: "v0.51.1", Jobs: 20000, Workers: 500, FetchCooldownMs: 1, FetchPollIntervalMs: 20, PoolMaxConns: 4,
			Seconds: 0.836, JobsPerSec: 23923, CPUSeconds: 0.387, DatabaseCPUSeconds: 0.78},
	}, runs)

	for _, bad := range []string{"", "\n\n", "riverbench: round 1: boom\n", `{"jobs":10,"seconds":0,"jobs_per_s":0}`, `{"jobs":"many"}`} {
		_, err := parseRiverRuns([]byte(bad))
		require.Error(t, err, "%q", bad)
	}
}

// The ratio of each round is daemon over River; the medians and the spread
// are over the rounds, and the target judges the median ratio.
func TestRiverRatiosAndTarget(t *testing.T) {
	t.Parallel()
	rv := &River{Workers: 500, FetchCooldownMs: 1, RiverRuns: []RiverRun{{RiverVersion: "v0.51.1", PoolMaxConns: 4}}, Rounds: []RiverRound{
		{RiverJobsPerSec: 20000, DaemonEventsPerSec: 30000, DaemonToRiver: 1.5},
		{RiverJobsPerSec: 25000, DaemonEventsPerSec: 55000, DaemonToRiver: 2.2},
		{RiverJobsPerSec: 22000, DaemonEventsPerSec: 44000, DaemonToRiver: 2},
	}}
	rv.finish()
	require.Equal(t, "v0.51.1", rv.Version)
	require.Equal(t, 4, rv.PoolMaxConns)
	require.Equal(t, 22000.0, rv.RiverMedianJobsPerSec)
	require.Equal(t, 20000.0, rv.RiverMinJobsPerSec)
	require.Equal(t, 25000.0, rv.RiverMaxJobsPerSec)
	require.Equal(t, 44000.0, rv.DaemonMedianEventsPerSec)
	require.Equal(t, 2.0, rv.MedianRatio, "the median of the rounds' ratios, not the ratio of the medians")
	require.Equal(t, 1.5, rv.MinRatio)
	require.Equal(t, 2.2, rv.MaxRatio)

	var targets []Target
	add := func(measure, goal string, value float64, unit string, met bool) {
		targets = append(targets, Target{measure, goal, value, unit, met})
	}
	riverTargets(&Report{River: rv}, add)
	require.Len(t, targets, 1)
	require.Contains(t, targets[0].Measure, "daemon Postgres path ÷ River v0.51.1")
	require.Equal(t, ">= 2.0", targets[0].Goal)
	require.True(t, targets[0].Met, "2.0 meets >= 2.0")

	rv.Rounds[2].DaemonToRiver = 1.9
	rv.finish()
	targets = nil
	riverTargets(&Report{River: rv}, add)
	require.Equal(t, 1.9, targets[0].Value)
	require.False(t, targets[0].Met)

	targets = nil
	riverTargets(&Report{}, add)
	riverTargets(&Report{River: &River{}}, add)
	require.Empty(t, targets, "no target without a round")
}
