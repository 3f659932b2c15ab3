package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/projection"
	"github.com/wlproj/wlproj/verify"
)

// VerifyConfig is the verify step's part of Config.
type VerifyConfig struct {
	// Docs is the documents of the index and the source table.
	Docs int
	// Rounds is how many times verify and its two baselines are timed,
	// every other round in reverse order.
	Rounds int
	// LiveRate is the live drain's events per second while its latency
	// is measured, without and then with a scheduled verify.
	LiveRate int
	// Window is how long the baseline latency is measured.
	Window time.Duration
}

func defaultVerifyConfig() VerifyConfig {
	return VerifyConfig{Docs: 1_000_000, Rounds: 2, LiveRate: 500, Window: 60 * time.Second}
}

func (c VerifyConfig) smoke() VerifyConfig {
	return VerifyConfig{Docs: 3000, Rounds: 1, LiveRate: 100, Window: 2 * time.Second}
}

func (c *VerifyConfig) flags(fs *flag.FlagSet) {
	fs.IntVar(&c.Docs, "verify-docs", c.Docs, "documents in the index and the source table of the verify step")
	fs.IntVar(&c.Rounds, "verify-rounds", c.Rounds, "times verify and its baselines are timed in the verify step")
	fs.IntVar(&c.LiveRate, "verify-live-rate", c.LiveRate, "events per second of the live drain during the verify step's latency runs")
	fs.DurationVar(&c.Window, "verify-window", c.Window, "how long the verify step measures the live drain's baseline latency")
}

func (c VerifyConfig) validate() error {
	switch {
	case c.Docs < 1 || c.Docs > 100_000_000:
		return fmt.Errorf("-verify-docs=%d is out of range [1, 100000000]", c.Docs)
	case c.Rounds < 1 || c.Rounds > 100:
		return fmt.Errorf("-verify-rounds=%d is out of range [1, 100]", c.Rounds)
	case c.LiveRate < 1 || c.LiveRate > 100_000:
		return fmt.Errorf("-verify-live-rate=%d is out of range [1, 100000]", c.LiveRate)
	case c.Window < time.Second:
		return fmt.Errorf("-verify-window=%s is below 1s", c.Window)
	}
	return nil
}

// VerifyResult is the verify step: wlproj verify over Docs documents next
// to what it cannot do without (a bare scan of the index alone and a bare
// key-ordered read of the source table alone), its peak RSS, and the live
// drain's p99 without and during a scheduled verify.
type VerifyResult struct {
	Docs   int           `json:"docs"`
	Rounds []VerifyRound `json:"rounds"`
	// MedianRatio is the median of the rounds' verify / (scan + read).
	MedianRatio float64      `json:"median_ratio"`
	PeakRSSMB   float64      `json:"peak_rss_mb"`
	Drain       *VerifyDrain `json:"drain"`
}

// VerifyRound is one timing of the three, in Order.
type VerifyRound struct {
	Order         []string `json:"order"`
	ScanSeconds   float64  `json:"index_scan_seconds"`
	ReadSeconds   float64  `json:"source_read_seconds"`
	VerifySeconds float64  `json:"verify_seconds"`
	Ratio         float64  `json:"ratio"`
	RSSMB         float64  `json:"verify_peak_rss_mb"`
}

// VerifyDrain is the live drain's latency (insert to ack) without and
// during a scheduled verify at OUTBOX_VERIFY_RATE's default. The events
// and p99s are those the pair acked in each window, from its histogram
// outbox_event_latency_seconds scraped at the window's start and end
// (queued rows get no processed_at; they were the events inserted in the
// window), estimated within its buckets.
type VerifyDrain struct {
	Rate           int     `json:"events_per_sec"`
	VerifyRate     int     `json:"verify_docs_per_sec"`
	BaselineEvents int     `json:"baseline_events"`
	BaselineP99ms  float64 `json:"baseline_p99_ms"`
	DuringEvents   int     `json:"during_events"`
	DuringP99ms    float64 `json:"during_p99_ms"`
	DuringSeconds  float64 `json:"during_seconds"`
	Ratio          float64 `json:"ratio"`
	// The scheduled run's own result: it ran against the live drain.
	Checked int64 `json:"verify_checked"`
	Drift   int64 `json:"verify_drift"`
}

