package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"
)

// The README's benchmark section opens with the headline table, written
// between these two lines by -headline from the committed results, so the
// figures a reader sees first are the files' own (TestHeadlineIsTheResults).
const (
	headlineBegin = "<!-- bench:headline: written by `go run ./tools/bench -headline README.md tools/bench/results/*.json` -->"
	headlineEnd   = "<!-- /bench:headline -->"
)

// headline is one row of the table: a target the bench judges, read from
// the newest results file (not a smoke run) that has it.
type headline struct {
	Label string
	// Measure matches the Target.Measure the row reads.
	Measure *regexp.Regexp
	// Anchor is the figure the measure is judged beside, where there is
	// one: the engine's raw _bulk, River, the bare SQL loop.
	Anchor func(r *Report) string
}

var headlines = []headline{
	{"End to end ÷ the engine's raw `_bulk`", regexp.MustCompile(`^end-to-end / raw bulk, median`), func(r *Report) string {
		if c := r.Comparison; c != nil {
			return fmt.Sprintf("raw `_bulk` %.0f events/s", c.RawMedianPerSec)
		}
		return ""
	}},
	{"Postgres path ÷ River's no-op jobs", regexp.MustCompile(`^daemon Postgres path ÷ River`), func(r *Report) string {
		if rv := r.River; rv != nil {
			return fmt.Sprintf("River %s %.0f jobs/s", rv.Version, rv.RiverMedianJobsPerSec)
		}
		return ""
	}},
	{"Postgres path alone", regexp.MustCompile(`^postgres path alone$`), func(r *Report) string {
		if p := r.PostgresPath; p != nil && p.Bare != nil {
			return fmt.Sprintf("bare SQL loop %.0f events/s", p.Bare.MedianEventsPerSec)
		}
		return ""
	}},
	{"kill -9 to the first event applied, p99", regexp.MustCompile(`^kill -9 to first event applied p99`), failoverAnchor},
	{"Soak: lag p99, worst window", regexp.MustCompile(`^soak .*: lag p99, worst of`), nil},
	{"Soak: lag p99, last window ÷ first", regexp.MustCompile(`^soak .*: lag p99, last window / first`), nil},
	{"Soak: Postgres CPU per event, last window ÷ first", regexp.MustCompile(`^soak .*: Postgres CPU per event, last window / first`), soakCPUAnchor},
	{"Soak: wlproj's oldest snapshot", regexp.MustCompile(`^soak: oldest wlproj snapshot`), nil},
	{"Claim beside a done history ÷ empty", regexp.MustCompile(`^claim cost ratio$`), func(r *Report) string {
		if c := r.ClaimCost; c != nil {
			return fmt.Sprintf("empty table %.2f ms; %d done rows", c.EmptyMedianMs, c.DoneRows)
		}
		return ""
	}},
	{"Rebuild's load ÷ raw `_bulk`", regexp.MustCompile(`^rebuild load / raw bulk$`), func(r *Report) string {
		if rb := r.Rebuild; rb != nil {
			return fmt.Sprintf("raw `_bulk` %.0f docs/s", rb.RawPerSec)
		}
		return ""
	}},
	{"Two search projections ÷ one", regexp.MustCompile(`^two search projections sharing one leader`), nil},
}

// soakCPUAnchor is the first and last windows' figures, and the retention
// the soak ran with (its outbox rotating, or growing all through the run).
func soakCPUAnchor(r *Report) string {
	so := r.Soak
	if so == nil || len(so.Windows) < 2 {
		return ""
	}
	retention := "7-day retention: no rotation"
	if so.RetentionSeconds > 0 {
		retention = fmt.Sprintf("retention %s, %d rotations", time.Duration(so.RetentionSeconds*float64(time.Second)), so.Rotations[outboxTable])
	}
	return fmt.Sprintf("%.0f → %.0f µs per event; %s", so.Windows[0].PostgresAllCPUPerEv,
		so.Windows[len(so.Windows)-1].PostgresAllCPUPerEv, retention)
}

func failoverAnchor(r *Report) string {
	if f := r.Failover; f != nil && f.Seconds != nil {
		return fmt.Sprintf("median %.0f ms over %d kills", f.Seconds.Median*1000, f.Rounds)
	}
	return ""
}

// headlineRow is one line of the table, with where it came from.
type headlineRow struct {
	headline
	Target  *Target
	Report  *Report
	File    string
	Command string
}

