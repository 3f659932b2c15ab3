package main

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// The verdict of step 8: what a plateau and a steady claim mean.
const (
	plateauFactor   = 1.1
	claimP99Factor  = 1.5
	retentionRule   = "rows and bytes: the last third's max <= 1.1 x the middle third's max; claim p99 (of the claim statement, outbox_claim_duration_seconds, over a third's samples): the last third's <= 1.5 x the first third's"
	rotationsMetric = `outbox_events_rotations_total`
)

// 8. A pair with a short retention drains a steady producer; the outbox's
// rows and bytes should level off once its partitions rotate (each
// TRUNCATE drops half a retention of rows), and the read should not slow
// down as the table churns.
func (b *bench) retention(ctx context.Context) error {
	cfg := b.cfg
	if err := b.reset(ctx); err != nil {
		return err
	}
	if err := b.seedPrunable(ctx); err != nil {
		return err
	}
	rt := &Retention{Rate: cfg.RetentionRate, Seconds: cfg.RetentionDuration.Seconds(),
		RetentionSeconds: cfg.Retention.Seconds(), Docs: cfg.RetentionDocs, Seeded: cfg.RetentionSeed}
	if err := b.pool.QueryRow(ctx, `SELECT current_setting('autovacuum')`).Scan(&rt.Autovacuum); err != nil {
		return err
	}
	vacuums0, err := b.autovacuums(ctx)
	if err != nil {
		return err
	}
	r, err := b.startPair(ctx, "retention", "OUTBOX_RETENTION="+cfg.Retention.String())
	if err != nil {
		return err
	}

	t0, err := harness.Now(ctx, b.pool)
	if err != nil {
		return err
	}
	started := time.Now()
	p := b.startProducer(ctx, cfg.RetentionRate, 0, cfg.RetentionDocs)
	defer p.Stop()
	claims, acks, err := b.retentionSamples(ctx, r, rt, t0, vacuums0)
	if err != nil {
		return err
	}
	p.Stop()
	rt.ProducedSeconds = harness.Round3(time.Since(started).Seconds())
	if err := p.Err(); err != nil {
		return err
	}
	rt.Produced = p.Committed()
	if err := b.retentionTally(ctx, rt, vacuums0); err != nil {
		return err
	}
	b.stopReplicas()
	rt.Verdict = verdict(rt.Samples, claims, acks)
	b.rep.Retention = rt
	if v := rt.Verdict; v != nil {
		b.say("retention: rows last/middle third %.3f, bytes %.3f, claim p99 last/first third %.3f (%.1f / %.1f ms)",
			v.RowsRatio, v.BytesRatio, v.ClaimWaitP99Ratio, v.ClaimWaitP99LastMs, v.ClaimWaitP99FirstMs)
	}
	return nil
}

