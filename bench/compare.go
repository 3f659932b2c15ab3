package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
)

// compareResults prints one row per results file (one per engine): the
// median end-to-end / raw ratio of the pairs step with its spread, the CPU
// per event, and the targets met.
func compareResults(w io.Writer, files []string) error {
	if len(files) == 0 {
		return errors.New("-compare: name the results files, e.g. bench/results-*.json")
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "engine\tversion\tpairs\traw/s\tend to end/s\te2e/raw median\tmin\tmax\twlproj µs/ev\tpostgres µs/ev\trebuild/raw\ttargets met\tsmoke\tfile")
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var r Report
		if err := json.Unmarshal(raw, &r); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		name := r.Engine.Name
		if name == "" {
			name = "?"
		}
		met := 0
		for _, t := range r.Targets {
			if t.Met {
				met++
			}
		}
		rebuild := "-"
		if r.Rebuild != nil {
			rebuild = fmt.Sprintf("%.3f", r.Rebuild.Ratio)
		}
		c := r.Comparison
		if c == nil || len(c.Pairs) == 0 {
			fmt.Fprintf(tw, "%s\t%s\t0\t-\t-\t-\t-\t-\t-\t-\t%s\t%d/%d\t%t\t%s\n", name, r.Versions.Engine, rebuild, met, len(r.Targets), r.Smoke, f)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f\t%.0f\t%.3f\t%.3f\t%.3f\t%.1f\t%.1f\t%s\t%d/%d\t%t\t%s\n", name, r.Versions.Engine, len(c.Pairs),
			c.RawMedianPerSec, c.EndToEndMedianPerSec, c.MedianRatio, c.MinRatio, c.MaxRatio,
			c.WlprojMicrosPerEvent, c.PostgresMicrosPerEvent, rebuild, met, len(r.Targets), r.Smoke, f)
	}
	return tw.Flush()
}
