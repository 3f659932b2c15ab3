package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/olivere/elastic/v7"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/projection"
	"github.com/wlproj/wlproj/rebuild"
)

// rebuildLiveRate is the live events a second the daemon drains while the
// rebuild runs.
const rebuildLiveRate = 500

// RebuildResult is the rebuild step: the source table bulk-loaded into a
// new index while a leader drains live events, next to the raw _bulk rate
// of the same documents, and what readers of the alias saw.
type RebuildResult struct {
	Rows int `json:"rows"`
	// LoadSeconds is the bulk load alone; TotalSeconds adds the wait for
	// the leader's dual-write confirmation, the refresh and the swap.
	LoadSeconds  float64 `json:"load_seconds"`
	TotalSeconds float64 `json:"total_seconds"`
	RowsPerSec   float64 `json:"rows_per_second"`
	// RawPerSec is raw _bulk of the same documents on a quiet stack.
	RawPerSec float64 `json:"raw_bulk_per_second"`
	// Ratio is RowsPerSec / RawPerSec; the goal is at least 0.8.
	Ratio float64 `json:"ratio"`
	// RawUnderLivePerSec is raw _bulk of the same documents while the
	// leader drains the same live events, the mean of one run just before
	// the rebuild and one just after. The machine's cores are shared, so
	// RatioUnderLive (RowsPerSec / it) is the rebuild's own cost.
	RawUnderLivePerSec float64 `json:"raw_bulk_under_live_per_second"`
	RatioUnderLive     float64 `json:"ratio_under_live"`
	// LoadCPUSeconds is what each role used during the load: the loader
	// runs in the bench, the leader (wlproj) drains the live events.
	LoadCPUSeconds map[string]float64 `json:"load_cpu_seconds"`
	LiveEvents     int64              `json:"live_events"`
	Reads          int64              `json:"reads"`
	ReadsFailed    int                `json:"reads_failed"`
	// ReadsMissing counts reads that saw fewer documents than an earlier
	// one (the live events never delete).
	ReadsMissing int    `json:"reads_missing"`
	Verdict      string `json:"verdict"`
}

// rebuildStep runs the rebuild measure; the caller stores the result.
func (b *bench) rebuildStep(ctx context.Context) (*RebuildResult, error) {
	n := cmp.Or(b.cfg.RebuildRows, b.cfg.Docs)
	alias, raw := b.index+"-rb", b.index+"-rb-raw"
	defer func() {
		_ = harness.DeleteIndex(context.WithoutCancel(ctx), b.cfg.ElasticURL, alias+"-*", raw)
	}()
	if err := b.reset(ctx); err != nil {
		return nil, err
	}
	client, err := projection.NewElasticClient(projection.ElasticOptions{URL: b.cfg.ElasticURL})
	if err != nil {
		return nil, err
	}
	res := &RebuildResult{Rows: n}
	if err := b.rebuildSource(ctx, n); err != nil {
		return nil, err
	}
	if err := b.createIndex(ctx, raw); err != nil {
		return nil, err
	}
	secs, err := sendBulks(ctx, client, raw, 0, n, b.cfg.Batch, b.cfg.Concurrency, b.cfg.DocBytes)
	if err != nil {
		return nil, err
	}
	res.RawPerSec = float64(n) / secs
	if err := b.deleteIndex(ctx, raw); err != nil {
		return nil, err
	}
	// The index readers use before the rebuild: the same documents, behind the alias.
	if err := b.rebuildAlias(ctx, client, alias, n); err != nil {
		return nil, err
	}
	defer b.stopReplicas()
	if _, err := b.startPair(ctx, "rebuild", "ELASTIC_INDEX="+alias); err != nil {
		return nil, err
	}
	return res, b.rebuildUnderLoad(ctx, client, alias, res)
}

