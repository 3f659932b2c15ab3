package main

import (
	"bytes"
	"errors"
	"fmt"
	"image/color"
	"os"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// gonum/plot draws the picture: axes, ticks and legends are not the
// daemon's business, and its SVG output is plain text that diffs in review.

// soakLagPicture draws the lag p99 of each soak window of the newest soak
// run with the vacuum horizon held and of the newest without, beside the
// 250 ms goal: the measure a table row reduces to its worst window.
func soakLagPicture(reports []*Report) ([]byte, error) {
	held, unheld := newestSoak(reports, true), newestSoak(reports, false)
	if held == nil && unheld == nil {
		return nil, errors.New("-headline: no soak run among the results")
	}
	p := plot.New()
	p.Title.Text = "Soak at 2,000 events/s: lag p99 of each window"
	p.X.Label.Text = "minutes into the run"
	p.Y.Label.Text = "lag p99, ms"
	p.Y.Min, p.Y.Max = 0, 300 // the goal and room above it; more data widens it
	p.Legend.Top, p.Legend.Left = false, true
	p.Legend.XOffs, p.Legend.YOffs = vg.Points(8), vg.Points(8)
	for _, s := range []struct {
		r     *Report
		name  string
		color color.Color
	}{{unheld, "horizon not held", color.RGBA{B: 200, A: 255}}, {held, "horizon held, minutes 5 to 25", color.RGBA{R: 200, A: 255}}} {
		if s.r == nil {
			continue
		}
		if err := addWindows(p, s.r, s.name, s.color); err != nil {
			return nil, err
		}
	}
	goal, err := plotter.NewLine(plotter.XYs{{X: 0, Y: 250}, {X: p.X.Max, Y: 250}})
	if err != nil {
		return nil, err
	}
	goal.Dashes = []vg.Length{vg.Points(4), vg.Points(4)}
	p.Add(goal)
	p.Legend.Add("goal: 250 ms", goal)
	return svgBytes(p)
}

// newestSoak is the newest report with soak windows, held or not.
func newestSoak(reports []*Report, held bool) *Report {
	var newest *Report
	for _, r := range reports {
		if r.Soak == nil || len(r.Soak.Windows) == 0 || (r.Soak.Hold != nil) != held {
			continue
		}
		if newest == nil || r.FinishedAt.After(newest.FinishedAt) {
			newest = r
		}
	}
	return newest
}

func addWindows(p *plot.Plot, r *Report, name string, c color.Color) error {
	pts := make(plotter.XYs, len(r.Soak.Windows))
	for i, w := range r.Soak.Windows {
		pts[i].X = (w.StartSeconds + r.Soak.WindowSeconds/2) / 60
		pts[i].Y = w.LagP99ms
	}
	line, points, err := plotter.NewLinePoints(pts)
	if err != nil {
		return err
	}
	line.Color, points.Color, points.Shape = c, c, draw.CircleGlyph{}
	p.Add(line, points)
	p.Legend.Add(fmt.Sprintf("%s (%s)", name, r.FinishedAt.Format("2006-01-02")), line, points)
	return nil
}

// svgBytes renders p as SVG without embedded fonts: a viewer's sans-serif
// reads as well, and the file stays a few kilobytes.
func svgBytes(p *plot.Plot) ([]byte, error) {
	c := vgsvg.NewWith(vgsvg.UseWH(7*vg.Inch, 3.5*vg.Inch), vgsvg.EmbedFonts(false))
	p.Draw(draw.New(c))
	var b bytes.Buffer
	if _, err := c.WriteTo(&b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// writeHeadline puts the table between the README's markers and the
// picture beside the results.
func writeHeadline(readme, picture string, files []string) error {
	files = sortedFiles(files)
	rows, err := readHeadlines(files)
	if err != nil {
		return err
	}
	var reports []*Report
	for _, f := range files {
		if r, err := readReport(f); err == nil && r != nil && !r.Smoke {
			reports = append(reports, r)
		}
	}
	svg, err := soakLagPicture(reports)
	if err != nil {
		return err
	}
	text, err := os.ReadFile(readme)
	if err != nil {
		return err
	}
	out, err := replaceHeadline(string(text), headlineTable(rows))
	if err != nil {
		return fmt.Errorf("%s: %w", readme, err)
	}
	if err := os.WriteFile(picture, svg, 0o644); err != nil {
		return err
	}
	return os.WriteFile(readme, []byte(out), 0o644)
}

// replaceHeadline swaps what lies between the markers for table.
func replaceHeadline(text, table string) (string, error) {
	begin, end := strings.Index(text, headlineBegin), strings.Index(text, headlineEnd)
	if begin < 0 || end < begin {
		return "", fmt.Errorf("no %q … %q lines to write the table between", headlineBegin, headlineEnd)
	}
	return text[:begin+len(headlineBegin)] + "\n" + table + text[end:], nil
}
