package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
)

// EngineRow is one engine's line of the per-engine table: the pairs step's
// median end-to-end / raw ratio with its spread and the CPU per event, the
// rebuild's ratios, and the targets met.
type EngineRow struct {
	Engine  string `json:"engine"`
	Version string `json:"version"`
	File    string `json:"file"`
	Smoke   bool   `json:"smoke"`
	// Comparison is the pairs step, nil if the file has none.
	Comparison *Comparison `json:"comparison,omitempty"`
	// Rebuild ratios: against quiet raw _bulk, and against raw _bulk under
	// the same live events; nil without a rebuild step.
	RebuildRatio          *float64 `json:"rebuild_ratio,omitempty"`
	RebuildRatioUnderLive *float64 `json:"rebuild_ratio_under_live,omitempty"`
	TargetsMet            int      `json:"targets_met"`
	Targets               int      `json:"targets"`
}

// engineRows reads the results files, one per engine.
func engineRows(files []string) ([]EngineRow, error) {
	if len(files) == 0 {
		return nil, errors.New("-compare: name the results files, e.g. tools/bench/results/results-*.json")
	}
	var rows []EngineRow
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var r Report
		if err := json.Unmarshal(raw, &r); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		row := EngineRow{Engine: r.Engine.Name, Version: r.Versions.Engine, File: f, Smoke: r.Smoke,
			Targets: len(r.Targets)}
		if row.Engine == "" {
			row.Engine = "?"
		}
		for _, t := range r.Targets {
			if t.Met {
				row.TargetsMet++
			}
		}
		if c := r.Comparison; c != nil && len(c.Pairs) > 0 {
			row.Comparison = c
		}
		if rb := r.Rebuild; rb != nil {
			row.RebuildRatio, row.RebuildRatioUnderLive = &rb.Ratio, &rb.RatioUnderLive
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// compareResults prints one row per results file and, if out is not empty,
// writes the rows there as JSON.
func compareResults(w io.Writer, out string, files []string) error {
	rows, err := engineRows(files)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "engine\tversion\tpairs\traw/s\tend to end/s\te2e/raw median\tmin\tmax\twlproj µs/ev\tpostgres µs/ev\trebuild/raw\trebuild/raw under live\ttargets met\tsmoke\tfile")
	for _, r := range rows {
		pairs := "0\t-\t-\t-\t-\t-\t-\t-"
		if c := r.Comparison; c != nil {
			pairs = fmt.Sprintf("%d\t%.0f\t%.0f\t%.3f\t%.3f\t%.3f\t%.1f\t%.1f", len(c.Pairs), c.RawMedianPerSec,
				c.EndToEndMedianPerSec, c.MedianRatio, c.MinRatio, c.MaxRatio, c.WlprojMicrosPerEvent, c.PostgresMicrosPerEvent)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d/%d\t%t\t%s\n", r.Engine, r.Version, pairs, ratioText(r.RebuildRatio),
			ratioText(r.RebuildRatioUnderLive), r.TargetsMet, r.Targets, r.Smoke, r.File)
	}
	if err := tw.Flush(); err != nil || out == "" {
		return err
	}
	data, err := json.MarshalIndent(rows, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(out, append(data, '\n'), 0o644)
}

func ratioText(r *float64) string {
	if r == nil {
		return "-"
	}
	return fmt.Sprintf("%.3f", *r)
}
