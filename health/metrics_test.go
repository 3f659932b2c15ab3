package health

import (
	"bytes"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/VictoriaMetrics/metrics"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/buildinfo"
	"github.com/wlproj/wlproj/internal/metrichelp"
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

// A scrape says which build runs: wlproj_build_info, a gauge at 1 with the
// version, commit and Go version as labels, described like our own series.
func TestScrapeHasBuildInfo(t *testing.T) {
	rec := httptest.NewRecorder()
	serveMetrics(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, err := io.ReadAll(rec.Result().Body)
	require.NoError(t, err)
	bi := buildinfo.Get()
	lines := strings.Split(string(body), "\n")
	require.Contains(t, lines, `wlproj_build_info{version="`+bi.Version+`",revision="`+bi.Revision+`",goversion="`+bi.GoVersion+`"} 1`)
	require.Contains(t, lines, "# TYPE wlproj_build_info gauge")
	require.Contains(t, lines, "# HELP wlproj_build_info "+helpText(t, "wlproj_build_info"))
}

func helpText(t *testing.T, name string) string {
	t.Helper()
	h, ok := metrichelp.Help(name)
	require.True(t, ok, "%s has no help text", name)
	return h
}
