package metrichelp

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDescribeThenHelp(t *testing.T) {
	Describe(map[string]string{"x_total": "Things."})
	text, ok := Help("x_total")
	require.True(t, ok)
	require.Equal(t, "Things.", text)
	_, ok = Help("y_total")
	require.False(t, ok)
}
