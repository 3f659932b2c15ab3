package health

import (
	"bytes"
	"strings"
	"testing"

	"github.com/VictoriaMetrics/metrics"
	"github.com/stretchr/testify/require"
)

// Every wlproj series carries the help text its package wrote, not the
// fallback meant for Go's runtime series.
func TestEveryOutboxSeriesHasItsOwnHelp(t *testing.T) {
	var raw, out bytes.Buffer
	metrics.WritePrometheus(&raw, false)
	writeLintClean(&out, &raw)
	seen := 0
	for line := range strings.SplitSeq(out.String(), "\n") {
		rest, ok := strings.CutPrefix(line, "# HELP outbox_")
		if !ok {
			continue
		}
		seen++
		name, text, _ := strings.Cut(rest, " ")
		require.NotEqual(t, helpFor("go_anything"), text, "outbox_%s has no help of its own", name)
		require.NotEmpty(t, text)
	}
	require.GreaterOrEqual(t, seen, 5, "the consume and leader series are registered in this binary")
}