// readHeadlines picks, for each headline, the newest non-smoke file with
// its target.
func readHeadlines(files []string) ([]headlineRow, error) {
	if len(files) == 0 {
		return nil, errors.New("-headline: name the results files, e.g. tools/bench/results/*.json")
	}
	rows := make([]headlineRow, len(headlines))
	for i, h := range headlines {
		rows[i].headline = h
	}
	for _, f := range files {
		r, err := readReport(f)
		if err != nil || r == nil || r.Smoke {
			if err != nil {
				return nil, err
			}
			continue
		}
		for i := range rows {
			t := r.target(rows[i].Measure)
			if t != nil && (rows[i].Report == nil || r.FinishedAt.After(rows[i].Report.FinishedAt)) {
				rows[i].Target, rows[i].Report, rows[i].File, rows[i].Command = t, r, f, r.command()
			}
		}
	}
	return rows, nil
}

// readReport reads one results file; nil for a file of another shape (the
// per-engine table engines.json).
func readReport(file string) (*Report, error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	if bytes.HasPrefix(bytes.TrimSpace(raw), []byte("[")) {
		return nil, nil
	}
	var r Report
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return &r, nil
}

func (r *Report) target(measure *regexp.Regexp) *Target {
	for i := range r.Targets {
		if measure.MatchString(r.Targets[i].Measure) {
			return &r.Targets[i]
		}
	}
	return nil
}

// command is how the run was made: its flags when the report has them
// (runs since the headline table), else the steps its figures show.
func (r *Report) command() string {
	if r.Command != "" {
		return r.Command
	}
	steps := r.stepsRun()
	if len(steps) == len(stepFields) {
		return "make bench"
	}
	return "make bench BENCH_FLAGS='-steps " + strings.Join(steps, ",") + "'"
}

// stepFields says which step fills which part of the report.
var stepFields = []struct {
	step string
	ran  func(r *Report) bool
}{
	{"raw", func(r *Report) bool { return r.RawBulk != nil }},
	{"e2e", func(r *Report) bool { return r.EndToEnd != nil }},
	{"pg", func(r *Report) bool { return r.PostgresPath != nil }},
	{"latency", func(r *Report) bool { return r.Latency != nil }},
	{"failover", func(r *Report) bool { return r.Failover != nil }},
	{"claim", func(r *Report) bool { return r.ClaimCost != nil }},
	{"retention", func(r *Report) bool { return r.Retention != nil }},
	{"pairs", func(r *Report) bool { return r.Comparison != nil }},
	{"rebuild", func(r *Report) bool { return r.Rebuild != nil }},
	{"console", func(r *Report) bool { return r.Console != nil }},
	{"sustained", func(r *Report) bool { return len(r.Sustained) > 0 }},
	{"verify", func(r *Report) bool { return r.Verify != nil }},
	{"sqlscale", func(r *Report) bool { return r.SQLScale != nil }},
	{"netdelay", func(r *Report) bool { return r.NetDelay != nil }},
	{"river", func(r *Report) bool { return r.River != nil }},
	{"projections", func(r *Report) bool { return r.TwoProjections != nil }},
	{"soak", func(r *Report) bool { return r.Soak != nil }},
}

func (r *Report) stepsRun() []string {
	var steps []string
	for _, s := range stepFields {
		if s.ran(r) {
			steps = append(steps, s.step)
		}
	}
	return steps
}

// headlineTable is the Markdown table of rows.
func headlineTable(rows []headlineRow) string {
	var b strings.Builder
	b.WriteString("| measure | wlproj | goal | met | beside | run | command |\n")
	b.WriteString("|---|---|---|---|---|---|---|\n")
	for _, row := range rows {
		if row.Target == nil {
			fmt.Fprintf(&b, "| %s | not measured | | | | | |\n", row.Label)
			continue
		}
		t, anchor := row.Target, ""
		if row.Anchor != nil {
			anchor = row.Anchor(row.Report)
		}
		fmt.Fprintf(&b, "| %s | %s | %s %s | %s | %s | %s, [%s](%s) | `%s` |\n", row.Label, figure(t.Value, t.Unit),
			t.Goal, t.Unit, map[bool]string{true: "yes", false: "**no**"}[t.Met], anchor,
			row.Report.FinishedAt.Format("2006-01-02"), row.Report.Engine.Name, row.File, row.Command)
	}
	return b.String()
}

// figure writes a value with its unit: rates whole, ratios and times to
// three significant digits.
func figure(v float64, unit string) string {
	if math.Abs(v) >= 1000 {
		return fmt.Sprintf("%.0f %s", v, unit)
	}
	return fmt.Sprintf("%.3g %s", v, unit)
}

// sortedFiles orders the files so that ties in finished_at resolve the
// same way whatever order the shell gave them in.
func sortedFiles(files []string) []string {
	out := append([]string(nil), files...)
	sort.Strings(out)
	return out
}
