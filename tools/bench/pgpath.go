package main

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"slices"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/wlproj/wlproj/consume"
	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
)

// ackSink acknowledges every event without sending it anywhere.
type ackSink struct {
	// latestOnly makes the sink stand in for the search index, which keeps
	// one version per document: the loop reads and moves the ledger for
	// its events as for the index's. Without it the sink keeps every event,
	// as the chronicle does, and the loop neither reads nor writes the
	// ledger for it.
	latestOnly bool
}

// LatestOnly implements projection.LatestOnly.
func (s *ackSink) LatestOnly() bool { return s.latestOnly }

func (s *ackSink) Handle(_ context.Context, events []outbox.Event) []projection.Result {
	results := make([]projection.Result, len(events))
	for i, e := range events {
		results[i].ID = e.ID
	}
	return results
}

// The variants of step 3, as the report names them.
const (
	pgBare     = "bare"
	pgLedger   = "ledger"
	pgNoLedger = "no_ledger"
)

// 3. What the daemon's claim and ack cost, with the ledger and without it,
// next to a bare SQL loop: the three in turn, every other round in reverse
// order, then the daemon once more at the bare loop's batch. A real
// replica stands by all along (standBy), as the pair's standby would
// beside the leader whose loop runs here in process: how it waits is the
// database's, and so the claims', business.
func (b *bench) postgresPath(ctx context.Context) error {
	stop, err := b.standBy(ctx, "pg-standby")
	if err != nil {
		return err
	}
	defer stop()
	pg := &PostgresPath{Batch: b.cfg.Batch, BareBatch: b.cfg.BareBatch,
		Bare: &Variant{Batch: b.cfg.BareBatch}, Ledger: &Variant{Batch: b.cfg.Batch}, NoLedger: &Variant{Batch: b.cfg.Batch}}
	variants := map[string]*Variant{pgBare: pg.Bare, pgLedger: pg.Ledger, pgNoLedger: pg.NoLedger}
	for round := range b.cfg.PGRounds {
		order := []string{pgBare, pgLedger, pgNoLedger}
		if round%2 == 1 {
			slices.Reverse(order)
		}
		got := map[string]*Throughput{}
		for _, v := range order {
			run, err := b.pgRun(ctx, v, b.cfg.Batch)
			if err != nil {
				return err
			}
			variants[v].Runs = append(variants[v].Runs, run)
			pg.Order = append(pg.Order, v)
			got[v] = run
		}
		rate := func(v string) float64 { return got[v].EventsPerSec }
		r := PGRound{LedgerToNoLedger: harness.Round3(rate(pgLedger) / rate(pgNoLedger)),
			LedgerToBare: harness.Round3(rate(pgLedger) / rate(pgBare)), NoLedgerToBare: harness.Round3(rate(pgNoLedger) / rate(pgBare)),
			LedgerDatabaseCPU: ratio(got[pgLedger].DatabaseCPUSeconds, got[pgNoLedger].DatabaseCPUSeconds)}
		pg.Rounds = append(pg.Rounds, r)
		b.say("postgres path, round %d: bare %.0f, daemon with ledger %.0f, without %.0f events/s: with/without %.3f, with/bare %.3f; database CPU with/without %.3f",
			round+1, rate(pgBare), rate(pgLedger), rate(pgNoLedger), r.LedgerToNoLedger, r.LedgerToBare, r.LedgerDatabaseCPU)
	}
	for _, v := range variants {
		v.finish()
	}
	if b.cfg.BareBatch != b.cfg.Batch {
		run, err := b.pgRun(ctx, pgLedger, b.cfg.BareBatch)
		if err != nil {
			return err
		}
		pg.AtBareBatch = run
	}
	b.rep.PostgresPath = pg
	return nil
}

