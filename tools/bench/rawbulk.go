package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/olivere/elastic/v7"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/projection"
)

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
	cpu0 := b.sampleCPU()
	secs, err := sendBulks(ctx, client, index, 0, b.cfg.Docs, b.cfg.Batch, b.cfg.Concurrency, b.cfg.DocBytes)
	if err != nil {
		return nil, err
	}
	cpu := b.sampleCPU().since(cpu0)
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
