package main

import (
	"fmt"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// addTarget records one target: what was measured, its goal, the value,
// and whether the goal was met.
type addTarget func(measure, goal string, value float64, unit string, met bool)

// stepTargets check each step's targets, in the report's order: one check
// per target, so that the targets read as a list.
var stepTargets = []func(r *Report, add addTarget){
	throughputTargets, pgTargets, latencyTargets, failoverTargets, claimTargets, memoryTargets,
	retentionTargets, rebuildTargets, sustainedTargets,
	func(r *Report, add addTarget) {
		if v := r.Verify; v != nil {
			v.addTargets(add)
		}
	},
	consoleTargets, sqlScaleTargets, netDelayTargets, riverTargets, twoProjectionsTargets, soakTargets, healthTargets,
}

// throughputTargets: the median of the pairs when there are some, since
// one pair is noise on a shared machine.
func throughputTargets(r *Report, add addTarget) {
	if c := r.Comparison; c != nil && len(c.Pairs) > 0 {
		how := "unpinned"
		if c.Pinned != nil {
			how = "engine on cpu " + c.Pinned.EngineCPUs + ", the rest on cpu " + c.Pinned.RestCPUs
		}
		add(fmt.Sprintf("end-to-end / raw bulk, median of %d pairs, %s", len(c.Pairs), how), ">= 0.9", c.MedianRatio, "ratio", c.MedianRatio >= 0.9)
		add("Postgres CPU per event, bulk drain", "<= 25", c.PostgresMicrosPerEvent, "µs", c.PostgresMicrosPerEvent <= 25)
		add("wlproj CPU per event, bulk drain", "<= 12", c.WlprojMicrosPerEvent, "µs", c.WlprojMicrosPerEvent <= 12)
	} else if r.RawBulk != nil && r.EndToEnd != nil {
		add("end-to-end / raw bulk", ">= 0.9", r.Ratios.EndToEndToRaw, "ratio", r.Ratios.EndToEndToRaw >= 0.9)
	}
}

func pgTargets(r *Report, add addTarget) {
	if pg := r.PostgresPath; pg != nil {
		add("postgres path alone", ">= 15000", pg.Ledger.MedianEventsPerSec, "events/s", pg.Ledger.MedianEventsPerSec >= 15000)
		add("postgres path / bare SQL loop", ">= 0.85", r.Ratios.DaemonPGToBareLoop, "ratio", r.Ratios.DaemonPGToBareLoop >= 0.85)
	}
}

func latencyTargets(r *Report, add addTarget) {
	if r.Latency != nil {
		add("latency p50", "<= 50", r.Latency.P50ms, "ms", r.Latency.P50ms <= 50)
		add("latency p99", "<= 250", r.Latency.P99ms, "ms", r.Latency.P99ms <= 250)
	}
}

func failoverTargets(r *Report, add addTarget) {
	if r.Failover != nil {
		add("failover median", "<= 1", r.Failover.Seconds.Median, "s", r.Failover.Seconds.Median <= 1)
		p99 := r.Failover.Seconds.P99 * 1000
		add(fmt.Sprintf("kill -9 to first event applied p99, %d kills at %d/s", r.Failover.Rounds, r.Failover.Rate), "<= 50", p99, "ms", p99 <= 50)
	}
}

func claimTargets(r *Report, add addTarget) {
	if r.ClaimCost != nil {
		c := r.ClaimCost
		add("claim with history / empty", "<= 1.1", c.Ratio, "ratio", c.Ratio <= 1.1)
		if c.ParkedRows > 0 {
			add(fmt.Sprintf("claim beside %d paused rows / empty", c.ParkedRows), "<= 1.2", c.PausedRatio, "ratio", c.PausedRatio <= 1.2)
			add(fmt.Sprintf("claim beside %d rows in backoff / empty", c.ParkedRows), "<= 1.2", c.BackoffRatio, "ratio", c.BackoffRatio <= 1.2)
		}
	}
}

func memoryTargets(r *Report, add addTarget) {
	if r.Memory != nil {
		add("peak RSS", "<= 100", r.Memory.PeakRSSMB, "MB", r.Memory.PeakRSSMB <= 100)
	}
}

func retentionTargets(r *Report, add addTarget) {
	if r.Retention != nil && r.Retention.Verdict != nil {
		v := r.Retention.Verdict
		add("retention: rows, last third / middle third", "<= 1.1", v.RowsRatio, "ratio", v.RowsRatio <= 1.1)
		add("retention: bytes, last third / middle third", "<= 1.1", v.BytesRatio, "ratio", v.BytesRatio <= 1.1)
		add("retention: claim p99, last third / first third", "<= 1.5", v.ClaimWaitP99Ratio, "ratio", v.ClaimWaitP99Ratio <= 1.5)
	}
}

func rebuildTargets(r *Report, add addTarget) {
	if rb := r.Rebuild; rb != nil {
		add("rebuild load / raw bulk", ">= 0.8", harness.Round3(rb.Ratio), "ratio", rb.Ratio >= 0.8)
		add("rebuild load / raw bulk under the same live events", ">= 0.8", harness.Round3(rb.RatioUnderLive), "ratio", rb.RatioUnderLive >= 0.8)
	}
}

func sustainedTargets(r *Report, add addTarget) {
	for _, s := range r.Sustained {
		sustainedRunTargets(s, add)
	}
}

func sustainedRunTargets(s *Sustained, add addTarget) {
	for _, run := range s.Runs {
		at := fmt.Sprintf("sustained %d/s, %s", s.Rate, run.State)
		add(at+": lag p99", "<= 250", run.LagP99ms, "ms", run.LagP99ms <= 250)
		add(at+": lag p99, last third / first third", "<= 1.2", run.Flatness, "ratio", run.Flatness <= 1.2)
		add(at+": claim p99", "<= 5", run.ClaimP99ms, "ms", run.ClaimP99ms <= 5)
		add(at+": lease expiries", "0", float64(run.LeaseExpiries), "events", run.LeaseExpiries == 0)
		add(at+": database CPU per event, wlproj's", "<= 50", run.DatabaseCPUPerEv, "µs", run.DatabaseCPUPerEv <= 50)
		add(at+": wlproj CPU per event", "<= 25", run.WlprojCPUPerEv, "µs", run.WlprojCPUPerEv <= 25)
	}
}

func consoleTargets(r *Report, add addTarget) {
	if c := r.Console; c != nil {
		first := c.Pages["first_screen"].P95Ms
		add(fmt.Sprintf("console first screen p95, %d failed", c.FailedRows), "< 300", first, "ms", first < ms(consoleFirstScreenTarget))
		worst := worstFilter(c)
		add(fmt.Sprintf("console worst filter p95, %d failed", c.FailedRows), "< 500", worst, "ms", worst < ms(consoleFilterTarget))
	}
}