func (v *VerifyResult) addTargets(add func(measure, goal string, value float64, unit string, met bool)) {
	if len(v.Rounds) > 0 {
		add(fmt.Sprintf("verify of %d docs / (index scan + source read), median of %d rounds", v.Docs, len(v.Rounds)),
			"<= 1.25", v.MedianRatio, "ratio", v.MedianRatio <= 1.25)
		add("verify peak RSS", "<= 100", v.PeakRSSMB, "MB", v.PeakRSSMB <= 100)
	}
	if d := v.Drain; d != nil {
		add("drain p99 during a scheduled verify / without", "<= 2", d.Ratio, "ratio", d.Ratio <= 2)
	}
}

// verifySource is the step's source-of-truth table.
const verifySource = "search_index"

// 13. wlproj verify, its baselines, and the live drain during a scheduled
// verify.
func (b *bench) verifyStep(ctx context.Context) error {
	c := b.cfg.Verify
	res := &VerifyResult{Docs: c.Docs}
	b.rep.Verify = res
	if err := b.verifyLoad(ctx, c.Docs); err != nil {
		return err
	}
	if err := b.quiesce(ctx); err != nil {
		return err
	}
	if _, err := b.bareScan(ctx); err != nil { // warm-up: the index's files into the page cache
		return err
	}
	var ratios []float64
	for i := range c.Rounds {
		order := []string{"scan", "read", "verify"}
		if i%2 == 1 {
			slices.Reverse(order)
		}
		r, err := b.verifyRound(ctx, order, c.Docs)
		if err != nil {
			return err
		}
		res.Rounds = append(res.Rounds, r)
		ratios = append(ratios, r.Ratio)
		res.PeakRSSMB = max(res.PeakRSSMB, r.RSSMB)
		b.say("verify round %d (%v): scan %.2fs, read %.2fs, verify %.2fs: ratio %.3f, RSS %.1f MB",
			i+1, order, r.ScanSeconds, r.ReadSeconds, r.VerifySeconds, r.Ratio, r.RSSMB)
	}
	res.MedianRatio = harness.Round3(median(ratios))
	drain, err := b.verifyDrain(ctx, c)
	if err != nil {
		return err
	}
	res.Drain = drain
	b.say("verify: drain p99 %.1f ms without, %.1f ms during a scheduled verify (%.2fx); the run checked %d, drift %d",
		drain.BaselineP99ms, drain.DuringP99ms, drain.Ratio, drain.Checked, drain.Drift)
	if err := b.deleteIndex(ctx, b.index); err != nil {
		return err
	}
	if err := b.createIndex(ctx, b.index); err != nil {
		return err
	}
	if _, err := b.pool.Exec(ctx, `DROP TABLE `+verifySource); err != nil {
		return err
	}
	return b.reset(ctx)
}

