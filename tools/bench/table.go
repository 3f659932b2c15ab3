package main

import (
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
)

// Table prints every figure, one step after the other (tableSteps), then
// the retention's samples and the targets.
func (r *Report) Table(w io.Writer) {
	fmt.Fprintf(w, "wlproj bench: %s (%s), Postgres %s, %s, %d CPUs%s\n\n", r.Versions.Engine, r.Engine.Name, r.Versions.Postgres,
		r.Versions.Go, r.Machine.CPUs, map[bool]string{true: " (smoke sizes)", false: ""}[r.Smoke])
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "step\tfigure\tCPU seconds (engine/postgres/wlproj/bench)")
	for _, rows := range tableSteps {
		rows(r, tw)
	}
	tw.Flush()
	r.retentionSamples(w)
	r.soakWindows(w)
	r.healthTable(w)
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

// tableSteps print each step's rows of the table, in the report's order.
var tableSteps = []func(r *Report, tw io.Writer){
	func(r *Report, tw io.Writer) { throughputRow(tw, "1 raw bulk", r.RawBulk) },
	func(r *Report, tw io.Writer) { throughputRow(tw, "2 end to end", r.EndToEnd) },
	pgRows, latencyRows, failoverRows, claimRows, memoryRows, retentionRows, pairRows, rebuildRows, consoleRows, sustainedRows,
	netDelayRows, riverRows, twoProjectionsRows, soakRows,
}

func throughputRow(tw io.Writer, name string, t *Throughput) {
	if t != nil {
		fmt.Fprintf(tw, "%s\t%d events in %.2fs = %.0f/s\t%s\n", name, t.Events, t.Seconds, t.EventsPerSec, cpuCell(t.CPUSeconds))
	}
}

func pgRows(r *Report, tw io.Writer) {
	pg := r.PostgresPath
	if pg == nil {
		return
	}
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
		throughputRow(tw, fmt.Sprintf("3 daemon PG path, batch %d", pg.AtBareBatch.Batch), pg.AtBareBatch)
	}
}

func latencyRows(r *Report, tw io.Writer) {
	if l := r.Latency; l != nil {
		fmt.Fprintf(tw, "4 latency at %d/s for %.0fs\tp50 %.1f ms, p95 %.1f ms, p99 %.1f ms, max %.1f ms\t\n", l.Rate, l.Seconds, l.P50ms, l.P95ms, l.P99ms, l.MaxMs)
		fmt.Fprintf(tw, "  claim statement / batch, claim to ack\tp50 %.1f / %.1f ms, p99 %.1f / %.1f ms\t\n", l.ClaimWaitP50ms, l.ClaimToAckP50ms, l.ClaimWaitP99ms, l.ClaimToAckP99ms)
	}
}

func failoverRows(r *Report, tw io.Writer) {
	if f := r.Failover; f != nil {
		fmt.Fprintf(tw, "5 failover x%d at %d/s, kill to first applied\tmin %.3fs, median %.3fs, p99 %.3fs, max %.3fs\t\n",
			f.Rounds, f.Rate, f.Seconds.Min, f.Seconds.Median, f.Seconds.P99, f.Seconds.Max)
	}
}

func claimRows(r *Report, tw io.Writer) {
	if c := r.ClaimCost; c != nil {
		fmt.Fprintf(tw, "6 claim of %d\tmedian %.2f ms empty, %.2f ms with %d done + %d failed (%.0f MB), %d ledger entries\t\n",
			c.Batch, c.EmptyMedianMs, c.ScaleMedianMs, c.DoneRows, c.FailedRows, mb(c.TableBytes), c.LedgerRows)
		if c.ParkedRows > 0 {
			fmt.Fprintf(tw, "6 claim of %d beside parked rows\tmedian %.2f ms beside %d paused, %.2f ms beside %d in backoff\t\n",
				c.Batch, c.PausedMedianMs, c.ParkedRows, c.BackoffMedianMs, c.ParkedRows)
		}
	}
}

func memoryRows(r *Report, tw io.Writer) {
	if m := r.Memory; m != nil {
		fmt.Fprintf(tw, "7 leader peak RSS, step 2\t%.1f MB\t\n", m.PeakRSSMB)
	}
}

func retentionRows(r *Report, tw io.Writer) {
	rt := r.Retention
	if rt == nil {
		return
	}
	fmt.Fprintf(tw, "8 retention %.0fs at %d/s for %.0fs\t%d produced, %d pruned, autovacuum %s (%d runs)\t\n",
		rt.RetentionSeconds, rt.Rate, rt.Seconds, rt.Produced, rt.Pruned, rt.Autovacuum, rt.Autovacuums)
	if v := rt.Verdict; v != nil {
		fmt.Fprintf(tw, "  rows, bytes: last third max / middle\t%d / %d = %.3f, %.1f / %.1f MB = %.3f\t\n",
			v.RowsLastMax, v.RowsMiddleMax, v.RowsRatio, mb(v.BytesLastMax), mb(v.BytesMiddleMax), v.BytesRatio)
		fmt.Fprintf(tw, "  claim p99: last third / first\t%.1f / %.1f ms = %.3f (insert to ack p99 %.1f / %.1f ms)\t\n",
			v.ClaimWaitP99LastMs, v.ClaimWaitP99FirstMs, v.ClaimWaitP99Ratio, v.AckP99LastMs, v.AckP99FirstMs)
	}
}

