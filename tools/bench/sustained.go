package main

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// Sustained is step 12: live traffic at a steady rate, as the application's
// database sees it, drained by the pair, with autovacuum as shipped and no manual vacuum, in two
// table states: an outbox with a long history of done rows, and one emptied
// and analyzed just before (the statistics of a new install).
type Sustained struct {
	Rate    int               `json:"rate"`
	Seconds float64           `json:"seconds"`
	Runs    []SustainedRun    `json:"runs"`
	Base    SustainedBaseline `json:"producer_alone"`
}

// SustainedBaseline is the producer's own database cost, with no replica:
// what the application pays without wlproj.
type SustainedBaseline struct {
	Seconds          float64 `json:"seconds"`
	Events           int64   `json:"events"`
	DatabaseCPUPerEv float64 `json:"database_cpu_us_per_event"`
}

type SustainedRun struct {
	// State is "history" (HistoryRows done rows and their ledger) or
	// "emptied" (emptied and analyzed just before).
	State       string  `json:"state"`
	HistoryRows int     `json:"history_rows"`
	Events      int64   `json:"events"`
	LagP50ms    float64 `json:"lag_p50_ms"`
	LagP99ms    float64 `json:"lag_p99_ms"`
	// The lag is the pair's outbox_event_latency_seconds (insert to ack;
	// queued rows get no processed_at), estimated within its buckets: of
	// every event of the run (LagP50ms, LagP99ms), and the p99 of those
	// acked in each third of the run, the last third's through the drain
	// after the producer (LagP99ByThird; by ack, where it was by insert);
	// Flatness is the last third's over the first's.
	LagP99ByThird []float64 `json:"lag_p99_ms_by_third"`
	Flatness      float64   `json:"flatness"`
	ClaimP99ms    float64   `json:"claim_p99_ms"`
	// LeaseExpiries counts events the reclaimer returned: sent twice.
	LeaseExpiries int `json:"lease_expiries"`
	// DatabaseCPUPerEv is the database's CPU per event with wlproj running,
	// less the producer's own (Base); WlprojCPUPerEv is the replica's.
	DatabaseCPUPerEv float64 `json:"database_cpu_us_per_event_wlproj"`
	WlprojCPUPerEv   float64 `json:"wlproj_cpu_us_per_event"`
	// StatementsPerEv is the database time of wlproj's statements per
	// event, from pg_stat_statements (the producer's insert left out), and
	// Statements the costliest statements of the run; both empty where the
	// server does not load it.
	StatementsPerEv float64         `json:"statements_us_per_event_wlproj,omitempty"`
	Statements      []StatementCost `json:"statements,omitempty"`
}

// 12. Sustained live load, autovacuum as shipped, at each rate.
func (b *bench) sustained(ctx context.Context) error {
	for _, rate := range b.cfg.SustainedRates {
		if err := b.sustainedAt(ctx, rate); err != nil {
			return fmt.Errorf("%d/s: %w", rate, err)
		}
	}
	return nil
}

func (b *bench) sustainedAt(ctx context.Context, rate int) error {
	s := &Sustained{Rate: rate, Seconds: b.cfg.SustainedDuration.Seconds()}
	var err error
	if s.Base, err = b.sustainedBaseline(ctx, rate); err != nil {
		return fmt.Errorf("producer alone: %w", err)
	}
	for _, state := range []string{"history", "emptied"} {
		run, err := b.sustainedRun(ctx, state, rate, s.Base)
		if err != nil {
			return fmt.Errorf("%s: %w", state, err)
		}
		s.Runs = append(s.Runs, run)
		b.say("sustained %s at %d/s: lag p99 %.1f ms (thirds %v), claim p99 %.2f ms, %d lease expiries, database %.1f µs/event, wlproj %.1f µs/event",
			state, s.Rate, run.LagP99ms, run.LagP99ByThird, run.ClaimP99ms, run.LeaseExpiries, run.DatabaseCPUPerEv, run.WlprojCPUPerEv)
	}
	b.rep.Sustained = append(b.rep.Sustained, s)
	return nil
}

// sustainedBaseline measures the producer alone, then empties the outbox.
func (b *bench) sustainedBaseline(ctx context.Context, rate int) (SustainedBaseline, error) {
	if err := b.reset(ctx); err != nil {
		return SustainedBaseline{}, err
	}
	secs := max(time.Second, b.cfg.SustainedDuration/10)
	before, err := b.sampleDBCPU(ctx)
	if err != nil {
		return SustainedBaseline{}, err
	}
	p := b.startProducer(ctx, rate, 0, b.cfg.Docs)
	if err := harness.Sleep(ctx, secs); err != nil {
		p.Stop()
		return SustainedBaseline{}, err
	}
	p.Stop()
	if err := p.Err(); err != nil {
		return SustainedBaseline{}, err
	}
	after, err := b.sampleDBCPU(ctx)
	if err != nil {
		return SustainedBaseline{}, err
	}
	n := p.Committed()
	return SustainedBaseline{Seconds: secs.Seconds(), Events: n, DatabaseCPUPerEv: perEvent(after.since(before), int(n))}, b.reset(ctx)
}

