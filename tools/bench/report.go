package main

import (
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// Report is what bench writes as JSON.
type Report struct {
	harness.RunReport
	FinishedAt time.Time `json:"finished_at"`
	Smoke      bool      `json:"smoke"`
	// Command is how the run was started, as make bench's BENCH_FLAGS.
	Command string  `json:"command,omitempty"`
	Machine Machine `json:"machine"`
	// Engine is the search engine as scripts/stack.sh names it, e.g.
	// elasticsearch-8, with its distribution and version.
	Engine   Engine   `json:"engine"`
	Settings Settings `json:"settings"`

	RawBulk        *Throughput     `json:"raw_bulk"`
	EndToEnd       *Throughput     `json:"end_to_end"`
	PostgresPath   *PostgresPath   `json:"postgres_path"`
	Latency        *Latency        `json:"latency"`
	Failover       *Failover       `json:"failover"`
	ClaimCost      *ClaimCost      `json:"claim_cost"`
	Memory         *Memory         `json:"memory"`
	Retention      *Retention      `json:"retention"`
	Comparison     *Comparison     `json:"comparison,omitempty"`
	Rebuild        *RebuildResult  `json:"rebuild,omitempty"`
	Console        *ConsoleReport  `json:"console,omitempty"`
	Sustained      []*Sustained    `json:"sustained,omitempty"`
	Verify         *VerifyResult   `json:"verify,omitempty"`
	SQLScale       *SQLScale       `json:"sql_scale,omitempty"`
	NetDelay       *NetDelay       `json:"network_delay,omitempty"`
	River          *River          `json:"river,omitempty"`
	TwoProjections *TwoProjections `json:"two_projections,omitempty"`
	Soak           *Soak           `json:"soak,omitempty"`
	// DatabaseHealth is the database during each step under load: what
	// held the vacuum horizon, dead rows, lock waits (health.go).
	DatabaseHealth []StepHealth `json:"database_health,omitempty"`
	CPUProfile     string       `json:"cpu_profile,omitempty"`
	// QuiesceSeconds is the time spent waiting for the engine and Postgres
	// to go idle before each step.
	QuiesceSeconds float64 `json:"quiesce_seconds"`

	Ratios  Ratios   `json:"ratios"`
	Targets []Target `json:"targets"`
}

type Machine struct {
	CPUs int    `json:"cpus"`
	OS   string `json:"os"`
}

type Engine struct {
	Name         string `json:"name"`
	Distribution string `json:"distribution"`
	Version      string `json:"version"`
}

// Comparison is raw bulk and end to end run in turn, pair after pair.
type Comparison struct {
	Pairs []Pair `json:"pairs"`
	// Pinned says where the processes ran (-pin), nil when unpinned.
	Pinned *Pinning `json:"pinned,omitempty"`
	// The median of the pairs' end-to-end / raw ratios, and their spread.
	MedianRatio float64 `json:"median_ratio"`
	MinRatio    float64 `json:"min_ratio"`
	MaxRatio    float64 `json:"max_ratio"`
	// Medians over the end-to-end runs: CPU microseconds per event of the
	// leader, of the backends of the bench's database, and of every
	// Postgres process on the machine.
	WlprojMicrosPerEvent      float64 `json:"wlproj_cpu_us_per_event"`
	PostgresMicrosPerEvent    float64 `json:"postgres_cpu_us_per_event"`
	PostgresAllMicrosPerEvent float64 `json:"postgres_all_cpu_us_per_event"`
	RawMedianPerSec           float64 `json:"raw_median_events_per_sec"`
	EndToEndMedianPerSec      float64 `json:"end_to_end_median_events_per_sec"`
}

// Pair is one raw bulk run and the end-to-end run after it.
type Pair struct {
	Raw                       *Throughput `json:"raw_bulk"`
	EndToEnd                  *Throughput `json:"end_to_end"`
	Ratio                     float64     `json:"ratio"`
	WlprojMicrosPerEvent      float64     `json:"wlproj_cpu_us_per_event"`
	PostgresMicrosPerEvent    float64     `json:"postgres_cpu_us_per_event"`
	PostgresAllMicrosPerEvent float64     `json:"postgres_all_cpu_us_per_event"`
}

func (c *Comparison) finish() {
	var ratios, wl, pg, pgAll, raw, e2e []float64
	for _, p := range c.Pairs {
		ratios, wl, pg = append(ratios, p.Ratio), append(wl, p.WlprojMicrosPerEvent), append(pg, p.PostgresMicrosPerEvent)
		pgAll, raw, e2e = append(pgAll, p.PostgresAllMicrosPerEvent), append(raw, p.Raw.EventsPerSec), append(e2e, p.EndToEnd.EventsPerSec)
	}
	if len(ratios) == 0 {
		return
	}
	c.MedianRatio, c.MinRatio, c.MaxRatio = harness.Round3(median(ratios)), slices.Min(ratios), slices.Max(ratios)
	c.WlprojMicrosPerEvent, c.PostgresMicrosPerEvent = round1(median(wl)), round1(median(pg))
	c.PostgresAllMicrosPerEvent, c.RawMedianPerSec, c.EndToEndMedianPerSec = round1(median(pgAll)), round1(median(raw)), round1(median(e2e))
}

// worstFilter is the highest p95 of the console's filter pages.
func worstFilter(c *ConsoleReport) float64 {
	worst := 0.0
	for name, p := range c.Pages {
		if strings.HasPrefix(name, "filter_") {
			worst = max(worst, p.P95Ms)
		}
	}
	return worst
}

type Settings struct {
	Docs             int     `json:"docs"`
	DocBytes         int     `json:"doc_bytes"`
	Batch            int     `json:"batch"`
	Concurrency      int     `json:"concurrency"`
	BareBatch        int     `json:"bare_batch"`
	Versioning       string  `json:"versioning"`
	LatencyRate      int     `json:"latency_rate"`
	LatencySeconds   float64 `json:"latency_seconds"`
	Failovers        int     `json:"failovers"`
	FailoverRate     int     `json:"failover_rate"`
	ClaimDoneRows    int     `json:"claim_done_rows"`
	ClaimFailedRows  int     `json:"claim_failed_rows"`
	ClaimSamples     int     `json:"claim_samples"`
	PGRounds         int     `json:"pg_rounds"`
	DrainedAfterLoad string  `json:"drained_after_load"`

	RetentionRate          int     `json:"retention_rate"`
	RetentionRunSeconds    float64 `json:"retention_run_seconds"`
	RetentionSeconds       float64 `json:"retention_seconds"`
	RetentionSampleSeconds float64 `json:"retention_sample_seconds"`
	RetentionDocs          int     `json:"retention_docs"`
	RetentionSeed          int     `json:"retention_seed"`
	Pairs                  int     `json:"pairs"`
	RebuildRows            int     `json:"rebuild_rows"`
	ConsoleRows            int     `json:"console_rows"`
	ConsoleSamples         int     `json:"console_samples"`
}

// Throughput is one drain of Events.
type Throughput struct {
	Batch        int     `json:"batch,omitempty"`
	Events       int     `json:"events"`
	Seconds      float64 `json:"seconds"`
	EventsPerSec float64 `json:"events_per_sec"`
	// CPUSeconds used by each role during the drain.
	CPUSeconds map[string]float64 `json:"cpu_seconds"`
	// DatabaseCPUSeconds is what the backends of the bench's own database
	// used (step 3): Postgres' work for this drain alone, which other work
	// on a shared machine slows down but does not add to.
	DatabaseCPUSeconds float64 `json:"database_cpu_seconds,omitempty"`
}

// newThroughput is events drained in secs, with the CPU each role used.
func newThroughput(events int, secs float64, cpu map[string]float64) *Throughput {
	return &Throughput{Events: events, Seconds: harness.Round3(secs), EventsPerSec: round1(float64(events) / secs), CPUSeconds: cpu}
}

// PostgresPath is step 3: each variant's runs, and the ratios of each round.
type PostgresPath struct {
	Batch     int `json:"batch"`
	BareBatch int `json:"bare_batch"`
	// Order is the variants in the order they ran.
	Order    []string  `json:"order"`
	Bare     *Variant  `json:"bare_sql_loop"`
	Ledger   *Variant  `json:"daemon_loop"`
	NoLedger *Variant  `json:"daemon_loop_no_ledger"`
	Rounds   []PGRound `json:"rounds"`
	// LedgerDatabaseCPU is the median of the rounds'.
	LedgerDatabaseCPU float64 `json:"ledger_database_cpu"`
	// AtBareBatch is the daemon loop, with the ledger, at the bare loop's
	// batch, run once after the rounds.
	AtBareBatch *Throughput `json:"daemon_loop_at_bare_batch,omitempty"`
}

// Variant is the runs of one variant of step 3.
type Variant struct {
	Batch              int           `json:"batch"`
	MedianEventsPerSec float64       `json:"median_events_per_sec"`
	Runs               []*Throughput `json:"runs"`
}

func (v *Variant) finish() {
	rates := make([]float64, len(v.Runs))
	for i, t := range v.Runs {
		rates[i] = t.EventsPerSec
	}
	if s := harness.NewStats(rates); s != nil {
		v.MedianEventsPerSec = round1(s.Median)
	}
}

// cpu is the CPU seconds per role of one run, averaged over the runs, and
// the database's alone.
func (v *Variant) cpu() (map[string]float64, float64) {
	out, db := map[string]float64{}, 0.0
	for _, t := range v.Runs {
		for role, secs := range t.CPUSeconds {
			out[role] += secs / float64(len(v.Runs))
		}
		db += t.DatabaseCPUSeconds / float64(len(v.Runs))
	}
	return out, db
}

// PGRound is the ratios of one round of step 3: events/s over events/s,
// and the database's CPU seconds over CPU seconds.
type PGRound struct {
	LedgerToNoLedger float64 `json:"ledger_to_no_ledger"`
	LedgerToBare     float64 `json:"ledger_to_bare"`
	NoLedgerToBare   float64 `json:"no_ledger_to_bare"`
	// LedgerDatabaseCPU is the database CPU of the drain with the ledger
	// over the drain without it.
	LedgerDatabaseCPU float64 `json:"ledger_database_cpu"`
}

// Latency is step 4. Events and the percentiles are the pair's
// outbox_event_latency_seconds (insert to ack, every event), estimated
// within its buckets (lag.go); MaxMs is the upper bound of the highest
// bucket with an event, since a histogram keeps no maximum.
type Latency struct {
	Rate    int     `json:"rate"`
	Seconds float64 `json:"seconds"`
	Events  int     `json:"events"`
	P50ms   float64 `json:"p50_ms"`
	P95ms   float64 `json:"p95_ms"`
	P99ms   float64 `json:"p99_ms"`
	MaxMs   float64 `json:"max_ms"`
	// Where the time went. Queued rows keep no claim time, so these are no
	// longer per event: ClaimWait* is the claim (or queued read)
	// statement's own time, outbox_claim_duration_seconds, empty polls
	// included; ClaimToAck* is a batch's from its claim to its ack,
	// outbox_batch_duration_seconds.
	ClaimWaitP50ms  float64 `json:"claim_wait_p50_ms"`
	ClaimWaitP99ms  float64 `json:"claim_wait_p99_ms"`
	ClaimToAckP50ms float64 `json:"claim_to_ack_p50_ms"`
	ClaimToAckP99ms float64 `json:"claim_to_ack_p99_ms"`
}

type Failover struct {
	Rounds int `json:"rounds"`
	Rate   int `json:"rate"`
	// Seconds from each kill to the first event the new leader applied
	// (harness.WaitFirstAck).
	Seconds *harness.Stats `json:"seconds"`
}

type ClaimCost struct {
	Batch         int     `json:"batch"`
	Samples       int     `json:"samples"`
	DoneRows      int     `json:"done_rows"`
	FailedRows    int     `json:"failed_rows"`
	EmptyMedianMs float64 `json:"empty_median_ms"`
	ScaleMedianMs float64 `json:"scale_median_ms"`
	// ParkedRows pending rows of a paused projection, then as many waiting
	// out a backoff, beside the claimed ones; each ratio is over empty.
	ParkedRows      int     `json:"parked_rows"`
	PausedMedianMs  float64 `json:"paused_median_ms"`
	BackoffMedianMs float64 `json:"backoff_median_ms"`
	PausedRatio     float64 `json:"paused_ratio"`
	BackoffRatio    float64 `json:"backoff_ratio"`
	TableBytes      int64   `json:"table_bytes"`
	// LedgerRows is the ledger entries with the history: one per done row.
	LedgerRows int64   `json:"ledger_rows"`
	Ratio      float64 `json:"ratio"`
}

type Memory struct {
	PeakRSSMB float64 `json:"peak_rss_mb"`
}

// Retention is step 8: the outbox under a steady producer while the leader
// rotates its partitions as the retention passes.
type Retention struct {
	Rate             int     `json:"rate"`
	Seconds          float64 `json:"seconds"`
	RetentionSeconds float64 `json:"retention_seconds"`
	Docs             int     `json:"docs"`
	Seeded           int     `json:"seeded"`
	Produced         int64   `json:"produced"`
	// ProducedSeconds is how long the producer ran: Seconds, and the last
	// sample's queries after it (seconds on a loaded machine).
	ProducedSeconds float64 `json:"produced_seconds"`
	// Pruned is the rows gone with their partitions by the end: seeded and
	// produced, less those left (every one of them done).
	Pruned int64 `json:"pruned"`
	// Autovacuum is the server's setting; Autovacuums, how many times it
	// vacuumed the outbox during the step.
	Autovacuum  string            `json:"autovacuum"`
	Autovacuums int64             `json:"autovacuums"`
	Samples     []RetentionSample `json:"samples"`
	// Verdict is missing under three samples.
	Verdict *RetentionVerdict `json:"verdict,omitempty"`
}

// RetentionSample is the outbox at T seconds after the producer started,
// and the events acked since the sample before.
type RetentionSample struct {
	T        float64 `json:"t"`
	Rows     int64   `json:"rows"`
	DoneRows int64   `json:"done_rows"`
	// Backlog is pending and processing rows.
	Backlog int64 `json:"backlog"`
	// DeadRows is Postgres' estimate (n_dead_tup).
	DeadRows int64 `json:"dead_rows"`
	// Bytes is pg_total_relation_size: heap, TOAST and indexes.
	Bytes       int64 `json:"bytes"`
	LedgerRows  int64 `json:"ledger_rows"`
	LedgerBytes int64 `json:"ledger_bytes"`
	// Acked is the events acked since the sample before and AckP99Ms
	// their p99 from insert to ack (the pair's outbox_event_latency_seconds
	// between the two scrapes). Queued rows keep no claim time, so
	// ClaimWaitP99Ms is now the p99 of the claim (or queued read)
	// statement over the same time (outbox_claim_duration_seconds): what
	// grows if the claim slows down as the table churns.
	Acked          int     `json:"acked"`
	ClaimWaitP99Ms float64 `json:"claim_wait_p99_ms"`
	AckP99Ms       float64 `json:"ack_p99_ms"`
	// Rotations is the leader's outbox_events_rotations_total.
	Rotations   int64 `json:"rotations"`
	Autovacuums int64 `json:"autovacuums"`
}

// RetentionVerdict compares the thirds of the samples.
type RetentionVerdict struct {
	Rule           string  `json:"rule"`
	RowsMiddleMax  int64   `json:"rows_middle_max"`
	RowsLastMax    int64   `json:"rows_last_max"`
	RowsRatio      float64 `json:"rows_ratio"`
	BytesMiddleMax int64   `json:"bytes_middle_max"`
	BytesLastMax   int64   `json:"bytes_last_max"`
	BytesRatio     float64 `json:"bytes_ratio"`
	// The p99 over the first and the last third's samples: of the claim
	// statement (ClaimWait*) and of insert to ack (Ack*), as the samples'.
	ClaimWaitP99FirstMs float64 `json:"claim_wait_p99_first_ms"`
	ClaimWaitP99LastMs  float64 `json:"claim_wait_p99_last_ms"`
	ClaimWaitP99Ratio   float64 `json:"claim_wait_p99_ratio"`
	AckP99FirstMs       float64 `json:"ack_p99_first_ms"`
	AckP99LastMs        float64 `json:"ack_p99_last_ms"`
}

type Ratios struct {
	EndToEndToRaw      float64 `json:"end_to_end_to_raw"`
	DaemonPGToBareLoop float64 `json:"daemon_postgres_path_to_bare_loop"`
	LedgerToNoLedger   float64 `json:"daemon_ledger_to_no_ledger"`
	NoLedgerToBareLoop float64 `json:"daemon_no_ledger_to_bare_loop"`
	ClaimScaleToEmpty  float64 `json:"claim_scale_to_empty"`
	// EndToEndToRawMedian is the comparison step's median over its pairs.
	EndToEndToRawMedian float64 `json:"end_to_end_to_raw_median,omitempty"`
}

// Target is one goal of the issue and whether this run met it.
type Target struct {
	Measure string  `json:"measure"`
	Goal    string  `json:"goal"`
	Value   float64 `json:"value"`
	Unit    string  `json:"unit"`
	Met     bool    `json:"met"`
}

func newReport(cfg Config) *Report {
	return &Report{
		RunReport: harness.RunReport{StartedAt: time.Now().UTC()},
		Smoke:     cfg.Smoke,
		Command:   cfg.Command,
		Machine:   Machine{CPUs: runtime.NumCPU(), OS: runtime.GOOS + "/" + runtime.GOARCH},
		Settings: Settings{
			Docs: cfg.Docs, DocBytes: cfg.DocBytes, Batch: cfg.Batch, Concurrency: cfg.Concurrency,
			BareBatch: cfg.BareBatch, Versioning: "external_gte", LatencyRate: cfg.Rate,
			LatencySeconds: cfg.Duration.Seconds(), Failovers: cfg.Failovers, FailoverRate: cfg.FailoverRate,
			ClaimDoneRows: cfg.DoneRows, ClaimFailedRows: cfg.FailedRows, ClaimSamples: cfg.ClaimSamples,
			PGRounds:         cfg.PGRounds,
			DrainedAfterLoad: "VACUUM ANALYZE after each load, as autovacuum would have by then",
			RetentionRate:    cfg.RetentionRate, RetentionRunSeconds: cfg.RetentionDuration.Seconds(),
			RetentionSeconds: cfg.Retention.Seconds(), RetentionSampleSeconds: cfg.RetentionSample.Seconds(),
			RetentionDocs: cfg.RetentionDocs, RetentionSeed: cfg.RetentionSeed,
			Pairs: cfg.Pairs, RebuildRows: cfg.RebuildRows, ConsoleRows: cfg.ConsoleRows, ConsoleSamples: cfg.ConsoleSamples,
		},
	}
}

// median of a few ratios, 0 for none.
func median(values []float64) float64 {
	if s := harness.NewStats(values); s != nil {
		return s.Median
	}
	return 0
}