// retentionTally waits for the drain, checks that every row left is done
// (the rows gone went with their partitions), and counts the rows gone and
// the autovacuums since vacuums0.
func (b *bench) retentionTally(ctx context.Context, rt *Retention, vacuums0 int64) error {
	if err := b.drained(ctx, int(rt.Produced)); err != nil {
		return err
	}
	var rows, done int64
	err := b.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE status IN ('done', 'queued')) FROM outbox_events`).
		Scan(&rows, &done)
	if err != nil {
		return err
	}
	if rows != done {
		return fmt.Errorf("%d rows left, %d of them done", rows, done)
	}
	rt.Pruned = rt.Produced + int64(b.cfg.RetentionSeed) - rows
	vacuums, err := b.autovacuums(ctx)
	if err != nil {
		return err
	}
	rt.Autovacuums = vacuums - vacuums0
	return nil
}

// retentionSamples samples the outbox every -retention-sample for
// -retention-duration and returns each sample's claim statements and
// insert-to-ack times, as the pair's histograms observed them since the
// sample before.
func (b *bench) retentionSamples(ctx context.Context, r *harness.Replica, rt *Retention, t0 time.Time, vacuums0 int64) (claims, acks []hist, err error) {
	cfg := b.cfg
	prev, err := b.retentionMark()
	if err != nil {
		return nil, nil, err
	}
	tick := time.NewTicker(cfg.RetentionSample)
	defer tick.Stop()
	for range int(cfg.RetentionDuration / cfg.RetentionSample) {
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-tick.C:
		}
		s, at, err := b.retentionSample(ctx, r)
		if err != nil {
			return nil, nil, err
		}
		cur, err := b.retentionMark()
		if err != nil {
			return nil, nil, err
		}
		claim, ack := cur.claim.since(prev.claim), cur.lag.since(prev.lag)
		s.Acked, s.ClaimWaitP99Ms, s.AckP99Ms = int(ack.count()), claim.ms(0.99), ack.ms(0.99)
		s.T = harness.Round3(at.Sub(t0).Seconds())
		s.Autovacuums -= vacuums0
		prev = cur
		rt.Samples, claims, acks = append(rt.Samples, s), append(claims, claim), append(acks, ack)
		b.say("retention: t=%.0fs rows %d (backlog %d, dead ~%d), %.1f MB; ledger %d rows, %.1f MB; claim p99 %.1f ms, ack p99 %.1f ms over %d; rotations %d",
			s.T, s.Rows, s.Backlog, s.DeadRows, mb(s.Bytes), s.LedgerRows, mb(s.LedgerBytes), s.ClaimWaitP99Ms, s.AckP99Ms, s.Acked, s.Rotations)
	}
	return claims, acks, nil
}

// retentionMark is the pair's claim and insert-to-ack histograms now.
type retentionMark struct{ claim, lag hist }

func (b *bench) retentionMark() (m retentionMark, err error) {
	if m.claim, err = b.scrapeHists(claimMetric); err != nil {
		return m, err
	}
	m.lag, err = b.scrapeLag()
	return m, err
}

// seedPrunable writes -retention-seed done rows acked an hour before the
// retention ran out into the outbox's oldest partition, as a retention's
// history would be, for the leader's first rotation.
func (b *bench) seedPrunable(ctx context.Context) error {
	if b.cfg.RetentionSeed == 0 {
		return nil
	}
	_, err := b.pool.Exec(ctx, `
		INSERT INTO outbox_events (entity_type, entity_id, op, event_version, status, attempts,
		                           processed_at, created_at, updated_at, slot)
		SELECT 'book', 'seed-' || g, 'upsert', 1, 'done', 1, t, t, t, (SELECT (slot + 1) % 3 FROM outbox_events_rotation)
		  FROM generate_series(1, $1::int) g, (SELECT now() - make_interval(secs => $2 + 3600) AS t) age`,
		b.cfg.RetentionSeed, b.cfg.Retention.Seconds())
	return err
}

// retentionSample reads the outbox now, on the database's clock (at). A
// queued row's status stays queued when it is done: the done rows are
// the queued ones past every position (outbox_queue_backlog lists the
// others, in the same snapshot) and those a claim marked done.
func (b *bench) retentionSample(ctx context.Context, r *harness.Replica) (s RetentionSample, at time.Time, err error) {
	err = b.pool.QueryRow(ctx, `
		WITH queued AS (SELECT count(*) AS n FROM outbox_queue_backlog)
		SELECT count(*), count(*) FILTER (WHERE status IN ('done', 'queued')) - (SELECT n FROM queued),
		       count(*) FILTER (WHERE status IN ('pending', 'processing')) + (SELECT n FROM queued),
		       (SELECT sum(pg_total_relation_size(relid))::bigint FROM pg_partition_tree('outbox_events')),
		       (SELECT count(*) FROM outbox_ledger_entries),
		       (SELECT sum(pg_total_relation_size(relid))::bigint FROM pg_partition_tree('outbox_ledger')),
		       (SELECT sum(n_dead_tup)::bigint FROM pg_stat_user_tables
		         WHERE relid IN (SELECT relid FROM pg_partition_tree('outbox_events'))),
		       (SELECT sum(autovacuum_count)::bigint FROM pg_stat_user_tables
		         WHERE relid IN (SELECT relid FROM pg_partition_tree('outbox_events'))),
		       clock_timestamp()
		  FROM outbox_events`).
		Scan(&s.Rows, &s.DoneRows, &s.Backlog, &s.Bytes, &s.LedgerRows, &s.LedgerBytes, &s.DeadRows, &s.Autovacuums, &at)
	if err != nil {
		return s, at, err
	}
	s.Rotations, err = rotations(r)
	return s, at, err
}

// autovacuums is how many times autovacuum has vacuumed the outbox.
func (b *bench) autovacuums(ctx context.Context) (int64, error) {
	var n int64
	err := b.pool.QueryRow(ctx, `SELECT sum(autovacuum_count)::bigint FROM pg_stat_user_tables
		WHERE relid IN (SELECT relid FROM pg_partition_tree('outbox_events'))`).Scan(&n)
	return n, err
}

// rotations is the leader's count of the outbox's rotations.
func rotations(r *harness.Replica) (int64, error) {
	v, ok, err := r.Metric(rotationsMetric)
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, fmt.Errorf("%s serves no %s", r.Name, rotationsMetric)
	}
	return int64(v), nil
}

// verdict compares the thirds of the samples: rows and bytes of the last
// against the middle (the first holds the climb to the retention), the
// claim statement's p99 of the last against the first (before the table
// churned).
func verdict(samples []RetentionSample, claims, acks []hist) *RetentionVerdict {
	k := len(samples) / 3
	if k == 0 {
		return nil
	}
	middle, last := samples[k:len(samples)-k], samples[len(samples)-k:]
	peak := func(ss []RetentionSample, f func(RetentionSample) int64) int64 {
		var m int64
		for _, s := range ss {
			m = max(m, f(s))
		}
		return m
	}
	rows := func(s RetentionSample) int64 { return s.Rows }
	bytes := func(s RetentionSample) int64 { return s.Bytes }
	v := &RetentionVerdict{Rule: retentionRule,
		RowsMiddleMax: peak(middle, rows), RowsLastMax: peak(last, rows),
		BytesMiddleMax: peak(middle, bytes), BytesLastMax: peak(last, bytes),
		ClaimWaitP99FirstMs: sumHists(claims[:k]).ms(0.99),
		ClaimWaitP99LastMs:  sumHists(claims[len(claims)-k:]).ms(0.99),
		AckP99FirstMs:       sumHists(acks[:k]).ms(0.99),
		AckP99LastMs:        sumHists(acks[len(acks)-k:]).ms(0.99),
	}
	v.RowsRatio = ratio(float64(v.RowsLastMax), float64(v.RowsMiddleMax))
	v.BytesRatio = ratio(float64(v.BytesLastMax), float64(v.BytesMiddleMax))
	v.ClaimWaitP99Ratio = ratio(v.ClaimWaitP99LastMs, v.ClaimWaitP99FirstMs)
	return v
}

// ratio is a/b to 3 decimals; with nothing to compare to, +Inf would not
// encode as JSON, so it is a large number that fails every goal.
func ratio(a, b float64) float64 {
	if b <= 0 {
		return math.MaxInt32
	}
	return harness.Round3(a / b)
}
