package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/wlproj/wlproj/internal/rig"
)

// Report is what bench writes as JSON.
type Report struct {
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
	Smoke      bool      `json:"smoke"`
	Database   string    `json:"database"`
	Index      string    `json:"index"`
	Versions   Versions  `json:"versions"`
	Machine    Machine   `json:"machine"`
	Settings   Settings  `json:"settings"`

	RawBulk      *Throughput   `json:"raw_bulk"`
	EndToEnd     *Throughput   `json:"end_to_end"`
	PostgresPath *PostgresPath `json:"postgres_path"`
	Latency      *Latency      `json:"latency"`
	Failover     *Failover     `json:"failover"`
	ClaimCost    *ClaimCost    `json:"claim_cost"`
	Memory       *Memory       `json:"memory"`
	CPUProfile   string        `json:"cpu_profile,omitempty"`
	// QuiesceSeconds is the time spent waiting for the engine and Postgres
	// to go idle before each step.
	QuiesceSeconds float64 `json:"quiesce_seconds"`

	Ratios   Ratios   `json:"ratios"`
	Targets  []Target `json:"targets"`
	Problems []string `json:"problems,omitempty"`
}

type Versions struct {
	Engine   string `json:"engine"`
	Postgres string `json:"postgres"`
	Go       string `json:"go"`
}

type Machine struct {
	CPUs int    `json:"cpus"`
	OS   string `json:"os"`
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
	DrainedAfterLoad string  `json:"drained_after_load"`
}

// Throughput is one drain of Events.
type Throughput struct {
	Batch        int     `json:"batch,omitempty"`
	Events       int     `json:"events"`
	Seconds      float64 `json:"seconds"`
	EventsPerSec float64 `json:"events_per_sec"`
	// CPUSeconds used by each role during the drain.
	CPUSeconds map[string]float64 `json:"cpu_seconds"`
}

type PostgresPath struct {
	Bare   *Throughput   `json:"bare_sql_loop"`
	Daemon []*Throughput `json:"daemon_loop"`
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
	Seconds *rig.Stats `json:"seconds"`
}

type ClaimCost struct {
	Batch         int     `json:"batch"`
	Samples       int     `json:"samples"`
	DoneRows      int     `json:"done_rows"`
	FailedRows    int     `json:"failed_rows"`
	EmptyMedianMs float64 `json:"empty_median_ms"`
	ScaleMedianMs float64 `json:"scale_median_ms"`
	TableBytes    int64   `json:"table_bytes"`
	Ratio         float64 `json:"ratio"`
}

type Memory struct {
	PeakRSSMB float64 `json:"peak_rss_mb"`
}

type Ratios struct {
	EndToEndToRaw      float64 `json:"end_to_end_to_raw"`
	DaemonPGToBareLoop float64 `json:"daemon_postgres_path_to_bare_loop"`
	ClaimScaleToEmpty  float64 `json:"claim_scale_to_empty"`
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
		StartedAt: time.Now().UTC(),
		Smoke:     cfg.Smoke,
		Machine:   Machine{CPUs: runtime.NumCPU(), OS: runtime.GOOS + "/" + runtime.GOARCH},
		Settings: Settings{
			Docs: cfg.Docs, DocBytes: cfg.DocBytes, Batch: cfg.Batch, Concurrency: cfg.Concurrency,
			BareBatch: cfg.BareBatch, Versioning: "external_gte", LatencyRate: cfg.Rate,
			LatencySeconds: cfg.Duration.Seconds(), Failovers: cfg.Failovers, FailoverRate: cfg.FailoverRate,
			ClaimDoneRows: cfg.DoneRows, ClaimFailedRows: cfg.FailedRows, ClaimSamples: cfg.ClaimSamples,
			DrainedAfterLoad: "VACUUM ANALYZE after each load, as autovacuum would have by then",
		},
	}
}

func (r *Report) problem(p string) { r.Problems = append(r.Problems, p) }

// finish computes the ratios and checks the targets.
func (r *Report) finish() {
	r.FinishedAt = time.Now().UTC()
	if r.RawBulk != nil && r.EndToEnd != nil {
		r.Ratios.EndToEndToRaw = rig.Round3(r.EndToEnd.EventsPerSec / r.RawBulk.EventsPerSec)
	}
	pgDaemon := r.daemonAtBatch()
	if pgDaemon != nil && r.PostgresPath.Bare != nil {
		r.Ratios.DaemonPGToBareLoop = rig.Round3(pgDaemon.EventsPerSec / r.PostgresPath.Bare.EventsPerSec)
	}
	if r.ClaimCost != nil {
		r.Ratios.ClaimScaleToEmpty = r.ClaimCost.Ratio
	}
	add := func(measure, goal string, value float64, unit string, met bool) {
		r.Targets = append(r.Targets, Target{Measure: measure, Goal: goal, Value: value, Unit: unit, Met: met})
	}
	if r.RawBulk != nil && r.EndToEnd != nil {
		add("end-to-end / raw bulk", ">= 0.9", r.Ratios.EndToEndToRaw, "ratio", r.Ratios.EndToEndToRaw >= 0.9)
	}
	if pgDaemon != nil {
		add("postgres path alone", ">= 15000", pgDaemon.EventsPerSec, "events/s", pgDaemon.EventsPerSec >= 15000)
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
}

// daemonAtBatch is the daemon loop's run at the daemon's batch size.
func (r *Report) daemonAtBatch() *Throughput {
	if r.PostgresPath == nil {
		return nil
	}
	for _, t := range r.PostgresPath.Daemon {
		if t.Batch == r.Settings.Batch {
			return t
		}
	}
	return nil
}

func (r *Report) write(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// Table prints every figure, then the targets.
func (r *Report) Table(w io.Writer) {
	fmt.Fprintf(w, "wlproj bench: %s, Postgres %s, %s, %d CPUs%s\n\n", r.Versions.Engine, r.Versions.Postgres,
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
	if r.PostgresPath != nil {
		thr(fmt.Sprintf("3 bare SQL loop, batch %d", r.PostgresPath.Bare.Batch), r.PostgresPath.Bare)
		for _, t := range r.PostgresPath.Daemon {
			thr(fmt.Sprintf("3 daemon PG path, batch %d", t.Batch), t)
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
		fmt.Fprintf(tw, "6 claim of %d\tmedian %.2f ms empty, %.2f ms with %d done + %d failed (%.0f MB)\t\n",
			c.Batch, c.EmptyMedianMs, c.ScaleMedianMs, c.DoneRows, c.FailedRows, float64(c.TableBytes)/(1<<20))
	}
	if m := r.Memory; m != nil {
		fmt.Fprintf(tw, "7 leader peak RSS, step 2\t%.1f MB\t\n", m.PeakRSSMB)
	}
	tw.Flush()
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