// verifyLoad makes an index, a source table and a ledger that agree: books
// 0..n-1 at version 1, as a leader leaves them.
func (b *bench) verifyLoad(ctx context.Context, n int) error {
	if err := b.reset(ctx); err != nil {
		return err
	}
	if err := b.deleteIndex(ctx, b.index); err != nil {
		return err
	}
	if err := b.createIndex(ctx, b.index); err != nil {
		return err
	}
	start := time.Now()
	_, err := b.pool.Exec(ctx, `
		DROP TABLE IF EXISTS `+verifySource+`;
		CREATE TABLE `+verifySource+` (entity_type text NOT NULL, entity_id text NOT NULL, doc jsonb NOT NULL,
		  version bigint NOT NULL, PRIMARY KEY (entity_type, entity_id))`)
	if err != nil {
		return err
	}
	_, err = b.pool.Exec(ctx, `
		INSERT INTO `+verifySource+`
		SELECT 'book', g::text, jsonb_build_object('kind', 'book', 'title', 'Book ' || g, 'body', repeat('word ', $2 / 5)), 1
		  FROM generate_series(0, $1 - 1) g`, n, b.cfg.DocBytes)
	if err != nil {
		return err
	}
	_, err = b.pool.Exec(ctx, `
		INSERT INTO outbox_ledger (projection, entity_type, entity_id, version, deleted, event_id)
		SELECT 'search', 'book', g::text, 1, false, g + 1 FROM generate_series(0, $1 - 1) g`, n)
	if err != nil {
		return err
	}
	if _, err := b.pool.Exec(ctx, `ANALYZE `+verifySource+`; ANALYZE outbox_ledger`); err != nil {
		return err
	}
	client, err := projection.NewElasticClient(projection.ElasticOptions{URL: b.cfg.ElasticURL})
	if err != nil {
		return err
	}
	const chunk = 20_000 // sendBulks builds its requests first: bounded here
	for first := 0; first < n; first += chunk {
		if _, err := sendBulks(ctx, client, b.index, first, min(chunk, n-first), b.cfg.Batch, b.cfg.Concurrency, b.cfg.DocBytes); err != nil {
			return err
		}
	}
	count, err := harness.DocCount(ctx, b.cfg.ElasticURL, b.index)
	if err != nil {
		return err
	}
	if count != n {
		return fmt.Errorf("the index holds %d documents, want %d", count, n)
	}
	b.say("verify: %d documents in the index, the source table and the ledger in %s", n, time.Since(start).Round(time.Second))
	return nil
}

// verifyRound times the bare scan, the bare read and wlproj verify, in order.
func (b *bench) verifyRound(ctx context.Context, order []string, n int) (VerifyRound, error) {
	r := VerifyRound{Order: order}
	for _, what := range order {
		var err error
		var got int
		switch what {
		case "scan":
			r.ScanSeconds, got, err = timed(func() (int, error) { return b.bareScan(ctx) })
		case "read":
			r.ReadSeconds, got, err = timed(func() (int, error) { return b.bareRead(ctx) })
		case "verify":
			var rss int64
			r.VerifySeconds, got, err = timed(func() (int, error) {
				var checked int
				var err error
				checked, rss, err = b.runVerify(ctx)
				return checked, err
			})
			r.RSSMB = round1(float64(rss) / (1 << 20))
		}
		if err != nil {
			return r, fmt.Errorf("%s: %w", what, err)
		}
		if got != n {
			return r, fmt.Errorf("%s read %d documents, want %d", what, got, n)
		}
	}
	r.Ratio = harness.Round3(r.VerifySeconds / (r.ScanSeconds + r.ReadSeconds))
	return r, nil
}

func timed(f func() (int, error)) (float64, int, error) {
	start := time.Now()
	n, err := f()
	return harness.Round3(time.Since(start).Seconds()), n, err
}

// bareScan reads every document's id and version from the index, as
// verify's scroll does (the same page size, filter and order), and nothing
// else.
func (b *bench) bareScan(ctx context.Context) (int, error) {
	filter := url.QueryEscape("_scroll_id,hits.hits._id,hits.hits._version")
	var p harness.VersionPage
	body, _ := json.Marshal(map[string]any{"size": verify.PageDefault, "sort": []string{"_doc"}, "_source": false, "version": true})
	if err := harness.ES(ctx, b.cfg.ElasticURL, http.MethodPost, "/"+b.index+"/_search?scroll=10m&filter_path="+filter, body, &p); err != nil {
		return 0, err
	}
	n := 0
	for len(p.Hits.Hits) > 0 {
		n += len(p.Hits.Hits)
		id := p.ScrollID
		body, _ := json.Marshal(map[string]any{"scroll": "10m", "scroll_id": id})
		p = harness.VersionPage{}
		if err := harness.ES(ctx, b.cfg.ElasticURL, http.MethodPost, "/_search/scroll?filter_path="+filter, body, &p); err != nil {
			return n, err
		}
		p.ScrollID = id
	}
	body, _ = json.Marshal(map[string]any{"scroll_id": []string{p.ScrollID}})
	_ = harness.ES(ctx, b.cfg.ElasticURL, http.MethodDelete, "/_search/scroll", body, nil)
	return n, nil
}

