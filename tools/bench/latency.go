package main

import (
	"context"
	"fmt"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// 4. Insert-to-ack latency at a steady rate, drained by the pair.
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
	b.stopReplicas()
	var pct []float64
	var n int
	var maxSecs float64
	err := b.pool.QueryRow(ctx, `
		SELECT count(*), percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM processed_at - created_at)),
		       max(extract(epoch FROM processed_at - created_at))::float8
		  FROM outbox_events WHERE status = 'done'`).Scan(&n, &pct, &maxSecs)
	if err != nil {
		return err
	}
	if int64(n) != produced {
		return fmt.Errorf("%d events done, %d produced", n, produced)
	}
	// Where the time went: waiting to be claimed, then claimed to acked.
	var queued, worked []float64
	err = b.pool.QueryRow(ctx, `
		SELECT percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM processing_started_at - created_at)),
		       percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM processed_at - processing_started_at))
		  FROM outbox_events WHERE status = 'done'`).Scan(&queued, &worked)
	if err != nil {
		return err
	}
	b.rep.Latency = &Latency{Rate: b.cfg.Rate, Seconds: b.cfg.Duration.Seconds(), Events: n,
		P50ms: round1(pct[0] * 1000), P95ms: round1(pct[1] * 1000), P99ms: round1(pct[2] * 1000), MaxMs: round1(maxSecs * 1000),
		ClaimWaitP50ms: round1(queued[0] * 1000), ClaimWaitP99ms: round1(queued[1] * 1000),
		ClaimToAckP50ms: round1(worked[0] * 1000), ClaimToAckP99ms: round1(worked[1] * 1000)}
	b.say("latency at %d/s: p50 %.1f ms, p95 %.1f ms, p99 %.1f ms over %d events", b.cfg.Rate, pct[0]*1000, pct[1]*1000, pct[2]*1000, n)
	return nil
}
