package rebuild

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
)

const (
	// checkpointEvery bounds the work a crash repeats.
	checkpointEvery = time.Second
	// Transient failures (429, 5xx, timeouts) of a chunk are retried with
	// the daemon's backoff; after loadTries the load stops, resumable.
	loadTries       = 6
	loadBackoffBase = 200 * time.Millisecond
	loadBackoffMax  = 5 * time.Second
)

// Refused is a source row the engine (or the handler's checks) refused, with
// the daemon's reason for it.
type Refused struct {
	EntityType string `json:"entity_type"`
	EntityID   string `json:"entity_id"`
	Version    int64  `json:"version"`
	Reason     string `json:"reason"`
	Message    string `json:"message"`
}

// chunk is BulkSize consecutive source rows and, once its worker is done,
// what became of them.
type chunk struct {
	rows []sourceRow
	last key
	done chan struct{}

	loaded, superseded int64
	refused            []Refused
	behind             []Behind
	err                error
}

// loader sends chunks of source rows to the rebuild's index through the
// search handler (the daemon's bulk building, versioning and reading of
// answers), Concurrency at a time, and records in key order how far the
// engine confirmed.
type loader struct {
	cfg    Config
	pool   *pgxpool.Pool
	search *projection.Search
	copier copier
	row    *Row
	rep    *Report
}

// load reads the source table after the row's checkpoint, a page per
// statement, and loads it; see the package doc for why pages read after the
// leader confirmed its dual-writes load every document at its newest
// version.
func (l *loader) load(ctx context.Context, table string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	chunks := make(chan *chunk, l.cfg.Concurrency)
	ordered := make(chan *chunk, 4*l.cfg.Concurrency)
	// Twice as many workers as bulks in flight: one prepares its chunk
	// (the ledger read) while the other's bulk is in the engine.
	inFlight := make(chan struct{}, l.cfg.Concurrency)
	var wg sync.WaitGroup
	for range 2 * l.cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range chunks {
				l.send(ctx, c, inFlight)
				close(c.done)
			}
		}()
	}
	collected := make(chan error, 1)
	go func() { collected <- l.collect(ctx, ordered, cancel) }()

	readErr := l.read(ctx, table, chunks, ordered)
	close(chunks)
	close(ordered)
	wg.Wait()
	if err := <-collected; err != nil {
		return err
	}
	return readErr
}

// read streams the source table into chunks, handed to the workers and, in
// the same order, to the collector.
func (l *loader) read(ctx context.Context, table string, chunks, ordered chan<- *chunk) error {
	var after *key
	if l.row.LoadedType != nil && l.row.LoadedID != nil {
		after = &key{Type: *l.row.LoadedType, ID: *l.row.LoadedID}
	}
	c := &chunk{done: make(chan struct{})}
	flush := func() error {
		if len(c.rows) == 0 {
			return nil
		}
		select {
		case ordered <- c:
		case <-ctx.Done():
			return ctx.Err()
		}
		chunks <- c
		c = &chunk{done: make(chan struct{})}
		return nil
	}
	before := l.row.RowsLoaded + l.row.RowsRefused + l.row.RowsSuperseded
	counted := func(n int64) {
		l.rep.Rows = before + n
		l.cfg.Progress.Phase("load", l.rep.Rows)
		l.cfg.Progress.Add(before)
	}
	err := readSource(ctx, l.pool, table, after, counted,
		func(r sourceRow) error {
			c.rows = append(c.rows, r)
			c.last = key{Type: r.EntityType, ID: r.EntityID}
			if len(c.rows) < l.cfg.BulkSize {
				return nil
			}
			return flush()
		})
	if err == nil {
		err = flush()
	}
	return err
}

