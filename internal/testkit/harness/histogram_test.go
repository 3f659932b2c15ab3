package harness

import (
	"testing"

	"github.com/stretchr/testify/require"
)

const lagScrape = `# TYPE lag_seconds histogram
lag_seconds_bucket{le="0.1"} 90
lag_seconds_bucket{le="1"} 99
lag_seconds_bucket{le="10"} 99
lag_seconds_bucket{le="30"} 100
lag_seconds_bucket{le="+Inf"} 100
lag_seconds_sum 20
lag_seconds_count 100
`

func TestHistogramCountsAboveABound(t *testing.T) {
	t.Parallel()
	h, err := ParseHistogram(lagScrape, "lag_seconds")
	require.NoError(t, err)
	require.EqualValues(t, 100, h.Count())
	over, err := h.Above(10)
	require.NoError(t, err)
	require.EqualValues(t, 1, over, "one observation between 10 and 30 s")
	over, err = h.Above(0.1)
	require.NoError(t, err)
	require.EqualValues(t, 10, over)
	_, err = h.Above(5)
	require.ErrorContains(t, err, "no bucket bound", "between two bounds the count is unknown")
	require.Equal(t, 1.0, h.Quantile(0.99))
	require.InDelta(t, 0.05, h.Interpolated(0.45), 1e-9, "half way through the first bucket, from 0")
	require.InDelta(t, 0.55, h.Interpolated(0.945), 1e-9, "half way from 0.1 to 1")
	require.Equal(t, 30.0, h.Interpolated(1), "the last observation's bucket, not an empty one above it")
	require.Equal(t, 30.0, h.Max(), "the highest bucket that holds an observation")
	_, err = ParseHistogram(lagScrape, "other_seconds")
	require.ErrorContains(t, err, "no histogram other_seconds")
}

// Sub isolates what one process observed between two scrapes; Add sums
// processes, and the zero Histogram stands for a process not scraped yet.
func TestHistogramSubAndAdd(t *testing.T) {
	t.Parallel()
	before, err := ParseHistogram(`lag_seconds_bucket{le="1"} 5
lag_seconds_bucket{le="10"} 6
lag_seconds_bucket{le="+Inf"} 6
`, "lag_seconds")
	require.NoError(t, err)
	after, err := ParseHistogram(`lag_seconds_bucket{le="1"} 8
lag_seconds_bucket{le="10"} 9
lag_seconds_bucket{le="+Inf"} 11
`, "lag_seconds")
	require.NoError(t, err)
	between := after.Sub(before)
	require.Equal(t, []float64{3, 3, 5}, between.Cum)
	over, err := between.Above(10)
	require.NoError(t, err)
	require.EqualValues(t, 2, over)
	require.Equal(t, after, after.Sub(Histogram{}))
	require.Equal(t, []float64{11, 12, 16}, Histogram{}.Add(between).Add(after).Cum)
	require.Zero(t, Histogram{}.Max())
	require.Zero(t, Histogram{}.Quantile(0.99))
	require.Equal(t, 10.0, before.Max(), "one observation between 1 and 10")
	require.Equal(t, 1.0, Histogram{Bounds: before.Bounds, Cum: []float64{5, 5, 5}}.Max(), "every observation in the first bucket")
}
