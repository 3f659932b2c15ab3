package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/projection"
)

// The runbook's latency table is what the bench measures as "recommended":
// a row per netDelayRecommended entry, in order, with the same settings.
func TestNetDelayRecommendedMatchesRunbook(t *testing.T) {
	t.Parallel()
	runbook, err := os.ReadFile(filepath.Join(harness.Root(t), "runbook.md"))
	require.NoError(t, err)
	rows := regexp.MustCompile(`(?m)^\| up to (\d+) ms[^|]*\| `+"`"+`(\d+)`+"`"+` \| `+"`"+`(\d+)`+"`"+` \|`).
		FindAllStringSubmatch(string(runbook), -1)
	require.Len(t, rows, len(netDelayRecommended), "one row of runbook.md's latency table per recommendation")
	for i, row := range rows {
		upTo, _ := strconv.Atoi(row[1])
		bulk, _ := strconv.Atoi(row[2])
		conc, _ := strconv.Atoi(row[3])
		rec := netDelayRecommended[i]
		require.Equal(t, rec.UpTo, time.Duration(upTo)*time.Millisecond, "row %d", i+1)
		require.Equal(t, rec.netDelaySettings, netDelaySettings{bulk, conc}, "row %d (up to %d ms)", i+1, upTo)
	}
}

func TestRecommendedFor(t *testing.T) {
	t.Parallel()
	defaults := netDelaySettings{projection.BulkSizeDefault, projection.ConcurrencyDefault}
	require.Equal(t, defaults, recommendedFor(0), "a near engine keeps the defaults")
	require.Equal(t, netDelayRecommended[2].netDelaySettings, recommendedFor(20*time.Millisecond), "the row's bound is inclusive")
	require.Equal(t, netDelayRecommended[len(netDelayRecommended)-1].netDelaySettings, recommendedFor(time.Second), "beyond the table, its last row")
}

// The 0 ms default run and the goal's run are neighbours, so that the
// ratio the goal judges compares runs close in time.
func TestNetDelayRunsOrder(t *testing.T) {
	t.Parallel()
	defaults := netDelaySettings{projection.BulkSizeDefault, projection.ConcurrencyDefault}
	runs := netDelayRuns(defaultNetDelayConfig().Delays, defaults)
	require.Equal(t, 0.0, runs[0].DelayMs)
	require.Equal(t, "default", runs[0].Settings)
	require.Equal(t, ms(netDelayGoalAt), runs[1].DelayMs)
	require.Equal(t, "recommended", runs[1].Settings)
	require.Equal(t, recommendedFor(netDelayGoalAt), runs[1].netDelaySettings)
	seen := map[string]bool{}
	for _, r := range runs {
		key := strconv.FormatFloat(r.DelayMs, 'f', -1, 64) + r.Settings
		require.False(t, seen[key], "run %s listed twice", key)
		seen[key] = true
		if r.Settings == "recommended" {
			require.NotEqual(t, defaults, r.netDelaySettings, "a recommended run that equals the defaults is a duplicate")
		}
	}
	require.True(t, seen["20default"] && seen["5default"], "every delay runs with the defaults too")
}

// The goal's ratio is the median of the rounds' ratios, each over the same
// round's 0 ms rate, not the ratio of the medians.
func TestNetDelayTargets(t *testing.T) {
	t.Parallel()
	nd := &NetDelay{Runs: []NetDelayRun{
		{DelayMs: 0, Settings: "default", EventsPerSec: []float64{10000, 4000, 6000}},
		{DelayMs: 20, Settings: "recommended", EventsPerSec: []float64{9000, 3400, 3000}},
		{DelayMs: 20, Settings: "default", EventsPerSec: []float64{6000, 2000, 3000}},
	}}
	nd.finish()
	require.Equal(t, 6000.0, nd.ZeroEventsPerSec)
	require.Equal(t, 0.85, nd.Runs[1].ToZero, "median of 0.9, 0.85, 0.5")
	require.Equal(t, 0.5, nd.Runs[2].ToZero, "median of 0.6, 0.5, 0.5")

	targets := func() []Target {
		r := &Report{NetDelay: nd}
		var out []Target
		netDelayTargets(r, func(measure, goal string, value float64, unit string, met bool) {
			out = append(out, Target{measure, goal, value, unit, met})
		})
		return out
	}
	got := targets()
	require.Len(t, got, 1)
	require.Equal(t, 0.85, got[0].Value)
	require.True(t, got[0].Met)
	require.Contains(t, got[0].Measure, "20 ms one-way delay, recommended settings")

	nd.Runs[1].EventsPerSec = []float64{7000, 3000, 4000}
	nd.finish()
	got = targets()
	require.Equal(t, 0.7, got[0].Value)
	require.False(t, got[0].Met, "below 0.8x is not met")

	nd.Runs = nd.Runs[:1]
	require.Empty(t, targets(), "no 20 ms run, no target")
}
