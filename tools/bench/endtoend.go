package main

import (
	"context"
	"fmt"
	"time"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// 2. and 7. One real leader, its standby waiting, drains the same
// documents from the outbox.
func (b *bench) endToEnd(ctx context.Context) error {
	t, rss, err := b.e2eRun(ctx, b.cfg.CPUProfile)
	if err != nil {
		return err
	}
	b.rep.EndToEnd = t
	b.rep.Memory = &Memory{PeakRSSMB: round1(float64(rss) / (1 << 20))}
	b.say("end to end: %d events in %.2fs, %.0f events/s, leader peak RSS %.1f MB", b.cfg.Docs, t.Seconds, t.EventsPerSec, float64(rss)/(1<<20))
	return nil
}

// freshBacklog recreates the daemon's index empty, as the raw runs have
// theirs (an earlier step may have left documents in it), and writes the
// documents as pending events.
func (b *bench) freshBacklog(ctx context.Context) error {
	if err := b.deleteIndex(ctx, b.index); err != nil {
		return err
	}
	if err := b.createIndex(ctx, b.index); err != nil {
		return err
	}
	return b.backlog(ctx, "")
}

// startLeader starts the pair, waits until one leads and the other
// stands by, and returns the leader and when it took the lock, on
// Postgres' clock.
func (b *bench) startLeader(ctx context.Context, name string, extra ...string) (*harness.Replica, time.Time, error) {
	var t0 time.Time
	r, err := b.startPair(ctx, name, extra...)
	if err != nil {
		return nil, t0, err
	}
	err = b.pool.QueryRow(ctx, `SELECT acquired_at FROM outbox_leader WHERE name = $1`, b.index).Scan(&t0)
	return r, t0, err
}

// e2eRun loads the documents as queued events into a fresh index and times one leader
// draining them into the daemon's index, then checks the index and
// recreates it empty, with the same settings. It returns the drain and the
// leader's peak RSS; cpuProfile, if not empty, is where the leader's CPU
// profile goes.
func (b *bench) e2eRun(ctx context.Context, cpuProfile string) (*Throughput, int64, error) {
	if err := b.freshBacklog(ctx); err != nil {
		return nil, 0, err
	}
	cpu0 := b.sampleCPU()
	db0, err := b.sampleDBCPU(ctx)
	if err != nil {
		return nil, 0, err
	}
	var extra []string
	if cpuProfile != "" {
		extra = append(extra, "OUTBOX_PPROF=true")
	}
	r, t0, err := b.startLeader(ctx, "e2e", extra...)
	if err != nil {
		return nil, 0, err
	}
	profiled := make(chan error, 1)
	if cpuProfile != "" {
		go func() { profiled <- profile(ctx, r, cpuProfile, 10) }()
	}
	if err := waitProcessed(ctx, r, b.cfg.Docs, b.drainTimeout(b.cfg.Docs)); err != nil {
		return nil, 0, err
	}
	last, failed, err := b.waitDrained(ctx, stepTimeout)
	if err != nil {
		return nil, 0, err
	}
	rss, err := peakRSS(r.Pid())
	if err != nil {
		return nil, 0, err
	}
	cpu := b.sampleCPU().since(cpu0)
	db, err := b.sampleDBCPU(ctx)
	if err != nil {
		return nil, 0, err
	}
	if cpuProfile != "" {
		if err := <-profiled; err != nil {
			b.rep.Problem("cpu profile: " + err.Error())
		} else {
			b.rep.CPUProfile = cpuProfile
		}
	}
	b.stopReplicas()
	if failed > 0 {
		return nil, 0, fmt.Errorf("%d events failed", failed)
	}
	if err := b.checkAndEmptyIndex(ctx); err != nil {
		return nil, 0, err
	}
	t := newThroughput(b.cfg.Docs, last.Sub(t0).Seconds(), cpu)
	t.DatabaseCPUSeconds = db.since(db0)
	return t, rss, nil
}

// processedMetric counts the events the leader acked done.
const processedMetric = `outbox_processed_total{projection="search"}`

// waitProcessed waits until the leader r has acked n events, from its
// metrics, scraped every 200 ms to leave the leader's CPU to the drain (the
// drain's end is the last ack's time in the database anyway: lastAck).
//
// The drains of steps 2 and 3 are watched so (step 3 reads the loop's
// counter in process),
// not by polling the outbox: with the statistics of a full backlog the
// poll's EXISTS became a sequential scan past every row drained so far, 90
// ms every 20 ms at 200,000 rows, most of a core of the Postgres being
// measured; and a snapshot open nearly all the time keeps the claim's index
// scan from marking the entries of the rows claimed before it dead, so it
// read them all again at every claim.
func waitProcessed(ctx context.Context, r *harness.Replica, n int, timeout time.Duration) error {
	var acked float64
	err := harness.PollAt(ctx, 200*time.Millisecond, timeout, fmt.Sprintf("%s to ack %d events", r.Name, n),
		func(context.Context) (bool, error) {
			v, ok, err := r.Metric(processedMetric)
			acked = v
			return err == nil && ok && v >= float64(n), err
		})
	if err != nil {
		return fmt.Errorf("%w (%.0f acked)", err, acked)
	}
	return nil
}

// backlog empties the outbox and loads the documents as events of status
// (loadEvents: empty for the column's default).
func (b *bench) backlog(ctx context.Context, status string) error {
	if err := b.reset(ctx); err != nil {
		return err
	}
	if err := b.loadEvents(ctx, 0, b.cfg.Docs, status); err != nil {
		return err
	}
	return b.vacuum(ctx)
}

// checkAndEmptyIndex checks that the daemon's index holds every document,
// then empties it: the later steps write to an empty index, not to one
// still merging.
func (b *bench) checkAndEmptyIndex(ctx context.Context) error {
	n, err := harness.DocCount(ctx, b.cfg.ElasticURL, b.index)
	if err != nil {
		return err
	}
	if n != b.cfg.Docs {
		return fmt.Errorf("index holds %d documents, want %d", n, b.cfg.Docs)
	}
	if err := b.deleteIndex(ctx, b.index); err != nil {
		return err
	}
	return b.createIndex(ctx, b.index)
}