// pgRun drains the backlog once with one variant of step 3, and checks that
// the ledger was written by the daemon with it and only then.
func (b *bench) pgRun(ctx context.Context, variant string, batch int) (*Throughput, error) {
	// The daemon drains queued rows, as an application writes them since
	// migration 00018; the bare loop is the classic SQL queue, claiming
	// and marking rows, so its backlog is pending rows.
	drain, status := b.bareLoop, statusPending
	if variant != pgBare {
		drain, status = func(ctx context.Context) (time.Time, error) { return b.daemonLoop(ctx, batch, variant == pgNoLedger) }, ""
	}
	run, err := b.drainWith(ctx, status, drain)
	if err != nil {
		return nil, fmt.Errorf("%s, batch %d: %w", variant, batch, err)
	}
	var entries int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_ledger_entries`).Scan(&entries); err != nil {
		return nil, err
	}
	if want := map[bool]int{true: b.cfg.Docs, false: 0}[variant == pgLedger]; entries != want {
		return nil, fmt.Errorf("%s, batch %d: %d ledger entries after the drain, want %d", variant, batch, entries, want)
	}
	if variant == pgBare {
		batch = b.cfg.BareBatch
	}
	run.Batch = batch
	b.say("postgres path: %s, batch %d: %.0f events/s", variant, batch, run.EventsPerSec)
	return run, nil
}

// drainWith loads the documents as events of status and times drain until
// every one is acked, on the bench's clock: from before it to the moment
// drain says its last ack returned. Both loops run in this process, and a
// queued row's ack leaves no time in the database without the ledger; the
// checkpoint's confirmed_at is up to a second late.
func (b *bench) drainWith(ctx context.Context, status string, drain func(context.Context) (time.Time, error)) (*Throughput, error) {
	if err := b.backlog(ctx, status); err != nil {
		return nil, err
	}
	cpu0 := b.sampleCPU()
	db0, err := b.sampleDBCPU(ctx)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	last, err := drain(ctx)
	if err != nil {
		return nil, err
	}
	_, failed, err := b.waitDrained(ctx, b.drainTimeout(b.cfg.Docs))
	if err != nil {
		return nil, err
	}
	cpu := b.sampleCPU().since(cpu0)
	db, err := b.sampleDBCPU(ctx)
	if err != nil {
		return nil, err
	}
	done, err := b.doneRows(ctx)
	if err != nil {
		return nil, err
	}
	if failed > 0 || done != int64(b.cfg.Docs) {
		return nil, fmt.Errorf("%d events done and %d failed, want %d done", done, failed, b.cfg.Docs)
	}
	secs := last.Sub(t0).Seconds()
	t := newThroughput(b.cfg.Docs, secs, cpu)
	t.DatabaseCPUSeconds = db.since(db0)
	return t, nil
}

// bareLoop is the reference: one connection, one transaction per batch
// that claims rows FOR UPDATE SKIP LOCKED (reading what a projection
// needs) and marks them done. It returns when its last commit returned.
func (b *bench) bareLoop(ctx context.Context) (last time.Time, err error) {
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		return last, err
	}
	defer conn.Release()
	for {
		n, err := b.bareBatch(ctx, conn.Conn())
		if err != nil || n == 0 {
			return last, err
		}
		last = time.Now()
	}
}

// bareBatch is one transaction of the bare loop; it returns the rows it
// marked done.
func (b *bench) bareBatch(ctx context.Context, conn *pgx.Conn) (int, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(ctx) }() // a no-op once committed
	rows, err := tx.Query(ctx, `
		SELECT id, projection, entity_type, entity_id, op, event_version, payload, scope_key, attempts, created_at
		  FROM outbox_events WHERE status = 'pending' AND next_retry_at <= now()
		 ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED`, b.cfg.BareBatch)
	if err != nil {
		return 0, err
	}
	var ids []int64
	for rows.Next() {
		var e outbox.Event
		var payload []byte
		if err := rows.Scan(&e.ID, &e.Projection, &e.EntityType, &e.EntityID, &e.Op, &e.EventVersion,
			&payload, &e.ScopeKey, &e.Attempts, &e.CreatedAt); err != nil {
			rows.Close()
			return 0, err
		}
		ids = append(ids, e.ID)
	}
	rows.Close()
	if err := rows.Err(); err != nil || len(ids) == 0 {
		return 0, err
	}
	if _, err := tx.Exec(ctx, `UPDATE outbox_events SET status = 'done', processed_at = now(), updated_at = now()
	                            WHERE id = ANY($1)`, ids); err != nil {
		return 0, err
	}
	return len(ids), tx.Commit(ctx)
}

// processedCounter is the in-process loop's count of acked events: the
// daemon's own outbox_processed_total, which the consume package keeps in
// this process's default metrics set.
func processedCounter() *metrics.Counter { return metrics.GetOrCreateCounter(processedMetric) }

// daemonLoop runs the daemon's consume loop in process, as leader of a
// name of its own, with the ackSink projection, until the outbox is empty,
// and returns when the ack of the last event returned (the processed
// counter, polled every millisecond: an atomic load); noLedger makes the
// sink a projection that keeps every event, for which the loop neither
// reads nor writes the ledger.
func (b *bench) daemonLoop(ctx context.Context, batch int, noLedger bool) (last time.Time, err error) {
	const name = "bench-pg"
	if _, err := b.pool.Exec(ctx, `INSERT INTO outbox_leader (name, holder, epoch) VALUES ($1, $1, 1)`, name); err != nil {
		return last, err
	}
	store := &outbox.Store{Pool: b.pool, Owner: name, LeaderName: name}
	sink := &ackSink{latestOnly: !noLedger}
	loop, err := consume.NewLoop(consume.Config{BulkSize: batch, Concurrency: b.cfg.Concurrency},
		store, projection.Registry{projection.SearchName: sink}, zerolog.Nop())
	if err != nil {
		return last, err
	}
	want := processedCounter().Get() + uint64(b.cfg.Docs)
	stopProfile, err := b.profileLoop()
	if err != nil {
		return last, err
	}
	defer stopProfile()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); loop.Run(runCtx, 1, nil) }()
	last, err = waitCounter(ctx, want, b.drainTimeout(b.cfg.Docs))
	if err == nil {
		// The loop saves its position within a second of going idle.
		_, _, err = b.waitDrained(ctx, stepTimeout)
	}
	stop()
	<-done
	return last, err
}

// profileLoop starts a CPU profile of this process, where the loop runs,
// when -loop-cpuprofile names a file: one file per drain, numbered in
// turn (PATH.1, PATH.2, ...). It returns what stops it.
func (b *bench) profileLoop() (func(), error) {
	if b.cfg.LoopCPUProfile == "" {
		return func() {}, nil
	}
	b.loopProfiles++
	f, err := os.Create(fmt.Sprintf("%s.%d", b.cfg.LoopCPUProfile, b.loopProfiles))
	if err != nil {
		return nil, fmt.Errorf("loop profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("loop profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}, nil
}

// waitCounter waits until the processed counter reaches want and returns
// when it saw it, checking every millisecond.
func waitCounter(ctx context.Context, want uint64, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	for {
		now := time.Now()
		if got := processedCounter().Get(); got >= want {
			return now, nil
		} else if now.After(deadline) {
			return now, fmt.Errorf("timed out after %s: the loop acked %d events short", timeout, want-got)
		}
		if err := harness.Sleep(ctx, time.Millisecond); err != nil {
			return now, err
		}
	}
}