// sustainedState empties the outbox, then gives it run's state: a history
// of done rows with their ledger, or emptied and analyzed.
func (b *bench) sustainedState(ctx context.Context, run *SustainedRun) error {
	if err := b.reset(ctx); err != nil {
		return err
	}
	switch run.State {
	case "history":
		run.HistoryRows = b.cfg.SustainedHistory
		saved := b.cfg
		b.cfg.DoneRows, b.cfg.FailedRows = b.cfg.SustainedHistory, 0
		_, err := b.loadHistory(ctx)
		b.cfg = saved
		return err
	case "emptied":
		_, err := b.pool.Exec(ctx, `ANALYZE outbox_events`)
		return err
	}
	return nil
}

func (b *bench) sustainedRun(ctx context.Context, state string, rate int, base SustainedBaseline) (SustainedRun, error) {
	run := SustainedRun{State: state}
	if err := b.sustainedState(ctx, &run); err != nil {
		return run, err
	}
	r, err := b.startPair(ctx, "sustained-"+state)
	if err != nil {
		return run, err
	}
	cpuBefore, dbBefore := b.sampleCPU(), dbCPUSample(nil)
	if dbBefore, err = b.sampleDBCPU(ctx); err != nil {
		return run, err
	}
	start, err := harness.Now(ctx, b.pool)
	if err != nil {
		return run, err
	}
	statements := b.resetStatements(ctx)
	marks, produced, err := b.sustainedProduce(ctx, rate)
	if err != nil {
		return run, err
	}
	dbAfter, err := b.sampleDBCPU(ctx)
	if err != nil {
		return run, err
	}
	cpu := b.sampleCPU().since(cpuBefore)
	if run.ClaimP99ms, err = claimP99(r); err != nil {
		return run, err
	}
	if statements {
		var ms float64
		if run.Statements, ms, err = b.readStatements(ctx); err != nil {
			return run, err
		}
		run.StatementsPerEv = harness.Round3(perEvent(ms/1000, int(produced)))
	}
	b.stopReplicas()
	run.Events = produced
	run.DatabaseCPUPerEv = harness.Round3(perEvent(dbAfter.since(dbBefore), int(run.Events)) - base.DatabaseCPUPerEv)
	run.WlprojCPUPerEv = perEvent(cpu["wlproj"], int(run.Events))
	sustainedLag(&run, marks)
	return run, b.pool.QueryRow(ctx, `
		SELECT count(*) FROM outbox_events
		 WHERE created_at >= $1 AND error_history @> '[{"event": "stuck_reclaimed"}]'`, start).Scan(&run.LeaseExpiries)
}

// sustainedProduce runs the producer at rate for the run's duration,
// waits for the drain, and returns the events produced and the pair's lag
// histogram at the start and at the end of each third, the last one's
// after the drain.
func (b *bench) sustainedProduce(ctx context.Context, rate int) (marks []hist, produced int64, err error) {
	mark, err := b.scrapeLag()
	if err != nil {
		return nil, 0, err
	}
	marks = append(marks, mark)
	p := b.startProducer(ctx, rate, 1_000_000_000, b.cfg.Docs)
	defer p.Stop()
	start := time.Now()
	for i := 1; i <= 3; i++ {
		if err := harness.Sleep(ctx, time.Until(start.Add(time.Duration(i)*b.cfg.SustainedDuration/3))); err != nil {
			return nil, 0, err
		}
		if i == 3 {
			break
		}
		if mark, err = b.scrapeLag(); err != nil {
			return nil, 0, err
		}
		marks = append(marks, mark)
	}
	p.Stop()
	if err := p.Err(); err != nil {
		return nil, 0, err
	}
	if err := b.drained(ctx, int(p.Committed())); err != nil {
		return nil, 0, err
	}
	mark, err = b.scrapeLag()
	return append(marks, mark), p.Committed(), err
}

// sustainedLag reads the run's lag from the histograms at the start and
// the end of each third (sustainedProduce).
func sustainedLag(run *SustainedRun, marks []hist) {
	all := marks[len(marks)-1].since(marks[0])
	run.LagP50ms, run.LagP99ms = all.ms(0.5), all.ms(0.99)
	for i := range len(marks) - 1 {
		run.LagP99ByThird = append(run.LagP99ByThird, marks[i+1].since(marks[i]).ms(0.99))
	}
	if first := run.LagP99ByThird[0]; first > 0 {
		run.Flatness = harness.Round3(run.LagP99ByThird[2] / first)
	}
}

// claimP99 reads the leader's claim histogram (outbox_claim_duration_seconds)
// and returns the upper bound of the bucket holding its 99th percentile.
func claimP99(r *harness.Replica) (float64, error) {
	scrape, err := r.Scrape()
	if err != nil {
		return 0, err
	}
	q, err := harness.HistogramQuantile(scrape, "outbox_claim_duration_seconds", 0.99)
	if math.IsInf(q, 1) {
		// Past the top bucket (5 s): JSON has no infinity, and the top
		// bound fails the goal as well.
		q = 5
	}
	return round1(q * 1000), err
}
