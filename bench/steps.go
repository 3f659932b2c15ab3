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
	"github.com/wlproj/wlproj/internal/replica"
	"github.com/wlproj/wlproj/internal/rig"
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
	index := b.index + "-raw"
	if err := b.createIndex(ctx, index); err != nil {
		return err
	}
	client, err := projection.NewElasticClient(projection.ElasticOptions{URL: b.cfg.ElasticURL})
	if err != nil {
		return err
	}
	// A warm-up in an index of its own, so the engine's JIT and caches are
	// as warm for the baseline as they will be for the daemon after it.
	warm := b.index + "-warmup"
	if err := b.createIndex(ctx, warm); err != nil {
		return err
	}
	if _, err := sendBulks(ctx, client, warm, b.cfg.Docs, min(b.cfg.Docs/5, 20_000), b.cfg.Batch, b.cfg.Concurrency, b.cfg.DocBytes); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	if err := b.es(ctx, http.MethodDelete, "/"+warm, nil, nil); err != nil {
		return err
	}

	cpu0 := sampleCPU()
	secs, err := sendBulks(ctx, client, index, 0, b.cfg.Docs, b.cfg.Batch, b.cfg.Concurrency, b.cfg.DocBytes)
	if err != nil {
		return err
	}
	cpu := sampleCPU().since(cpu0)
	n, err := b.docCount(ctx, index)
	if err != nil {
		return err
	}
	if n != b.cfg.Docs {
		return fmt.Errorf("raw index holds %d documents, want %d", n, b.cfg.Docs)
	}
	if err := b.es(ctx, http.MethodDelete, "/"+index, nil, nil); err != nil {
		return err
	}
	b.rep.RawBulk = &Throughput{Events: b.cfg.Docs, Seconds: rig.Round3(secs), EventsPerSec: round1(float64(b.cfg.Docs) / secs), CPUSeconds: cpu}
	b.say("raw bulk: %d docs in %.2fs, %.0f docs/s", b.cfg.Docs, secs, float64(b.cfg.Docs)/secs)
	return nil
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
	if err := b.reset(ctx); err != nil {
		return err
	}
	if err := b.loadEvents(ctx, 0, b.cfg.Docs); err != nil {
		return err
	}
	if err := b.vacuum(ctx); err != nil {
		return err
	}
	cpu0 := sampleCPU()
	var extra []string
	if b.cfg.CPUProfile != "" {
		extra = append(extra, "OUTBOX_PPROF=true")
	}
	r, err := b.startReplica(ctx, "e2e", extra...)
	if err != nil {
		return err
	}
	if _, err := waitLeader(ctx, r); err != nil {
		return err
	}
	var t0 time.Time
	if err := b.pool.QueryRow(ctx, `SELECT acquired_at FROM outbox_leader WHERE name = $1`, b.leaderName).Scan(&t0); err != nil {
		return err
	}
	profiled := make(chan error, 1)
	if b.cfg.CPUProfile != "" {
		go func() { profiled <- profile(ctx, r, b.cfg.CPUProfile, 10) }()
	}
	last, failed, err := b.waitDrained(ctx, b.drainTimeout(b.cfg.Docs))
	if err != nil {
		return err
	}
	rss, err := peakRSS(r.Pid())
	if err != nil {
		return err
	}
	cpu := sampleCPU().since(cpu0)
	if b.cfg.CPUProfile != "" {
		if err := <-profiled; err != nil {
			b.rep.problem("cpu profile: " + err.Error())
		} else {
			b.rep.CPUProfile = b.cfg.CPUProfile
		}
	}
	b.stopReplicas()
	if failed > 0 {
		return fmt.Errorf("%d events failed", failed)
	}
	n, err := b.docCount(ctx, b.index)
	if err != nil {
		return err
	}
	if n != b.cfg.Docs {
		return fmt.Errorf("index holds %d documents, want %d", n, b.cfg.Docs)
	}
	// The later steps write to an empty index, not to one still merging.
	if err := b.es(ctx, http.MethodDelete, "/"+b.index, nil, nil); err != nil {
		return err
	}
	if err := b.createIndex(ctx, b.index); err != nil {
		return err
	}
	secs := last.Sub(t0).Seconds()
	b.rep.EndToEnd = &Throughput{Events: b.cfg.Docs, Seconds: rig.Round3(secs), EventsPerSec: round1(float64(b.cfg.Docs) / secs), CPUSeconds: cpu}
	b.rep.Memory = &Memory{PeakRSSMB: round1(float64(rss) / (1 << 20))}
	b.say("end to end: %d events in %.2fs, %.0f events/s, leader peak RSS %.1f MB", b.cfg.Docs, secs, float64(b.cfg.Docs)/secs, float64(rss)/(1<<20))
	return nil
}

