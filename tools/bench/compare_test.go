package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCompareResults: one row per results file, the pairs' median and
// spread and the rebuild ratios carried over, and the same rows as JSON.
func TestCompareResults(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name string, r Report) string {
		data, err := json.Marshal(r)
		require.NoError(t, err)
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, data, 0o644))
		return path
	}
	es := Report{Engine: Engine{Name: "elasticsearch-8"}, Targets: []Target{{Met: true}, {Met: false}},
		Comparison: &Comparison{Pairs: []Pair{{Ratio: 0.5}, {Ratio: 0.7}}, MedianRatio: 0.6, MinRatio: 0.5, MaxRatio: 0.7},
		Rebuild:    &RebuildResult{Ratio: 0.4, RatioUnderLive: 0.9}}
	es.Versions.Engine = "8.19.21"
	os2 := Report{Engine: Engine{Name: "opensearch-2"}}
	files := []string{write("es.json", es), write("os.json", os2)}

	var table strings.Builder
	out := filepath.Join(dir, "engines.json")
	require.NoError(t, compareResults(&table, out, files))
	lines := strings.Split(strings.TrimSpace(table.String()), "\n")
	require.Len(t, lines, 3)
	require.Regexp(t, `^elasticsearch-8\s+8\.19\.21\s+2\s.*0\.600\s+0\.500\s+0\.700\s.*0\.400\s+0\.900\s+1/2`, lines[1])
	require.Regexp(t, `^opensearch-2\s.*\s0\s+-`, lines[2])

	var rows []EngineRow
	data, err := os.ReadFile(out)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &rows))
	require.Len(t, rows, 2)
	require.Equal(t, 0.6, rows[0].Comparison.MedianRatio)
	require.Equal(t, 0.9, *rows[0].RebuildRatioUnderLive)
	require.Nil(t, rows[1].Comparison)

	require.ErrorContains(t, compareResults(&table, "", nil), "name the results files")
	require.ErrorContains(t, compareResults(&table, "", []string{filepath.Join(dir, "nope.json")}), "nope.json")
}