// collect takes the chunks in key order as they finish, adds them up, and
// checkpoints the key before which every row is in the engine. The first
// failed chunk stops the load.
func (l *loader) collect(ctx context.Context, ordered <-chan *chunk, stop context.CancelFunc) error {
	last := time.Now()
	var failed error
	for c := range ordered {
		<-c.done
		if failed != nil {
			continue
		}
		if c.err != nil {
			failed = c.err
			stop()
			continue
		}
		l.row.RowsLoaded += c.loaded
		l.row.RowsSuperseded += c.superseded
		l.row.RowsRefused += int64(len(c.refused))
		l.row.LoadedType, l.row.LoadedID = &c.last.Type, &c.last.ID
		l.rep.refuse(c.refused, l.cfg.OnRefused)
		l.rep.behind(c.behind)
		l.cfg.Progress.Add(int64(len(c.rows)))
		if time.Since(last) >= checkpointEvery {
			if err := checkpoint(ctx, l.pool, l.row); err != nil {
				failed = err
				stop()
			}
			last = time.Now()
		}
	}
	l.rep.Rows = l.row.RowsLoaded + l.row.RowsSuperseded + l.row.RowsRefused
	if failed == nil {
		failed = checkpoint(context.WithoutCancel(ctx), l.pool, l.row)
	} else {
		// What finished before the failure is in the engine: keep it.
		_ = checkpoint(context.WithoutCancel(ctx), l.pool, l.row)
	}
	return failed
}

// send loads one chunk: rows the ledger has a delete of (at their version
// or newer) are dropped, rows it has a newer live version of are replaced
// by the old index's copy (Behind), the rest go to the engine, transient
// failures again after a backoff.
func (l *loader) send(ctx context.Context, c *chunk, inFlight chan struct{}) {
	if ctx.Err() != nil {
		c.err = ctx.Err()
		return
	}
	events, stale, behind, err := l.fresh(ctx, c.rows)
	if err != nil {
		c.err = err
		return
	}
	copies, err := l.copier.copies(ctx, behind, int64(len(c.rows))+1)
	if err != nil {
		c.err = err
		return
	}
	// A row behind the ledger that the old index lacks is superseded: the
	// new index cannot lack what the old one never served.
	c.superseded, c.behind = int64(stale+len(behind)-len(copies)), behind
	out, err := sendAll(ctx, l.search, l.cfg.Mask, l.row.Target, append(events, copies...), inFlight)
	c.loaded, c.superseded, c.refused, c.err = out.loaded, c.superseded+out.superseded, out.refused, err
}

const ledgerSQL = `
SELECT u.i, a.version, a.deleted
  FROM unnest($2::text[], $3::text[], $4::bigint[]) WITH ORDINALITY AS u(entity_type, entity_id, version, i)
  CROSS JOIN LATERAL outbox_ledger_entry($1, u.entity_type, u.entity_id) a
 WHERE a.version > u.version OR (a.deleted AND a.version >= u.version)`

// fresh turns the rows into the events the search handler takes (version:
// the row's), leaving out those the ledger holds something newer of: a
// delete (stale: the old index has it deleted too), or a newer live
// version (behind). The ledger is read now, after the page: a delete
// applied since the page was read would otherwise be undone once the
// engine has forgotten it.
func (l *loader) fresh(ctx context.Context, rows []sourceRow) ([]outbox.Event, int, []Behind, error) {
	types, ids, versions := make([]string, len(rows)), make([]string, len(rows)), make([]int64, len(rows))
	for i, r := range rows {
		types[i], ids[i], versions[i] = r.EntityType, r.EntityID, r.Version
	}
	dbRows, err := l.pool.Query(ctx, ledgerSQL, l.cfg.Projection, types, ids, versions)
	if err != nil {
		return nil, 0, nil, fmt.Errorf("read the ledger: %w", err)
	}
	newer := map[int64]outbox.Applied{}
	var i int64
	var a outbox.Applied
	_, err = pgx.ForEachRow(dbRows, []any{&i, &a.Version, &a.Deleted}, func() error { newer[i-1] = a; return nil })
	if err != nil {
		return nil, 0, nil, fmt.Errorf("read the ledger: %w", err)
	}
	var stale int
	var behind []Behind
	events := make([]outbox.Event, 0, len(rows)-len(newer))
	for i, r := range rows {
		switch a, ok := newer[int64(i)]; {
		case ok && a.Deleted:
			stale++
		case ok:
			behind = append(behind, Behind{EntityType: r.EntityType, EntityID: r.EntityID, SourceVersion: r.Version, LedgerVersion: a.Version})
		default:
			v := r.Version
			events = append(events, outbox.Event{ID: int64(i + 1), Projection: l.cfg.Projection, EntityType: r.EntityType,
				EntityID: r.EntityID, Op: outbox.OpUpsert, EventVersion: &v, Payload: r.Doc})
		}
	}
	return events, stale, behind, nil
}