// profile saves a CPU profile of the replica taken over seconds.
func profile(ctx context.Context, r *replica.Replica, path string, seconds int) error {
	u := "http://127.0.0.1:" + strconv.Itoa(r.HTTPPort) + "/debug/pprof/profile?seconds=" + strconv.Itoa(seconds)
	body, err := rig.Get(ctx, u)
	if err != nil {
		return err
	}
	defer body.Close()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, body); err != nil {
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

// ackSink acknowledges every event without sending it anywhere.
type ackSink struct{}

func (ackSink) Handle(_ context.Context, events []outbox.Event) []projection.Result {
	results := make([]projection.Result, len(events))
	for i, e := range events {
		results[i].ID = e.ID
	}
	return results
}

// 3. What the daemon's claim and ack cost, next to a bare SQL loop.
func (b *bench) postgresPath(ctx context.Context) error {
	pg := &PostgresPath{}
	bare, err := b.drainWith(ctx, b.bareLoop)
	if err != nil {
		return fmt.Errorf("bare loop: %w", err)
	}
	bare.Batch = b.cfg.BareBatch
	pg.Bare = bare
	for _, batch := range slices.Compact([]int{b.cfg.Batch, b.cfg.BareBatch}) {
		run, err := b.drainWith(ctx, func(ctx context.Context) error { return b.daemonLoop(ctx, batch) })
		if err != nil {
			return fmt.Errorf("daemon loop, batch %d: %w", batch, err)
		}
		run.Batch = batch
		pg.Daemon = append(pg.Daemon, run)
		b.say("postgres path: daemon loop, batch %d: %.0f events/s (bare loop, batch %d: %.0f)", batch, run.EventsPerSec, bare.Batch, bare.EventsPerSec)
	}
	b.rep.PostgresPath = pg
	return nil
}

// drainWith loads the documents as pending events and times drain until
// every one is done, from Postgres' clock before it to the last processed_at.
func (b *bench) drainWith(ctx context.Context, drain func(context.Context) error) (*Throughput, error) {
	if err := b.reset(ctx); err != nil {
		return nil, err
	}
	if err := b.loadEvents(ctx, 0, b.cfg.Docs); err != nil {
		return nil, err
	}
	if err := b.vacuum(ctx); err != nil {
		return nil, err
	}
	cpu0 := sampleCPU()
	t0, err := b.dbNow(ctx)
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
	var done int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_events WHERE status = 'done'`).Scan(&done); err != nil {
		return nil, err
	}
	if failed > 0 || done != b.cfg.Docs {
		return nil, fmt.Errorf("%d events done and %d failed, want %d done", done, failed, b.cfg.Docs)
	}
	secs := last.Sub(t0).Seconds()
	return &Throughput{Events: b.cfg.Docs, Seconds: rig.Round3(secs), EventsPerSec: round1(float64(b.cfg.Docs) / secs), CPUSeconds: cpu}, nil
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
// name of its own, with the ackSink projection, until the outbox is empty.
func (b *bench) daemonLoop(ctx context.Context, batch int) error {
	const name = "bench-pg"
	if _, err := b.pool.Exec(ctx, `INSERT INTO outbox_leader (name, holder, epoch) VALUES ($1, $1, 1)`, name); err != nil {
		return err
	}
	store := &outbox.Store{Pool: b.pool, Owner: name, LeaderName: name}
	loop, err := consume.NewLoop(consume.Config{BulkSize: batch, Concurrency: b.cfg.Concurrency},
		store, projection.Registry{"search": ackSink{}}, zerolog.Nop())
	if err != nil {
		return err
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); loop.Run(runCtx, 1, nil) }()
	_, _, err = b.waitDrained(ctx, b.drainTimeout(b.cfg.Docs))
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
	p := b.startProducer(ctx, b.cfg.Rate, b.cfg.Docs)
	if err := sleep(ctx, b.cfg.Duration); err != nil {
		return err
	}
	produced, perr := p.stop()
	if perr != nil {
		return perr
	}
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
	live := map[string]*replica.Replica{}
	var err error
	if live["a"], err = b.startReplica(ctx, "a"); err != nil {
		return err
	}
	if _, err := waitLeader(ctx, live["a"]); err != nil {
		return err
	}
	if live["b"], err = b.startReplica(ctx, "b"); err != nil {
		return err
	}
	p := b.startProducer(ctx, b.cfg.FailoverRate, b.cfg.Docs)
	stopped := false
	defer func() {
		if !stopped {
			_, _ = p.stop()
		}
	}()
	settle := time.Second
	if b.cfg.Smoke {
		settle = 300 * time.Millisecond
	}
	var samples []float64
	for round := range b.cfg.Failovers {
		if err := sleep(ctx, settle); err != nil {
			return err
		}
		l, err := waitLeader(ctx, live["a"], live["b"])
		if err != nil {
			return err
		}
		other := live["a"]
		if l == other {
			other = live["b"]
		}
		if err := b.waitStandby(ctx, other); err != nil {
			return err
		}
		killedAt, err := b.dbNow(ctx)
		if err != nil {
			return err
		}
		l.Kill()
		var at *time.Time
		err = poll(ctx, 30*time.Second, "the first ack of "+other.Name, func() (bool, error) {
			err := b.pool.QueryRow(ctx, `SELECT min(processed_at) FROM outbox_events
			                              WHERE status = 'done' AND processed_at > $1 AND locked_by = $2`, killedAt, other.Name).Scan(&at)
			return err == nil && at != nil, err
		})
		if err != nil {
			return fmt.Errorf("round %d: %w", round+1, err)
		}
		samples = append(samples, at.Sub(killedAt).Seconds())
		if live[l.Name], err = b.startReplica(ctx, l.Name); err != nil {
			return err
		}
	}
	produced, err := p.stop()
	stopped = true
	if err != nil {
		return err
	}
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
	b.rep.Failover = &Failover{Rounds: len(samples), Rate: b.cfg.FailoverRate, Seconds: rig.NewStats(samples)}
	b.say("failover: min %.3fs median %.3fs max %.3fs over %d kills", b.rep.Failover.Seconds.Min, b.rep.Failover.Seconds.Median, b.rep.Failover.Seconds.Max, len(samples))
	return nil
}

func (b *bench) waitStandby(ctx context.Context, r *replica.Replica) error {
	return poll(ctx, 30*time.Second, r.Name+" as standby", func() (bool, error) {
		h, err := r.Health()
		return err == nil && h.Role == "standby", nil
	})
}

// 6. Median claim time with only the pending rows, then with history.
func (b *bench) claimCost(ctx context.Context) error {
	cc := &ClaimCost{Batch: b.cfg.Batch, Samples: b.cfg.ClaimSamples, DoneRows: b.cfg.DoneRows, FailedRows: b.cfg.FailedRows}
	var err error
	if cc.EmptyMedianMs, err = b.claimMedian(ctx, false); err != nil {
		return err
	}
	if cc.ScaleMedianMs, err = b.claimMedian(ctx, true); err != nil {
		return err
	}
	if err := b.pool.QueryRow(ctx, `SELECT pg_total_relation_size('outbox_events')`).Scan(&cc.TableBytes); err != nil {
		return err
	}
	cc.Ratio = rig.Round3(cc.ScaleMedianMs / cc.EmptyMedianMs)
	b.rep.ClaimCost = cc
	b.say("claim cost: median %.2f ms empty, %.2f ms with %d done and %d failed rows: ratio %.2f",
		cc.EmptyMedianMs, cc.ScaleMedianMs, cc.DoneRows, cc.FailedRows, cc.Ratio)
	return nil
}

func (b *bench) claimMedian(ctx context.Context, history bool) (float64, error) {
	const name = "bench-claim"
	if err := b.reset(ctx); err != nil {
		return 0, err
	}
	if history {
		if err := b.loadHistory(ctx); err != nil {
			return 0, err
		}
	}
	pending := b.cfg.ClaimSamples * b.cfg.Batch
	if err := b.loadEvents(ctx, 0, pending); err != nil {
		return 0, err
	}
	if err := b.vacuum(ctx); err != nil {
		return 0, err
	}
	if _, err := b.pool.Exec(ctx, `INSERT INTO outbox_leader (name, holder, epoch) VALUES ($1, $1, 1)`, name); err != nil {
		return 0, err
	}
	store := &outbox.Store{Pool: b.pool, Owner: name, LeaderName: name}
	var times []float64
	for range b.cfg.ClaimSamples {
		start := time.Now()
		events, err := store.Claim(ctx, 1, b.cfg.Batch, time.Minute)
		elapsed := time.Since(start)
		if err != nil {
			return 0, err
		}
		if len(events) != b.cfg.Batch {
			return 0, fmt.Errorf("claimed %d events, want %d", len(events), b.cfg.Batch)
		}
		times = append(times, elapsed.Seconds()*1000)
		ids := make([]int64, len(events))
		for i, e := range events {
			ids[i] = e.ID
		}
		if _, err := store.AckDone(ctx, 1, ids); err != nil {
			return 0, err
		}
	}
	return rig.NewStats(times).Median, nil
}

// loadHistory writes the done and failed rows a long-running outbox keeps,
// with payloads of the same size as the live ones, in chunks so progress
// shows and no single transaction grows huge.
func (b *bench) loadHistory(ctx context.Context) error {
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
				return err
			}
			b.say("claim cost: %d of %d %s rows written", to, part.rows, part.status)
		}
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
