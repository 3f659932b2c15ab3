package harness

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestNewStats(t *testing.T) {
	t.Parallel()
	require.Nil(t, NewStats(nil))
	s := NewStats([]float64{0.3, 0.1, 0.2, 0.4})
	require.Equal(t, &Stats{Min: 0.1, Median: 0.25, P99: 0.4, Max: 0.4, Samples: []float64{0.3, 0.1, 0.2, 0.4}}, s)
	samples := make([]float64, 200)
	for i := range samples {
		samples[i] = float64(200 - i)
	}
	require.Equal(t, 198.0, NewStats(samples).P99, "the 198th of 200 samples in order")
	require.Equal(t, 0.2, NewStats([]float64{0.3, 0.1, 0.2}).Median)
	require.Equal(t, 1.235, Round3(1.23456))
}

func TestWriteJSONCreatesTheDirectory(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "a", "b.json")
	require.NoError(t, WriteJSON(path, map[string]int{"n": 1}))
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, "{\n  \"n\": 1\n}\n", string(b))
}

func TestRepoRootAndNames(t *testing.T) {
	t.Parallel()
	require.FileExists(t, filepath.Join(Root(t), "go.mod"))
	require.Len(t, UniqueName("x_"), 14)
	require.NotEqual(t, UniqueName(""), UniqueName(""))
	u, err := UserURL("postgres://admin:old@h:5432/db?sslmode=disable", "", "new")
	require.NoError(t, err)
	require.Equal(t, "postgres://admin:new@h:5432/db?sslmode=disable", u)
}

func TestParseMetric(t *testing.T) {
	t.Parallel()
	scrape := "# HELP x\nouter_total 3\nouter_total{by=\"auto\"} 2\nouter 1.5e+00\nbad 1x\n"
	for name, want := range map[string]float64{"outer_total": 3, `outer_total{by="auto"}`: 2, "outer": 1.5} {
		v, ok, err := ParseMetric(scrape, name)
		require.NoError(t, err)
		require.True(t, ok, name)
		require.Equal(t, want, v, name)
	}
	_, ok, err := ParseMetric(scrape, "outer_tot")
	require.NoError(t, err)
	require.False(t, ok)
	_, _, err = ParseMetric(scrape, "bad")
	require.Error(t, err)
}
