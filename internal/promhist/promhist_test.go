package promhist

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCumulativeBuckets(t *testing.T) {
	h := &Histogram{name: "x_seconds", labels: `p="a"`, bounds: []float64{0.1, 1}, counts: make([]uint64, 3)}
	for _, v := range []float64{0.05, 0.1, 0.5, 3} {
		h.Observe(v)
	}
	var buf bytes.Buffer
	h.write(&buf)
	want := strings.Join([]string{
		`x_seconds_bucket{p="a",le="0.1"} 2`,
		`x_seconds_bucket{p="a",le="1"} 3`,
		`x_seconds_bucket{p="a",le="+Inf"} 4`,
		`x_seconds_sum{p="a"} 3.65`,
		`x_seconds_count{p="a"} 4`,
	}, "\n") + "\n"
	require.Equal(t, want, buf.String())
}
