package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/olivere/elastic/v7"
	"github.com/rs/zerolog"

	"github.com/wlproj/wlproj/consume"
	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
)

// drainTimeout is generous: a machine slower than 200 events/s is broken,
// not slow.
func (b *bench) drainTimeout(n int) time.Duration {
	return time.Minute + time.Duration(n)*5*time.Millisecond
}

// 1. The engine's own bulk rate with the daemon's request shape.
func (b *bench) rawBulk(ctx context.Context) error {
	client, err := projection.NewElasticClient(projection.ElasticOptions{URL: b.cfg.ElasticURL})
	if err != nil {
		return err
	}
	if err := b.warmUp(ctx, client); err != nil {
		return err
	}
	t, err := b.rawRun(ctx, client)
	if err != nil {
		return err
	}
	b.rep.RawBulk = t
	b.say("raw bulk: %d docs in %.2fs, %.0f docs/s", b.cfg.Docs, t.Seconds, t.EventsPerSec)
	return nil
}

// warmUp indexes a fifth of the documents (20,000 at most) into an index
// of its own, so the engine's JIT and caches are as warm for the baseline
// as they will be for the daemon after it.
func (b *bench) warmUp(ctx context.Context, client *elastic.Client) error {
	warm := b.index + "-warmup"
	if err := b.createIndex(ctx, warm); err != nil {
		return err
	}
	if _, err := sendBulks(ctx, client, warm, b.cfg.Docs, min(b.cfg.Docs/5, 20_000), b.cfg.Batch, b.cfg.Concurrency, b.cfg.DocBytes); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	return b.deleteIndex(ctx, warm)
}

// rawRun bulk-loads the documents into a fresh index created with the
// daemon's index settings, checks the count and deletes it.
func (b *bench) rawRun(ctx context.Context, client *elastic.Client) (*Throughput, error) {
	index := b.index + "-raw"
	if err := b.createIndex(ctx, index); err != nil {
		return nil, err
	}
	cpu0 := sampleCPU()
	secs, err := sendBulks(ctx, client, index, 0, b.cfg.Docs, b.cfg.Batch, b.cfg.Concurrency, b.cfg.DocBytes)
	if err != nil {
		return nil, err
	}
	cpu := sampleCPU().since(cpu0)
	n, err := harness.DocCount(ctx, b.cfg.ElasticURL, index)
	if err != nil {
		return nil, err
	}
	if n != b.cfg.Docs {
		return nil, fmt.Errorf("raw index holds %d documents, want %d", n, b.cfg.Docs)
	}
	if err := b.deleteIndex(ctx, index); err != nil {
		return nil, err
	}
	return newThroughput(b.cfg.Docs, secs, cpu), nil
}

// sendBulks indexes documents first..first+n-1 into index with the
// daemon's request shape, concurrency bulks in flight, and returns the
// seconds it took; the documents are built before the clock starts.
func sendBulks(ctx context.Context, client *elastic.Client, index string, first, n, batch, concurrency, docBytes int) (float64, error) {
	var batches [][]elastic.BulkableRequest
	for start := first; start < first+n; start += batch {
		var reqs []elastic.BulkableRequest
		for i := start; i < min(start+batch, first+n); i++ {
			reqs = append(reqs, elastic.NewBulkIndexRequest().Id(projection.DocumentID("book", entityID(i))).
				Version(1).VersionType("external_gte").Doc(json.RawMessage(doc(i, docBytes))))
		}
		batches = append(batches, reqs)
	}
	jobs := make(chan []elastic.BulkableRequest)
	var failed atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	for range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for reqs := range jobs {
				resp, err := client.Bulk().Index(index).Add(reqs...).Do(ctx)
				if err != nil {
					once.Do(func() { firstErr = err })
					failed.Add(int64(len(reqs)))
					continue
				}
				failed.Add(int64(len(resp.Failed())))
			}
		}()
	}
	for _, reqs := range batches {
		jobs <- reqs
	}
	close(jobs)
	wg.Wait()
	secs := time.Since(start).Seconds()
	if firstErr != nil {
		return 0, firstErr
	}
	if failed.Load() > 0 {
		return 0, fmt.Errorf("%d documents refused by the engine", failed.Load())
	}
	return secs, nil
}

// 2. and 7. One real leader drains the same documents from the outbox.
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
	return b.backlog(ctx)
}