// bareRead reads every row's key and version from the source table in
// key-ordered pages of verify's size, in one snapshot, and nothing else.
func (b *bench) bareRead(ctx context.Context) (int, error) {
	tx, err := b.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read-only
	n := 0
	var lastType, lastID string
	for {
		rows, err := tx.Query(ctx, `SELECT entity_type, entity_id, version FROM `+verifySource+`
			WHERE (entity_type, entity_id) > ($1, $2) ORDER BY entity_type, entity_id LIMIT $3`, lastType, lastID, verify.PageDefault)
		if err != nil {
			return n, err
		}
		got := 0
		for rows.Next() {
			var version int64
			if err := rows.Scan(&lastType, &lastID, &version); err != nil {
				return n, err
			}
			got++
		}
		if err := rows.Err(); err != nil {
			return n, err
		}
		n += got
		if got < verify.PageDefault {
			return n, nil
		}
	}
}

// runVerify runs `wlproj verify --from-table` as an operator would and
// returns the documents it checked and its peak RSS in bytes; drift fails.
func (b *bench) runVerify(ctx context.Context) (int, int64, error) {
	cmd := exec.CommandContext(ctx, b.s.Bin, "verify", "--from-table", verifySource, "--json")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+b.s.DB.URL, "ELASTIC_URL="+b.cfg.ElasticURL, "ELASTIC_INDEX="+b.index)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		return 0, 0, err
	}
	// VmHWM of the process itself, watched while it runs: rusage's maxrss
	// of a child counts the parent's memory it was started from.
	var rss int64
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var err error
	for watching := true; watching; {
		if hwm, herr := peakRSS(cmd.Process.Pid); herr == nil {
			rss = max(rss, hwm)
		}
		select {
		case err = <-exited:
			watching = false
		case <-time.After(20 * time.Millisecond):
		}
	}
	out := stdout.Bytes()
	if err != nil {
		out = append(out, stderr.Bytes()...)
		return 0, rss, fmt.Errorf("wlproj verify: %w: %s", err, out)
	}
	var rep struct {
		Checked                            int
		Missing, Stale, Extra, Resurrected int
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		return 0, rss, fmt.Errorf("wlproj verify: %w: %s", err, out)
	}
	return rep.Checked, rss, nil
}

// verifyDrain measures the live drain's latency with a leader alone for
// the window, then with a leader whose scheduled verify runs at its term
// start, over that run. The producer updates the books through the source
// table, as the application does, so the scheduled run finds no drift.
func (b *bench) verifyDrain(ctx context.Context, c VerifyConfig) (*VerifyDrain, error) {
	d := &VerifyDrain{Rate: c.LiveRate, VerifyRate: verify.RateDefault}
	p := b.verifyProducer(ctx, c)
	defer p.Stop()
	baseline, err := b.baselineWindow(ctx, c)
	if err != nil {
		return nil, err
	}
	started, finished, during, err := b.scheduledWindow(ctx, c, d)
	if err != nil {
		return nil, err
	}
	p.Stop()
	if err := p.Err(); err != nil {
		return nil, err
	}
	if err := b.drained(ctx, int(p.Committed())); err != nil {
		return nil, err
	}
	b.stopReplicas()
	d.DuringSeconds = harness.Round3(finished.Sub(started).Seconds())
	d.BaselineEvents, d.BaselineP99ms = int(baseline.count()), baseline.ms(0.99)
	d.DuringEvents, d.DuringP99ms = int(during.count()), during.ms(0.99)
	if d.BaselineP99ms > 0 {
		d.Ratio = harness.Round3(d.DuringP99ms / d.BaselineP99ms)
	}
	return d, nil
}