// rebuildUnderLoad rebuilds the alias while the application writes and a
// reader counts, then checks that nothing was lost.
func (b *bench) rebuildUnderLoad(ctx context.Context, client *elastic.Client, alias string, res *RebuildResult) error {
	producer := harness.Produce(ctx, harness.SourceWriter{DB: b.pool, Table: "bench_search_index"}, harness.ProducerConfig{Rate: rebuildLiveRate, Next: b.rebuildEvents(res.Rows)})
	defer producer.Stop()
	before, err := b.rawUnderLive(ctx, client, alias+"-raw-before", res.Rows)
	if err != nil {
		return err
	}
	reader := startAliasReader(ctx, b.cfg.ElasticURL, alias)
	timer := &loadTimer{sample: b.sampleCPU}
	rep, err := rebuild.Run(ctx, rebuild.Config{Pool: b.pool, Client: client, Alias: alias, SourceTable: "bench_search_index",
		BulkSize: b.cfg.Batch, Concurrency: b.cfg.Concurrency, By: "bench", Why: "make bench", Progress: timer})
	reader.stop()
	if err != nil {
		return fmt.Errorf("rebuild: %w", err)
	}
	after, err := b.rawUnderLive(ctx, client, alias+"-raw-after", res.Rows)
	producer.Stop()
	if err != nil {
		return err
	}
	res.TotalSeconds, res.LoadSeconds, res.LoadCPUSeconds = rep.Seconds, timer.seconds(), timer.cpuSeconds()
	res.RowsPerSec = float64(rep.Rows) / res.LoadSeconds
	res.Ratio = res.RowsPerSec / res.RawPerSec
	res.RawUnderLivePerSec = (before + after) / 2
	res.RatioUnderLive = res.RowsPerSec / res.RawUnderLivePerSec
	res.LiveEvents = producer.Committed()
	res.Reads, res.ReadsFailed, res.ReadsMissing = reader.reads.Load(), reader.failed, reader.missing
	if _, _, err := b.waitDrained(ctx, b.drainTimeout(int(res.LiveEvents))); err != nil {
		return err
	}
	v, err := harness.Verify(ctx, b.pool, b.cfg.ElasticURL, alias)
	if err != nil {
		return err
	}
	res.Verdict = v.String()
	diff, err := harness.SourceDiff(ctx, b.pool, b.cfg.ElasticURL, alias, "bench_search_index")
	if err == nil && (!v.OK() || len(diff) > 0) {
		err = fmt.Errorf("after the rebuild: %s; the alias differs from the source table in %d documents, first %q",
			v, len(diff), diff[:min(len(diff), 1)])
	}
	b.say("rebuild: %d rows loaded in %.2fs (%.0f rows/s, %.2f of quiet raw bulk's %.0f/s, %.2f of raw bulk's %.0f/s under the same live events), "+
		"%.2fs in all; %d live events; %d reads of the alias, %d failed, %d saw fewer documents", rep.Rows, res.LoadSeconds,
		res.RowsPerSec, res.Ratio, res.RawPerSec, res.RatioUnderLive, res.RawUnderLivePerSec, res.TotalSeconds,
		res.LiveEvents, res.Reads, res.ReadsFailed, res.ReadsMissing)
	return err
}

// rawUnderLive is the raw _bulk rate of the rebuild's documents into a
// fresh index while the live events flow.
func (b *bench) rawUnderLive(ctx context.Context, client *elastic.Client, index string, n int) (float64, error) {
	if err := b.createIndex(ctx, index); err != nil {
		return 0, err
	}
	defer func() { _ = b.deleteIndex(context.WithoutCancel(ctx), index) }()
	secs, err := sendBulks(ctx, client, index, 0, n, b.cfg.Batch, b.cfg.Concurrency, b.cfg.DocBytes)
	if err != nil {
		return 0, err
	}
	return float64(n) / secs, nil
}

