package main

import (
	"context"
	"fmt"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// 4. Insert-to-ack latency at a steady rate, drained by the pair. The
// percentiles come from the pair's histograms (lag.go), scraped once the
// outbox is drained: the pair starts with the step, so they hold this
// step's events alone.
func (b *bench) latency(ctx context.Context) error {
	if err := b.reset(ctx); err != nil {
		return err
	}
	if _, err := b.startPair(ctx, "latency"); err != nil {
		return err
	}
	p := b.startProducer(ctx, b.cfg.Rate, b.cfg.Docs, 0)
	defer p.Stop()
	if err := harness.Sleep(ctx, b.cfg.Duration); err != nil {
		return err
	}
	p.Stop()
	if err := p.Err(); err != nil {
		return err
	}
	produced := p.Committed()
	if err := b.drained(ctx, int(produced)); err != nil {
		return err
	}
	hists := map[string]hist{}
	for _, name := range []string{latencyMetric, claimMetric, batchMetric} {
		h, err := b.scrapeHists(name)
		if err != nil {
			return err
		}
		hists[name] = h
	}
	b.stopReplicas()
	lag := hists[latencyMetric]
	n := int(lag.count())
	if int64(n) != produced {
		return fmt.Errorf("%d events acked, %d produced", n, produced)
	}
	b.rep.Latency = latencyReport(b.cfg, lag, hists[claimMetric], hists[batchMetric])
	l := b.rep.Latency
	b.say("latency at %d/s: p50 %.1f ms, p95 %.1f ms, p99 %.1f ms over %d events", b.cfg.Rate, l.P50ms, l.P95ms, l.P99ms, n)
	return nil
}

// latencyReport reads step 4's figures from the histograms. Where the
// time went was read per row (insert to claim, claim to ack) before queued
// rows kept no claim time: the split is now the claim statement's time
// and the batch's, from claim to ack (see Latency).
func latencyReport(cfg Config, lag, claim, batch hist) *Latency {
	return &Latency{Rate: cfg.Rate, Seconds: cfg.Duration.Seconds(), Events: int(lag.count()),
		P50ms: lag.ms(0.5), P95ms: lag.ms(0.95), P99ms: lag.ms(0.99), MaxMs: round1(lag.max() * 1000),
		ClaimWaitP50ms: claim.ms(0.5), ClaimWaitP99ms: claim.ms(0.99),
		ClaimToAckP50ms: batch.ms(0.5), ClaimToAckP99ms: batch.ms(0.99)}
}