// verifyProducer updates the books at c.LiveRate through the source table.
func (b *bench) verifyProducer(ctx context.Context, c VerifyConfig) *harness.Producer {
	n := 0
	return harness.Produce(ctx, harness.SourceWriter{DB: b.pool, Table: verifySource}, harness.ProducerConfig{Rate: c.LiveRate,
		Next: func(count int) []harness.Event {
			events := make([]harness.Event, count)
			for i := range events {
				// Version 2 on the first pass: the load wrote 1.
				book, version := n%c.Docs, int64(n/c.Docs+2)
				events[i] = harness.Event{EntityType: "book", EntityID: entityID(book), Op: "upsert", Version: version,
					Payload: json.RawMessage(doc(book, b.cfg.DocBytes))}
				n++
			}
			return events
		}})
}

// settledLeader starts a pair, waits for one to lead and the other to
// stand by and for the backlog of the switch to drain (a second), and
// returns the leader with the time then, on the database's clock.
func (b *bench) settledLeader(ctx context.Context, name string, env ...string) (*harness.Replica, time.Time, error) {
	r, err := b.startPair(ctx, name, env...)
	if err != nil {
		return nil, time.Time{}, err
	}
	if err := harness.Sleep(ctx, time.Second); err != nil {
		return nil, time.Time{}, err
	}
	at, err := harness.Now(ctx, b.pool)
	return r, at, err
}

// baselineWindow runs a pair without a scheduled verify for c.Window and
// returns the insert-to-ack times of the events it acked meanwhile.
func (b *bench) baselineWindow(ctx context.Context, c VerifyConfig) (hist, error) {
	defer b.stopReplicas()
	if _, _, err := b.settledLeader(ctx, "verify-base"); err != nil {
		return nil, err
	}
	from, err := b.scrapeLag()
	if err != nil {
		return nil, err
	}
	if err := harness.Sleep(ctx, c.Window); err != nil {
		return nil, err
	}
	to, err := b.scrapeLag()
	if err != nil {
		return nil, err
	}
	return to.since(from), nil
}

// scheduledWindow runs a pair whose leader's scheduled verify starts with
// its term, and returns the run's window once it has finished, on the
// database's clock, with the insert-to-ack times of the events acked in
// it; the run's own result goes to d.
func (b *bench) scheduledWindow(ctx context.Context, c VerifyConfig, d *VerifyDrain) (started, finished time.Time, during hist, err error) {
	if _, started, err = b.settledLeader(ctx, "verify-live", "OUTBOX_VERIFY_INTERVAL=24h",
		"OUTBOX_VERIFY_FROM_TABLE="+verifySource); err != nil {
		return started, finished, nil, err
	}
	from, err := b.scrapeLag()
	if err != nil {
		return started, finished, nil, err
	}
	if finished, err = b.waitVerified(ctx, c, d, started); err != nil {
		return started, finished, nil, err
	}
	to, err := b.scrapeLag()
	if err != nil {
		return started, finished, nil, err
	}
	return started, finished, to.since(from), nil
}

// waitVerified waits for the scheduled verify that started with the term
// at started to finish, and returns when it did (a second after started at
// least).
func (b *bench) waitVerified(ctx context.Context, c VerifyConfig, d *VerifyDrain, started time.Time) (finished time.Time, err error) {
	// The run takes about Docs / OUTBOX_VERIFY_RATE; a machine three times
	// slower than that is broken.
	timeout := time.Minute + 3*time.Duration(c.Docs)*time.Second/time.Duration(verify.RateDefault)
	err = harness.Poll(ctx, timeout, "the scheduled verify to finish", func(ctx context.Context) (bool, error) {
		err := b.pool.QueryRow(ctx, `SELECT finished_at, checked, missing + stale + extra + resurrected FROM outbox_verify_runs`).
			Scan(&finished, &d.Checked, &d.Drift)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		return finished, err
	}
	// A run shorter than a second (smoke sizes) is measured over a second.
	if finished.Before(started.Add(time.Second)) {
		finished = started.Add(time.Second)
	}
	now, err := harness.Now(ctx, b.pool)
	if err != nil {
		return finished, err
	}
	return finished, harness.Sleep(ctx, finished.Sub(now))
}