// startLeader starts a replica, waits until it leads and returns when it
// took the lock, on Postgres' clock.
func (b *bench) startLeader(ctx context.Context, name string, extra ...string) (*harness.Replica, time.Time, error) {
	var t0 time.Time
	r, err := b.startReplica(ctx, name, extra...)
	if err != nil {
		return nil, t0, err
	}
	if _, err := waitLeader(ctx, r); err != nil {
		return nil, t0, err
	}
	err = b.pool.QueryRow(ctx, `SELECT acquired_at FROM outbox_leader WHERE name = $1`, b.index).Scan(&t0)
	return r, t0, err
}

// e2eRun loads the documents as pending events into a fresh index and times one leader
// draining them into the daemon's index, then checks the index and
// recreates it empty, with the same settings. It returns the drain and the
// leader's peak RSS; cpuProfile, if not empty, is where the leader's CPU
// profile goes.
func (b *bench) e2eRun(ctx context.Context, cpuProfile string) (*Throughput, int64, error) {
	if err := b.freshBacklog(ctx); err != nil {
		return nil, 0, err
	}
	cpu0 := sampleCPU()
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
	cpu := sampleCPU().since(cpu0)
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

// 9. The throughput comparison repeated: raw bulk and end to end in turn
// (ABAB), -pairs times, after one warm-up, each run into a fresh index
// created with the same settings; the median ratio and its spread, and
// the CPU per event of the daemon and of Postgres for the end-to-end runs.
func (b *bench) pairs(ctx context.Context) error {
	client, err := projection.NewElasticClient(projection.ElasticOptions{URL: b.cfg.ElasticURL})
	if err != nil {
		return err
	}
	if err := b.warmUp(ctx, client); err != nil {
		return err
	}
	c := &Comparison{}
	for i := range b.cfg.Pairs {
		raw, err := b.rawRun(ctx, client)
		if err != nil {
			return fmt.Errorf("pair %d, raw: %w", i+1, err)
		}
		e2e, _, err := b.e2eRun(ctx, "")
		if err != nil {
			return fmt.Errorf("pair %d, end to end: %w", i+1, err)
		}
		p := Pair{Raw: raw, EndToEnd: e2e, Ratio: harness.Round3(e2e.EventsPerSec / raw.EventsPerSec),
			WlprojMicrosPerEvent:      perEvent(e2e.CPUSeconds["wlproj"], e2e.Events),
			PostgresMicrosPerEvent:    perEvent(e2e.DatabaseCPUSeconds, e2e.Events),
			PostgresAllMicrosPerEvent: perEvent(e2e.CPUSeconds["postgres"], e2e.Events)}
		c.Pairs = append(c.Pairs, p)
		b.say("pair %d: raw %.0f/s, end to end %.0f/s, ratio %.3f; wlproj %.1f µs/event, its database %.1f µs/event",
			i+1, raw.EventsPerSec, e2e.EventsPerSec, p.Ratio, p.WlprojMicrosPerEvent, p.PostgresMicrosPerEvent)
	}
	b.rep.Comparison = c
	return nil
}

// perEvent is CPU seconds over events, in microseconds.
func perEvent(secs float64, events int) float64 {
	if events == 0 {
		return 0
	}
	return round1(secs * 1e6 / float64(events))
}

// processedMetric counts the events the leader acked done.
const processedMetric = `outbox_processed_total{projection="search"}`

// waitProcessed waits until the leader r has acked n events, from its
// metrics, scraped every 200 ms to leave the leader's CPU to the drain (the
// drain's end is the last processed_at anyway).
//
// The drains of steps 2 and 3 are watched so (step 3 counts in its sink),
// not by polling the outbox: with the statistics of a full backlog the
// poll's EXISTS became a sequential scan past every row drained so far, 90
// ms every 20 ms at 200,000 rows, most of a core of the Postgres being
// measured; and a snapshot open nearly all the time keeps the claim's index
// scan from marking the entries of the rows claimed before it dead, so it
// read them all again at every claim.
func waitProcessed(ctx context.Context, r *harness.Replica, n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		v, ok, err := r.Metric(processedMetric)
		switch {
		case err == nil && ok && v >= float64(n):
			return nil
		case time.Now().After(deadline):
			return fmt.Errorf("timed out after %s waiting for %s to ack %d events (%.0f acked, last error: %v)", timeout, r.Name, n, v, err)
		}
		if err := harness.Sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}

// backlog empties the outbox and loads the documents as pending events.
func (b *bench) backlog(ctx context.Context) error {
	if err := b.reset(ctx); err != nil {
		return err
	}
	if err := b.loadEvents(ctx, 0, b.cfg.Docs); err != nil {
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

// profile saves a CPU profile of the replica taken over seconds.
func profile(ctx context.Context, r *harness.Replica, path string, seconds int) error {
	u := "http://127.0.0.1:" + strconv.Itoa(r.HTTPPort) + "/debug/pprof/profile?seconds=" + strconv.Itoa(seconds)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// peakRSS is VmHWM of a live process, in bytes.
func peakRSS(pid int) (int64, error) {
	status, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	var kb int64
	for _, line := range strings.Split(string(status), "\n") {
		if _, err := fmt.Sscanf(line, "VmHWM: %d kB", &kb); err == nil {
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/%d/status", pid)
}

// ackSink acknowledges every event without sending it anywhere, and counts
// them.
type ackSink struct {
	handled atomic.Int64
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
	s.handled.Add(int64(len(events)))
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
// order, then the daemon once more at the bare loop's batch.
func (b *bench) postgresPath(ctx context.Context) error {
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
	drain := b.bareLoop
	if variant != pgBare {
		drain = func(ctx context.Context) error { return b.daemonLoop(ctx, batch, variant == pgNoLedger) }
	}
	run, err := b.drainWith(ctx, drain)
	if err != nil {
		return nil, fmt.Errorf("%s, batch %d: %w", variant, batch, err)
	}
	var entries int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_applied`).Scan(&entries); err != nil {
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

// drainWith loads the documents as pending events and times drain until
// every one is done, from Postgres' clock before it to the last processed_at.
func (b *bench) drainWith(ctx context.Context, drain func(context.Context) error) (*Throughput, error) {
	if err := b.backlog(ctx); err != nil {
		return nil, err
	}
	cpu0 := sampleCPU()
	db0, err := b.sampleDBCPU(ctx)
	if err != nil {
		return nil, err
	}
	t0, err := harness.Now(ctx, b.pool)
	if err != nil {
		return nil, err
	}
	if err := drain(ctx); err != nil {
		return nil, err
	}
	last, failed, err := b.waitDrained(ctx, b.drainTimeout(b.cfg.Docs))
	if err != nil {
		return nil, err
	}
	cpu := sampleCPU().since(cpu0)
	db, err := b.sampleDBCPU(ctx)
	if err != nil {
		return nil, err
	}
	var done int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_events WHERE status = 'done'`).Scan(&done); err != nil {
		return nil, err
	}
	if failed > 0 || done != b.cfg.Docs {
		return nil, fmt.Errorf("%d events done and %d failed, want %d done", done, failed, b.cfg.Docs)
	}
	secs := last.Sub(t0).Seconds()
	t := newThroughput(b.cfg.Docs, secs, cpu)
	t.DatabaseCPUSeconds = db.since(db0)
	return t, nil
}

// bareLoop is the reference: one connection, one transaction per batch
// that claims rows FOR UPDATE SKIP LOCKED (reading what a projection
// needs) and marks them done.
func (b *bench) bareLoop(ctx context.Context) error {
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	for {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `
			SELECT id, projection, entity_type, entity_id, op, event_version, payload, scope_key, attempts, created_at
			  FROM outbox_events WHERE status = 'pending' AND next_retry_at <= now()
			 ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED`, b.cfg.BareBatch)
		if err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
		var ids []int64
		for rows.Next() {
			var e outbox.Event
			var payload []byte
			if err := rows.Scan(&e.ID, &e.Projection, &e.EntityType, &e.EntityID, &e.Op, &e.EventVersion,
				&payload, &e.ScopeKey, &e.Attempts, &e.CreatedAt); err != nil {
				rows.Close()
				_ = tx.Rollback(ctx)
				return err
			}
			ids = append(ids, e.ID)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
		if len(ids) == 0 {
			return tx.Rollback(ctx)
		}
		if _, err := tx.Exec(ctx, `UPDATE outbox_events SET status = 'done', processed_at = now(), updated_at = now()
		                            WHERE id = ANY($1)`, ids); err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
	}
}

// daemonLoop runs the daemon's consume loop in process, as leader of a
// name of its own, with the ackSink projection, until the outbox is empty;
// noLedger makes the sink a projection that keeps every event, for which the
// loop neither reads nor writes the ledger.
func (b *bench) daemonLoop(ctx context.Context, batch int, noLedger bool) error {
	const name = "bench-pg"
	if _, err := b.pool.Exec(ctx, `INSERT INTO outbox_leader (name, holder, epoch) VALUES ($1, $1, 1)`, name); err != nil {
		return err
	}
	store := &outbox.Store{Pool: b.pool, Owner: name, LeaderName: name}
	sink := &ackSink{latestOnly: !noLedger}
	loop, err := consume.NewLoop(consume.Config{BulkSize: batch, Concurrency: b.cfg.Concurrency},
		store, projection.Registry{projection.SearchName: sink}, zerolog.Nop())
	if err != nil {
		return err
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); loop.Run(runCtx, 1, nil) }()
	err = harness.Poll(ctx, b.drainTimeout(b.cfg.Docs), "the sink to see every event", func(context.Context) (bool, error) {
		return sink.handled.Load() >= int64(b.cfg.Docs), nil
	})
	if err == nil {
		_, _, err = b.waitDrained(ctx, stepTimeout)
	}
	stop()
	<-done
	return err
}

// 4. Insert-to-ack latency at a steady rate.
func (b *bench) latency(ctx context.Context) error {
	if err := b.reset(ctx); err != nil {
		return err
	}
	r, err := b.startReplica(ctx, "latency")
	if err != nil {
		return err
	}
	if _, err := waitLeader(ctx, r); err != nil {
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
	if _, failed, err := b.waitDrained(ctx, b.drainTimeout(int(produced))); err != nil {
		return err
	} else if failed > 0 {
		return fmt.Errorf("%d events failed", failed)
	}
	b.stopReplicas()
	var pct []float64
	var n int
	var maxSecs float64
	err = b.pool.QueryRow(ctx, `
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

// 5. kill -9 the leader of two replicas under load; time to the other's
// first ack.
func (b *bench) failover(ctx context.Context) error {
	if err := b.reset(ctx); err != nil {
		return err
	}
	live := map[string]*harness.Replica{}
	for _, name := range []string{"a", "b"} {
		r, err := b.startReplica(ctx, name)
		if err != nil {
			return err
		}
		live[name] = r
	}
	p := b.startProducer(ctx, b.cfg.FailoverRate, b.cfg.Docs, 0)
	defer p.Stop()
	var samples []float64
	for round := range b.cfg.Failovers {
		secs, err := b.failoverRound(ctx, live)
		if err != nil {
			return fmt.Errorf("round %d: %w", round+1, err)
		}
		samples = append(samples, secs)
	}
	p.Stop()
	if err := p.Err(); err != nil {
		return err
	}
	produced := p.Committed()
	_, failed, err := b.waitDrained(ctx, b.drainTimeout(int(produced)))
	if err != nil {
		return err
	}
	b.stopReplicas()
	var done int64
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_events WHERE status = 'done'`).Scan(&done); err != nil {
		return err
	}
	if failed > 0 || done != produced {
		return fmt.Errorf("after the failovers %d events done and %d failed, %d produced", done, failed, produced)
	}
	b.rep.Failover = &Failover{Rounds: len(samples), Rate: b.cfg.FailoverRate, Seconds: harness.NewStats(samples)}
	b.say("failover: min %.3fs median %.3fs max %.3fs over %d kills", b.rep.Failover.Seconds.Min, b.rep.Failover.Seconds.Median, b.rep.Failover.Seconds.Max, len(samples))
	return nil
}

// failoverRound kills the leader once its standby is ready, returns the
// seconds from the kill to the standby's first ack, and restarts the
// killed one.
func (b *bench) failoverRound(ctx context.Context, live map[string]*harness.Replica) (float64, error) {
	settle := time.Second
	if b.cfg.Smoke {
		settle = 300 * time.Millisecond
	}
	if err := harness.Sleep(ctx, settle); err != nil {
		return 0, err
	}
	l, err := waitLeader(ctx, live["a"], live["b"])
	if err != nil {
		return 0, err
	}
	other := map[string]*harness.Replica{"a": live["b"], "b": live["a"]}[l.Name]
	if err := b.waitStandby(ctx, other); err != nil {
		return 0, err
	}
	killedAt, err := harness.Now(ctx, b.pool)
	if err != nil {
		return 0, err
	}
	l.Kill()
	at, err := harness.WaitFirstAck(ctx, stepTimeout, b.pool, killedAt, other.Name)
	if err != nil {
		return 0, err
	}
	if live[l.Name], err = b.startReplica(ctx, l.Name); err != nil {
		return 0, err
	}
	return at.Sub(killedAt).Seconds(), nil
}

// 6. Median claim time with only the pending rows, then with history.
func (b *bench) claimCost(ctx context.Context) error {
	cc := &ClaimCost{Batch: b.cfg.Batch, Samples: b.cfg.ClaimSamples, DoneRows: b.cfg.DoneRows, FailedRows: b.cfg.FailedRows}
	var err error
	if cc.EmptyMedianMs, _, err = b.claimMedian(ctx, false); err != nil {
		return err
	}
	if cc.ScaleMedianMs, cc.LedgerRows, err = b.claimMedian(ctx, true); err != nil {
		return err
	}
	if err := b.pool.QueryRow(ctx, `SELECT pg_total_relation_size('outbox_events')`).Scan(&cc.TableBytes); err != nil {
		return err
	}
	cc.Ratio = harness.Round3(cc.ScaleMedianMs / cc.EmptyMedianMs)
	b.rep.ClaimCost = cc
	b.say("claim cost: median %.2f ms empty, %.2f ms with %d done and %d failed rows: ratio %.2f",
		cc.EmptyMedianMs, cc.ScaleMedianMs, cc.DoneRows, cc.FailedRows, cc.Ratio)
	return nil
}

// claimMedian is the median time of one claim, and the ledger entries of
// the history.
func (b *bench) claimMedian(ctx context.Context, history bool) (median float64, ledger int64, err error) {
	const name = "bench-claim"
	if err := b.reset(ctx); err != nil {
		return 0, 0, err
	}
	if history {
		if ledger, err = b.loadHistory(ctx); err != nil {
			return 0, 0, err
		}
	}
	pending := b.cfg.ClaimSamples * b.cfg.Batch
	if err := b.loadEvents(ctx, 0, pending); err != nil {
		return 0, 0, err
	}
	if err := b.vacuum(ctx); err != nil {
		return 0, 0, err
	}
	if _, err := b.pool.Exec(ctx, `INSERT INTO outbox_leader (name, holder, epoch) VALUES ($1, $1, 1)`, name); err != nil {
		return 0, 0, err
	}
	store := &outbox.Store{Pool: b.pool, Owner: name, LeaderName: name}
	var times []float64
	for range b.cfg.ClaimSamples {
		start := time.Now()
		events, err := store.Claim(ctx, 1, b.cfg.Batch, time.Minute, []string{projection.SearchName})
		elapsed := time.Since(start)
		if err != nil {
			return 0, 0, err
		}
		if len(events) != b.cfg.Batch {
			return 0, 0, fmt.Errorf("claimed %d events, want %d", len(events), b.cfg.Batch)
		}
		times = append(times, elapsed.Seconds()*1000)
		ids := make([]int64, len(events))
		for i, e := range events {
			ids[i] = e.ID
		}
		if _, err := store.AckDone(ctx, 1, events[0].Claim, ids, ids); err != nil {
			return 0, 0, err
		}
	}
	return harness.NewStats(times).Median, ledger, nil
}

// loadHistory writes the done and failed rows a long-running outbox keeps,
// with payloads of the same size as the live ones, in chunks so progress
// shows and no single transaction grows huge.
func (b *bench) loadHistory(ctx context.Context) (ledger int64, err error) {
	const chunk = 250_000
	reps := max(1, b.cfg.DocBytes/33)
	for _, part := range []struct {
		status string
		rows   int
	}{{"done", b.cfg.DoneRows}, {"failed", b.cfg.FailedRows}} {
		for from := 0; from < part.rows; from += chunk {
			to := min(from+chunk, part.rows)
			if _, err := b.pool.Exec(ctx, `
				INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload, status, attempts,
				                           processed_at, error_class, error_reason, last_error, created_at, updated_at)
				SELECT 'book', 'h' || g, 'upsert', 1,
				       jsonb_build_object('kind', 'book', 'title', 'Book ' || g, 'body', repeat(md5(g::text) || ' ', $3)),
				       $4, 1,
				       CASE WHEN $4 = 'done' THEN now() END,
				       CASE WHEN $4 = 'failed' THEN 'deterministic' END,
				       CASE WHEN $4 = 'failed' THEN 'mapping_error' END,
				       CASE WHEN $4 = 'failed' THEN 'strict_dynamic_mapping_exception: mapping set to strict' END,
				       now() - interval '1 day', now() - interval '1 day'
				  FROM generate_series($1::int, $2::int - 1) g`, from, to, reps, part.status); err != nil {
				return 0, err
			}
			b.say("claim cost: %d of %d %s rows written", to, part.rows, part.status)
		}
	}
	// The claim reads each document's ledger entry: a real outbox's history
	// comes with one per document applied, as the ledger's backfill writes
	// them (the claimed documents are new: no entry, in both table states).
	tag, err := b.pool.Exec(ctx, `
		INSERT INTO outbox_applied (projection, entity_type, entity_id, version, deleted, event_id, applied_at)
		SELECT projection, entity_type, entity_id, coalesce(event_version, id), op = 'delete', id, processed_at
		  FROM outbox_events WHERE status = 'done'`)
	return tag.RowsAffected(), err
}
