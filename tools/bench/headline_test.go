package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// committedResults are the results files in the repository: results.json,
// make bench's default output, is ignored by git until named.
func committedResults(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("results/*.json")
	require.NoError(t, err)
	var out []string
	for _, f := range files {
		if filepath.Base(f) != "results.json" {
			out = append(out, f)
		}
	}
	require.NotEmpty(t, out)
	return out
}

// TestHeadlineIsTheResults: the README's table and the soak picture are
// what -headline writes from the committed results, so a figure changed
// by hand, or a run committed without them, fails here.
func TestHeadlineIsTheResults(t *testing.T) {
	files := committedResults(t)
	dir := t.TempDir()
	readme, picture := filepath.Join(dir, "README.md"), filepath.Join(dir, "soak-lag.svg")
	committed, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(readme, committed, 0o644))
	// The links in the table are relative to the repository's root.
	for i, f := range files {
		files[i] = "tools/bench/" + f
	}
	t.Chdir("../..")
	require.NoError(t, writeHeadline(readme, picture, files))
	written, err := os.ReadFile(readme)
	require.NoError(t, err)
	require.Equal(t, string(committed), string(written), "README.md's table: run go run ./tools/bench -headline README.md tools/bench/results/*.json")
	drawn, err := os.ReadFile(picture)
	require.NoError(t, err)
	svg, err := os.ReadFile("tools/bench/results/soak-lag.svg")
	require.NoError(t, err)
	require.Equal(t, string(svg), string(drawn), "soak-lag.svg: run the same command")
}

// TestHeadlinePicksTheNewestRunOfEachMeasure: the newest file with a
// target gives its row, a smoke run none, and a measure no file has says
// so rather than leaving the row out.
func TestHeadlinePicksTheNewestRunOfEachMeasure(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	day := time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)
	write := func(name string, daysLater int, smoke bool, value float64) string {
		r := Report{FinishedAt: day.AddDate(0, 0, daysLater), Smoke: smoke, Engine: Engine{Name: "opensearch-3"},
			Failover: &Failover{},
			Targets:  []Target{{Measure: "kill -9 to first event applied p99, 20 kills at 200/s", Goal: "<= 50", Value: value, Unit: "ms", Met: value <= 50}}}
		data, err := json.Marshal(r)
		require.NoError(t, err)
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, data, 0o644))
		return path
	}
	old, newer := write("a.json", 0, false, 40), write("b.json", 2, false, 61)
	smoke := write("c.json", 5, true, 1)
	rows, err := readHeadlines([]string{newer, smoke, old})
	require.NoError(t, err)
	table := headlineTable(rows)
	require.Contains(t, table, "| kill -9 to the first event applied, p99 | 61 ms | <= 50 ms | **no** |")
	require.Contains(t, table, "2026-11-22, [opensearch-3]("+newer+")")
	require.Contains(t, table, "`make bench BENCH_FLAGS='-steps failover'`")
	require.Contains(t, table, "| Postgres path alone | not measured |")

	_, err = replaceHeadline("# no markers\n", table)
	require.ErrorContains(t, err, "bench:headline")
}