// rebuildSource writes the SoT: the raw step's documents at version 1.
func (b *bench) rebuildSource(ctx context.Context, n int) error {
	_, err := b.pool.Exec(ctx, `DROP TABLE IF EXISTS bench_search_index;
		CREATE TABLE bench_search_index (entity_type text NOT NULL, entity_id text NOT NULL, doc jsonb NOT NULL,
		                                 version bigint NOT NULL, PRIMARY KEY (entity_type, entity_id))`)
	if err != nil {
		return err
	}
	rows := make([][]any, 0, n)
	for i := range n {
		rows = append(rows, []any{"book", entityID(i), string(doc(i, b.cfg.DocBytes)), int64(1)})
	}
	_, err = b.pool.CopyFrom(ctx, pgx.Identifier{"bench_search_index"}, []string{"entity_type", "entity_id", "doc", "version"},
		pgx.CopyFromRows(rows))
	if err == nil {
		_, err = b.pool.Exec(ctx, `VACUUM ANALYZE bench_search_index`)
	}
	return err
}

// rebuildAlias loads the documents into alias-orig and points alias at it.
func (b *bench) rebuildAlias(ctx context.Context, client *elastic.Client, alias string, n int) error {
	orig := alias + "-orig"
	if err := b.createIndex(ctx, orig); err != nil {
		return err
	}
	if _, err := sendBulks(ctx, client, orig, 0, n, b.cfg.Batch, b.cfg.Concurrency, b.cfg.DocBytes); err != nil {
		return err
	}
	body := []byte(fmt.Sprintf(`{"actions": [{"add": {"index": %q, "alias": %q}}]}`, orig, alias))
	return harness.ES(ctx, b.cfg.ElasticURL, http.MethodPost, "/_aliases", body, nil)
}

// rebuildEvents are live updates of the loaded documents, at versions above
// the source's, written with the source row in one statement (harness.SourceWriter).
func (b *bench) rebuildEvents(rows int) func(n int) []harness.Event {
	var version atomic.Int64
	version.Store(1)
	return func(n int) []harness.Event {
		events := make([]harness.Event, n)
		for i := range events {
			v := version.Add(1)
			id := int(v) % rows
			events[i] = harness.Event{EntityType: "book", EntityID: entityID(id), Op: "upsert", Version: v,
				Payload: json.RawMessage(doc(id, b.cfg.DocBytes))}
		}
		return events
	}
}

// loadTimer is a rebuild.Progress that times the load phase.
type loadTimer struct {
	mu         sync.Mutex
	start, end time.Time
	total      int64
	done       int64
	// cpu0 and cpu are the CPU seconds per role at the start of the load
	// and used during it, as sample reads them.
	sample func() cpuSample
	cpu0   cpuSample
	cpu    map[string]float64
}

func (l *loadTimer) Phase(name string, total int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if name == "load" {
		l.start, l.total, l.cpu0 = time.Now(), total, l.sample()
	}
}

func (l *loadTimer) Add(n int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done += n; l.done >= l.total && l.end.IsZero() {
		l.end, l.cpu = time.Now(), l.sample().since(l.cpu0)
	}
}

func (l *loadTimer) Set(int64)   {}
func (l *loadTimer) Note(string) {}

func (l *loadTimer) cpuSeconds() map[string]float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cpu
}

func (l *loadTimer) seconds() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.end.Sub(l.start).Seconds()
}

// aliasReader counts the alias's documents in a loop.
type aliasReader struct {
	reads           atomic.Int64
	failed, missing int
	done            chan struct{}
	cancel          context.CancelFunc
}

func startAliasReader(ctx context.Context, base, alias string) *aliasReader {
	ctx, cancel := context.WithCancel(ctx)
	r := &aliasReader{done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(r.done)
		var most int64
		for ctx.Err() == nil {
			var c struct {
				Count int64 `json:"count"`
			}
			err := harness.ES(ctx, base, http.MethodGet, "/"+alias+"/_count", nil, &c)
			switch {
			case ctx.Err() != nil:
				return
			case err != nil:
				r.failed++
			case c.Count < most:
				r.missing++
			default:
				most = c.Count
			}
			r.reads.Add(1)
			_ = harness.Sleep(ctx, 5*time.Millisecond)
		}
	}()
	return r
}

func (r *aliasReader) stop() { r.cancel(); <-r.done }