func pairRows(r *Report, tw io.Writer) {
	c := r.Comparison
	if c == nil || len(c.Pairs) == 0 {
		return
	}
	for i, p := range c.Pairs {
		fmt.Fprintf(tw, "9 pair %d: raw, end to end\t%.0f/s, %.0f/s = %.3f; wlproj %.1f µs/event, its database %.1f µs/event\t%s; %s\n",
			i+1, p.Raw.EventsPerSec, p.EndToEnd.EventsPerSec, p.Ratio, p.WlprojMicrosPerEvent, p.PostgresMicrosPerEvent,
			cpuCell(p.Raw.CPUSeconds), cpuCell(p.EndToEnd.CPUSeconds))
	}
	fmt.Fprintf(tw, "  end to end / raw, %d pairs\tmedian %.3f (min %.3f, max %.3f); CPU µs/event wlproj %.1f, postgres %.1f (all postgres %.1f)\t\n",
		len(c.Pairs), c.MedianRatio, c.MinRatio, c.MaxRatio, c.WlprojMicrosPerEvent, c.PostgresMicrosPerEvent, c.PostgresAllMicrosPerEvent)
}

func rebuildRows(r *Report, tw io.Writer) {
	if rb := r.Rebuild; rb != nil {
		fmt.Fprintf(tw, "10 rebuild of %d rows\tload %.2fs = %.0f/s, %.3f of quiet raw %.0f/s, %.3f of raw under the same live events %.0f/s; %.2fs in all; %d live events\t%s (the loader runs in the bench)\n",
			rb.Rows, rb.LoadSeconds, rb.RowsPerSec, rb.Ratio, rb.RawPerSec, rb.RatioUnderLive, rb.RawUnderLivePerSec, rb.TotalSeconds, rb.LiveEvents,
			cpuCell(rb.LoadCPUSeconds))
		fmt.Fprintf(tw, "  reads of the alias during it\t%d, %d failed, %d saw fewer documents; %s\t\n", rb.Reads, rb.ReadsFailed, rb.ReadsMissing, rb.Verdict)
	}
}

// consolePages are the console's pages in the table's order.
var consolePages = []string{"first_screen", "filter_reason", "filter_scope", "filter_text", "last_page", "overview"}

func consoleRows(r *Report, tw io.Writer) {
	c := r.Console
	if c == nil {
		return
	}
	for _, name := range consolePages {
		if p, ok := c.Pages[name]; ok {
			fmt.Fprintf(tw, "11 console %s, %d failed\tmedian %.1f ms, p95 %.1f ms, max %.1f ms (%d samples)\t\n", name, c.FailedRows, p.MedianMs, p.P95Ms, p.MaxMs, c.Samples)
		}
	}
}

func sustainedRows(r *Report, tw io.Writer) {
	for _, s := range r.Sustained {
		fmt.Fprintf(tw, "12 sustained %d/s, producer alone\t%d events in %.0fs: database %.1f µs/event\t\n", s.Rate, s.Base.Events, s.Base.Seconds, s.Base.DatabaseCPUPerEv)
		for _, run := range s.Runs {
			fmt.Fprintf(tw, "  %s at %d/s for %.0fs\tlag p50 %.1f ms, p99 %.1f ms (thirds %v, %.2f); claim p99 %.1f ms; %d lease expiries; database %.1f µs/event (its statements %.1f), wlproj %.1f µs/event\t\n",
				run.State, s.Rate, s.Seconds, run.LagP50ms, run.LagP99ms, run.LagP99ByThird, run.Flatness, run.ClaimP99ms,
				run.LeaseExpiries, run.DatabaseCPUPerEv, run.StatementsPerEv, run.WlprojCPUPerEv)
			for _, st := range run.Statements {
				fmt.Fprintf(tw, "    %d calls, %.2f ms each%s\t%s\t\n", st.Calls, st.MeanMs, map[bool]string{true: " (producer)"}[st.Producer], st.Query)
			}
		}
	}
}

// retentionSamples prints step 8's samples as a table of their own.
func (r *Report) retentionSamples(w io.Writer) {
	rt := r.Retention
	if rt == nil {
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "t s\trows\tdone\tbacklog\tdead~\tMB\tledger rows\tledger MB\tacked\tclaim p99 ms\tack p99 ms\trotations\tautovacuums\t")
	for _, s := range rt.Samples {
		fmt.Fprintf(tw, "%.0f\t%d\t%d\t%d\t%d\t%.1f\t%d\t%.1f\t%d\t%.1f\t%.1f\t%d\t%d\t\n", s.T, s.Rows, s.DoneRows, s.Backlog,
			s.DeadRows, mb(s.Bytes), s.LedgerRows, mb(s.LedgerBytes), s.Acked, s.ClaimWaitP99Ms, s.AckP99Ms, s.Rotations, s.Autovacuums)
	}
	tw.Flush()
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
