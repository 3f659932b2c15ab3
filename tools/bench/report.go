package main

import (
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// Report is what bench writes as JSON.
type Report struct {
	harness.RunReport
	FinishedAt time.Time `json:"finished_at"`
	Smoke      bool      `json:"smoke"`
	Machine    Machine   `json:"machine"`
	// Engine is the search engine as scripts/stack.sh names it, e.g.
	// elasticsearch-8, with its distribution and version.
	Engine   Engine   `json:"engine"`
	Settings Settings `json:"settings"`

	RawBulk      *Throughput    `json:"raw_bulk"`
	EndToEnd     *Throughput    `json:"end_to_end"`
	PostgresPath *PostgresPath  `json:"postgres_path"`
	Latency      *Latency       `json:"latency"`
	Failover     *Failover      `json:"failover"`
	ClaimCost    *ClaimCost     `json:"claim_cost"`
	Memory       *Memory        `json:"memory"`
	Retention    *Retention     `json:"retention"`
	Comparison   *Comparison    `json:"comparison,omitempty"`
	Rebuild      *RebuildResult `json:"rebuild,omitempty"`
	Console      *ConsoleReport `json:"console,omitempty"`
	Sustained    *Sustained     `json:"sustained,omitempty"`
	Verify       *VerifyResult  `json:"verify,omitempty"`
	CPUProfile   string         `json:"cpu_profile,omitempty"`
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

type Latency struct {
	Rate    int     `json:"rate"`
	Seconds float64 `json:"seconds"`
	Events  int     `json:"events"`
	P50ms   float64 `json:"p50_ms"`
	P95ms   float64 `json:"p95_ms"`
	P99ms   float64 `json:"p99_ms"`
	MaxMs   float64 `json:"max_ms"`
	// The same split at the claim: insert to claim, claim to ack.
	ClaimWaitP50ms  float64 `json:"claim_wait_p50_ms"`
	ClaimWaitP99ms  float64 `json:"claim_wait_p99_ms"`
	ClaimToAckP50ms float64 `json:"claim_to_ack_p50_ms"`
	ClaimToAckP99ms float64 `json:"claim_to_ack_p99_ms"`
}

type Failover struct {
	Rounds int `json:"rounds"`
	Rate   int `json:"rate"`
	// Seconds from each kill to the first ack of the new leader.
	Seconds *harness.Stats `json:"seconds"`
}

type ClaimCost struct {
	Batch         int     `json:"batch"`
	Samples       int     `json:"samples"`
	DoneRows      int     `json:"done_rows"`
	FailedRows    int     `json:"failed_rows"`
	EmptyMedianMs float64 `json:"empty_median_ms"`
	ScaleMedianMs float64 `json:"scale_median_ms"`
	TableBytes    int64   `json:"table_bytes"`
	// LedgerRows is the ledger entries with the history: one per done row.
	LedgerRows int64   `json:"ledger_rows"`
	Ratio      float64 `json:"ratio"`
}

type Memory struct {
	PeakRSSMB float64 `json:"peak_rss_mb"`
}

// Retention is step 8: the outbox under a steady producer while the leader
// prunes done rows older than the retention.
type Retention struct {
	Rate             int     `json:"rate"`
	Seconds          float64 `json:"seconds"`
	RetentionSeconds float64 `json:"retention_seconds"`
	Docs             int     `json:"docs"`
	Seeded           int     `json:"seeded"`
	Produced         int64   `json:"produced"`
	// Pruned is the leader's outbox_pruned_total at the end.
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
	// Acked is the events acked in the window, ClaimWaitP99Ms their p99
	// from insert to claim, AckP99Ms from insert to ack.
	Acked          int     `json:"acked"`
	ClaimWaitP99Ms float64 `json:"claim_wait_p99_ms"`
	AckP99Ms       float64 `json:"ack_p99_ms"`
	Pruned         int64   `json:"pruned"`
	Autovacuums    int64   `json:"autovacuums"`
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
	// The p99 over every event acked in the first and the last third.
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

// finish computes the ratios and checks the targets: one check per
// target, in a row, so that the targets read as a list.
func (r *Report) finish() {
	r.FinishedAt = time.Now().UTC()
	r.DurationSeconds = harness.Round3(r.FinishedAt.Sub(r.StartedAt).Seconds())
	if r.RawBulk != nil && r.EndToEnd != nil {
		r.Ratios.EndToEndToRaw = harness.Round3(r.EndToEnd.EventsPerSec / r.RawBulk.EventsPerSec)
	}
	if pg := r.PostgresPath; pg != nil {
		var toBare, toNoLedger, noLedgerToBare []float64
		for _, round := range pg.Rounds {
			toBare, toNoLedger = append(toBare, round.LedgerToBare), append(toNoLedger, round.LedgerToNoLedger)
			noLedgerToBare = append(noLedgerToBare, round.NoLedgerToBare)
		}
		r.Ratios.DaemonPGToBareLoop = median(toBare)
		r.Ratios.LedgerToNoLedger = median(toNoLedger)
		r.Ratios.NoLedgerToBareLoop = median(noLedgerToBare)
		var dbCPU []float64
		for _, round := range pg.Rounds {
			dbCPU = append(dbCPU, round.LedgerDatabaseCPU)
		}
		pg.LedgerDatabaseCPU = median(dbCPU)
	}
	if r.ClaimCost != nil {
		r.Ratios.ClaimScaleToEmpty = r.ClaimCost.Ratio
	}
	if r.Comparison != nil {
		r.Comparison.finish()
		r.Ratios.EndToEndToRawMedian = r.Comparison.MedianRatio
	}
	add := func(measure, goal string, value float64, unit string, met bool) {
		r.Targets = append(r.Targets, Target{Measure: measure, Goal: goal, Value: value, Unit: unit, Met: met})
	}
	// The median of the pairs when there are some: one pair is noise on a
	// shared machine.
	if c := r.Comparison; c != nil && len(c.Pairs) > 0 {
		add(fmt.Sprintf("end-to-end / raw bulk, median of %d pairs", len(c.Pairs)), ">= 0.9", c.MedianRatio, "ratio", c.MedianRatio >= 0.9)
	} else if r.RawBulk != nil && r.EndToEnd != nil {
		add("end-to-end / raw bulk", ">= 0.9", r.Ratios.EndToEndToRaw, "ratio", r.Ratios.EndToEndToRaw >= 0.9)
	}
	if pg := r.PostgresPath; pg != nil {
		add("postgres path alone", ">= 15000", pg.Ledger.MedianEventsPerSec, "events/s", pg.Ledger.MedianEventsPerSec >= 15000)
		add("postgres path / bare SQL loop", ">= 0.85", r.Ratios.DaemonPGToBareLoop, "ratio", r.Ratios.DaemonPGToBareLoop >= 0.85)
	}
	if r.Latency != nil {
		add("latency p50", "<= 50", r.Latency.P50ms, "ms", r.Latency.P50ms <= 50)
		add("latency p99", "<= 250", r.Latency.P99ms, "ms", r.Latency.P99ms <= 250)
	}
	if r.Failover != nil {
		add("failover median", "<= 1", r.Failover.Seconds.Median, "s", r.Failover.Seconds.Median <= 1)
	}
	if r.ClaimCost != nil {
		add("claim cost ratio", "<= 1.2", r.ClaimCost.Ratio, "ratio", r.ClaimCost.Ratio <= 1.2)
	}
	if r.Memory != nil {
		add("peak RSS", "<= 100", r.Memory.PeakRSSMB, "MB", r.Memory.PeakRSSMB <= 100)
	}
	if r.Retention != nil && r.Retention.Verdict != nil {
		v := r.Retention.Verdict
		add("retention: rows, last third / middle third", "<= 1.1", v.RowsRatio, "ratio", v.RowsRatio <= 1.1)
		add("retention: bytes, last third / middle third", "<= 1.1", v.BytesRatio, "ratio", v.BytesRatio <= 1.1)
		add("retention: claim p99, last third / first third", "<= 1.5", v.ClaimWaitP99Ratio, "ratio", v.ClaimWaitP99Ratio <= 1.5)
	}
	if rb := r.Rebuild; rb != nil {
		add("rebuild load / raw bulk", ">= 0.8", harness.Round3(rb.Ratio), "ratio", rb.Ratio >= 0.8)
		add("rebuild load / raw bulk under the same live events", ">= 0.8", harness.Round3(rb.RatioUnderLive), "ratio", rb.RatioUnderLive >= 0.8)
	}
	if s := r.Sustained; s != nil {
		for _, run := range s.Runs {
			at := fmt.Sprintf("sustained %d/s, %s", s.Rate, run.State)
			add(at+": lag p99", "<= 250", run.LagP99ms, "ms", run.LagP99ms <= 250)
			add(at+": lag p99, last third / first third", "<= 1.2", run.Flatness, "ratio", run.Flatness <= 1.2)
			add(at+": claim p99", "<= 5", run.ClaimP99ms, "ms", run.ClaimP99ms <= 5)
			add(at+": lease expiries", "0", float64(run.LeaseExpiries), "events", run.LeaseExpiries == 0)
			add(at+": database CPU per event, wlproj's", "<= 50", run.DatabaseCPUPerEv, "µs", run.DatabaseCPUPerEv <= 50)
			add(at+": wlproj CPU per event", "<= 25", run.WlprojCPUPerEv, "µs", run.WlprojCPUPerEv <= 25)
		}
	}
	if v := r.Verify; v != nil {
		v.addTargets(add)
	}
	if c := r.Console; c != nil {
		first := c.Pages["first_screen"].P95Ms
		add(fmt.Sprintf("console first screen p95, %d failed", c.FailedRows), "< 300", first, "ms", first < ms(consoleFirstScreenTarget))
		worst := worstFilter(c)
		add(fmt.Sprintf("console worst filter p95, %d failed", c.FailedRows), "< 500", worst, "ms", worst < ms(consoleFilterTarget))
	}
}

// median of a few ratios, 0 for none.
func median(values []float64) float64 {
	if s := harness.NewStats(values); s != nil {
		return s.Median
	}
	return 0
}

// Table prints every figure, then the targets. It is long because it is
// one line per step in the report's order, kept together so the columns
// read as one table.
func (r *Report) Table(w io.Writer) {
	fmt.Fprintf(w, "wlproj bench: %s (%s), Postgres %s, %s, %d CPUs%s\n\n", r.Versions.Engine, r.Engine.Name, r.Versions.Postgres,
		r.Versions.Go, r.Machine.CPUs, map[bool]string{true: " (smoke sizes)", false: ""}[r.Smoke])
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "step\tfigure\tCPU seconds (engine/postgres/wlproj/bench)")
	thr := func(name string, t *Throughput) {
		if t != nil {
			fmt.Fprintf(tw, "%s\t%d events in %.2fs = %.0f/s\t%s\n", name, t.Events, t.Seconds, t.EventsPerSec, cpuCell(t.CPUSeconds))
		}
	}
	thr("1 raw bulk", r.RawBulk)
	thr("2 end to end", r.EndToEnd)
	if pg := r.PostgresPath; pg != nil {
		variant := func(name string, v *Variant) {
			rates := make([]string, len(v.Runs))
			for i, t := range v.Runs {
				rates[i] = fmt.Sprintf("%.0f", t.EventsPerSec)
			}
			cpu, db := v.cpu()
			fmt.Fprintf(tw, "3 %s, batch %d\tmedian %.0f/s of %d events (runs %s)\t%s per run; its database %.1f\n", name, v.Batch,
				v.MedianEventsPerSec, r.Settings.Docs, strings.Join(rates, ", "), cpuCell(cpu), db)
		}
		variant("bare SQL loop", pg.Bare)
		variant("daemon PG path", pg.Ledger)
		variant("daemon PG path, no ledger", pg.NoLedger)
		fmt.Fprintf(tw, "  with ledger / without, / bare\t%.3f, %.3f (median of %d rounds; without / bare %.3f)\t\n",
			r.Ratios.LedgerToNoLedger, r.Ratios.DaemonPGToBareLoop, len(pg.Rounds), r.Ratios.NoLedgerToBareLoop)
		fmt.Fprintf(tw, "  database CPU, with ledger / without\t%.3f (median of %d rounds)\t\n", pg.LedgerDatabaseCPU, len(pg.Rounds))
		if pg.AtBareBatch != nil {
			thr(fmt.Sprintf("3 daemon PG path, batch %d", pg.AtBareBatch.Batch), pg.AtBareBatch)
		}
	}
	if l := r.Latency; l != nil {
		fmt.Fprintf(tw, "4 latency at %d/s for %.0fs\tp50 %.1f ms, p95 %.1f ms, p99 %.1f ms, max %.1f ms\t\n", l.Rate, l.Seconds, l.P50ms, l.P95ms, l.P99ms, l.MaxMs)
		fmt.Fprintf(tw, "  insert to claim / claim to ack\tp50 %.1f / %.1f ms, p99 %.1f / %.1f ms\t\n", l.ClaimWaitP50ms, l.ClaimToAckP50ms, l.ClaimWaitP99ms, l.ClaimToAckP99ms)
	}
	if f := r.Failover; f != nil {
		fmt.Fprintf(tw, "5 failover x%d at %d/s\tmin %.3fs, median %.3fs, max %.3fs\t\n", f.Rounds, f.Rate, f.Seconds.Min, f.Seconds.Median, f.Seconds.Max)
	}
	if c := r.ClaimCost; c != nil {
		fmt.Fprintf(tw, "6 claim of %d\tmedian %.2f ms empty, %.2f ms with %d done + %d failed (%.0f MB), %d ledger entries\t\n",
			c.Batch, c.EmptyMedianMs, c.ScaleMedianMs, c.DoneRows, c.FailedRows, mb(c.TableBytes), c.LedgerRows)
	}
	if m := r.Memory; m != nil {
		fmt.Fprintf(tw, "7 leader peak RSS, step 2\t%.1f MB\t\n", m.PeakRSSMB)
	}
	if rt := r.Retention; rt != nil {
		fmt.Fprintf(tw, "8 retention %.0fs at %d/s for %.0fs\t%d produced, %d pruned, autovacuum %s (%d runs)\t\n",
			rt.RetentionSeconds, rt.Rate, rt.Seconds, rt.Produced, rt.Pruned, rt.Autovacuum, rt.Autovacuums)
		if v := rt.Verdict; v != nil {
			fmt.Fprintf(tw, "  rows, bytes: last third max / middle\t%d / %d = %.3f, %.1f / %.1f MB = %.3f\t\n",
				v.RowsLastMax, v.RowsMiddleMax, v.RowsRatio, mb(v.BytesLastMax), mb(v.BytesMiddleMax), v.BytesRatio)
			fmt.Fprintf(tw, "  claim p99: last third / first\t%.1f / %.1f ms = %.3f (insert to ack p99 %.1f / %.1f ms)\t\n",
				v.ClaimWaitP99LastMs, v.ClaimWaitP99FirstMs, v.ClaimWaitP99Ratio, v.AckP99LastMs, v.AckP99FirstMs)
		}
	}
	if c := r.Comparison; c != nil && len(c.Pairs) > 0 {
		for i, p := range c.Pairs {
			fmt.Fprintf(tw, "9 pair %d: raw, end to end\t%.0f/s, %.0f/s = %.3f; wlproj %.1f µs/event, its database %.1f µs/event\t%s; %s\n",
				i+1, p.Raw.EventsPerSec, p.EndToEnd.EventsPerSec, p.Ratio, p.WlprojMicrosPerEvent, p.PostgresMicrosPerEvent,
				cpuCell(p.Raw.CPUSeconds), cpuCell(p.EndToEnd.CPUSeconds))
		}
		fmt.Fprintf(tw, "  end to end / raw, %d pairs\tmedian %.3f (min %.3f, max %.3f); CPU µs/event wlproj %.1f, postgres %.1f (all postgres %.1f)\t\n",
			len(c.Pairs), c.MedianRatio, c.MinRatio, c.MaxRatio, c.WlprojMicrosPerEvent, c.PostgresMicrosPerEvent, c.PostgresAllMicrosPerEvent)
	}
	if rb := r.Rebuild; rb != nil {
		fmt.Fprintf(tw, "10 rebuild of %d rows\tload %.2fs = %.0f/s, %.3f of quiet raw %.0f/s, %.3f of raw under the same live events %.0f/s; %.2fs in all; %d live events\t%s (the loader runs in the bench)\n",
			rb.Rows, rb.LoadSeconds, rb.RowsPerSec, rb.Ratio, rb.RawPerSec, rb.RatioUnderLive, rb.RawUnderLivePerSec, rb.TotalSeconds, rb.LiveEvents,
			cpuCell(rb.LoadCPUSeconds))
		fmt.Fprintf(tw, "  reads of the alias during it\t%d, %d failed, %d saw fewer documents; %s\t\n", rb.Reads, rb.ReadsFailed, rb.ReadsMissing, rb.Verdict)
	}
	if c := r.Console; c != nil {
		for _, name := range []string{"first_screen", "filter_reason", "filter_scope", "filter_text", "last_page", "overview"} {
			if p, ok := c.Pages[name]; ok {
				fmt.Fprintf(tw, "11 console %s, %d failed\tmedian %.1f ms, p95 %.1f ms, max %.1f ms (%d samples)\t\n", name, c.FailedRows, p.MedianMs, p.P95Ms, p.MaxMs, c.Samples)
			}
		}
	}
	if s := r.Sustained; s != nil {
		fmt.Fprintf(tw, "12 sustained, producer alone\t%d events in %.0fs: database %.1f µs/event\t\n", s.Base.Events, s.Base.Seconds, s.Base.DatabaseCPUPerEv)
		for _, run := range s.Runs {
			fmt.Fprintf(tw, "  %s at %d/s for %.0fs\tlag p50 %.1f ms, p99 %.1f ms (thirds %v, %.2f); claim p99 %.1f ms; %d lease expiries; database %.1f µs/event, wlproj %.1f µs/event\t\n",
				run.State, s.Rate, s.Seconds, run.LagP50ms, run.LagP99ms, run.LagP99ByThird, run.Flatness, run.ClaimP99ms,
				run.LeaseExpiries, run.DatabaseCPUPerEv, run.WlprojCPUPerEv)
		}
	}
	tw.Flush()
	if rt := r.Retention; rt != nil {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "t s\trows\tdone\tbacklog\tdead~\tMB\tledger rows\tledger MB\tacked\tclaim p99 ms\tack p99 ms\tpruned\tautovacuums\t")
		for _, s := range rt.Samples {
			fmt.Fprintf(tw, "%.0f\t%d\t%d\t%d\t%d\t%.1f\t%d\t%.1f\t%d\t%.1f\t%.1f\t%d\t%d\t\n", s.T, s.Rows, s.DoneRows, s.Backlog,
				s.DeadRows, mb(s.Bytes), s.LedgerRows, mb(s.LedgerBytes), s.Acked, s.ClaimWaitP99Ms, s.AckP99Ms, s.Pruned, s.Autovacuums)
		}
		tw.Flush()
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "target\tgoal\tmeasured\tmet")
	for _, t := range r.Targets {
		fmt.Fprintf(tw, "%s\t%s %s\t%g %s\t%s\n", t.Measure, t.Goal, t.Unit, t.Value, t.Unit, map[bool]string{true: "yes", false: "NO"}[t.Met])
	}
	tw.Flush()
	for _, p := range r.Problems {
		fmt.Fprintln(w, "problem:", p)
	}
}

func cpuCell(c map[string]float64) string {
	parts := make([]string, 0, 4)
	for _, role := range []string{"engine", "postgres", "wlproj", "bench"} {
		parts = append(parts, fmt.Sprintf("%.1f", c[role]))
	}
	return strings.Join(parts, " / ")
}

func round1(f float64) float64 { return math.Round(f*10) / 10 }

func mb(bytes int64) float64 { return float64(bytes) / (1 << 20) }
