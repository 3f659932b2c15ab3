package harness

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestHistogramQuantile(t *testing.T) {
	scrape := `# TYPE x_seconds histogram
x_seconds_bucket{le="0.001"} 90
x_seconds_bucket{le="0.005"} 98
x_seconds_bucket{le="0.01"} 100
x_seconds_bucket{le="+Inf"} 100
x_seconds_sum 0.2
x_seconds_count 100
y_seconds_bucket{le="+Inf"} 0
`
	for q, want := range map[float64]float64{0.5: 0.001, 0.9: 0.001, 0.95: 0.005, 0.99: 0.01} {
		got, err := HistogramQuantile(scrape, "x_seconds", q)
		require.NoError(t, err)
		require.Equal(t, want, got, "q=%v", q)
	}
	got, err := HistogramQuantile(scrape, "y_seconds", 0.99)
	require.NoError(t, err)
	require.Zero(t, got, "no observations")
	_, err = HistogramQuantile(scrape, "z_seconds", 0.99)
	require.ErrorContains(t, err, "no histogram z_seconds")
	inf, err := HistogramQuantile("w_bucket{le=\"1\"} 0\nw_bucket{le=\"+Inf\"} 3\n", "w", 0.5)
	require.NoError(t, err)
	require.True(t, math.IsInf(inf, 1))
}
