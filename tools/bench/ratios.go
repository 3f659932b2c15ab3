package main

import (
	"time"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// finish computes the ratios and checks the targets.
func (r *Report) finish() {
	r.FinishedAt = time.Now().UTC()
	r.DurationSeconds = harness.Round3(r.FinishedAt.Sub(r.StartedAt).Seconds())
	if r.RawBulk != nil && r.EndToEnd != nil {
		r.Ratios.EndToEndToRaw = harness.Round3(r.EndToEnd.EventsPerSec / r.RawBulk.EventsPerSec)
	}
	if pg := r.PostgresPath; pg != nil {
		pg.ratios(&r.Ratios)
	}
	if r.ClaimCost != nil {
		r.Ratios.ClaimScaleToEmpty = r.ClaimCost.Ratio
	}
	if r.Comparison != nil {
		r.Comparison.finish()
		r.Ratios.EndToEndToRawMedian = r.Comparison.MedianRatio
	}
	add := func(measure, goal string, value float64, unit string, met bool) {
		r.Targets = append(r.Targets, Target{Measure: measure, Goal: goal, Value: value, Unit: unit, Met: met})
	}
	for _, targets := range stepTargets {
		targets(r, add)
	}
}

// ratios are the medians of step 3's rounds.
func (pg *PostgresPath) ratios(r *Ratios) {
	var toBare, toNoLedger, noLedgerToBare, dbCPU []float64
	for _, round := range pg.Rounds {
		toBare, toNoLedger = append(toBare, round.LedgerToBare), append(toNoLedger, round.LedgerToNoLedger)
		noLedgerToBare = append(noLedgerToBare, round.NoLedgerToBare)
		dbCPU = append(dbCPU, round.LedgerDatabaseCPU)
	}
	r.DaemonPGToBareLoop = median(toBare)
	r.LedgerToNoLedger = median(toNoLedger)
	r.NoLedgerToBareLoop = median(noLedgerToBare)
	pg.LedgerDatabaseCPU = median(dbCPU)
}
