package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSummaryCountsFailsAndRanksBySlowness: each run's counts leave
// subtests out, a failed test and a package that failed to build are named,
// and the slowest list is ordered across runs.
func TestSummaryCountsFailsAndRanksBySlowness(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	es7 := filepath.Join(dir, "elasticsearch-7.json")
	require.NoError(t, os.WriteFile(es7, []byte(strings.Join([]string{
		`{"Action":"run","Package":"github.com/wlproj/wlproj/e2e","Test":"TestA"}`,
		`{"Action":"pass","Package":"github.com/wlproj/wlproj/e2e","Test":"TestA/sub","Elapsed":9}`,
		`{"Action":"pass","Package":"github.com/wlproj/wlproj/e2e","Test":"TestA","Elapsed":12.5}`,
		`{"Action":"fail","Package":"github.com/wlproj/wlproj/e2e","Test":"TestB","Elapsed":3}`,
		`{"Action":"skip","Package":"github.com/wlproj/wlproj/e2e","Test":"TestC","Elapsed":0}`,
		`{"Action":"fail","Package":"github.com/wlproj/wlproj/e2e","Elapsed":20}`,
		`# github.com/wlproj/wlproj/cli [build failed]`,
		`{"Action":"fail","Package":"github.com/wlproj/wlproj/cli","Elapsed":0}`,
	}, "\n")), 0o644))
	os2 := filepath.Join(dir, "opensearch-2-engine-facing.json")
	require.NoError(t, os.WriteFile(os2, []byte(
		`{"Action":"pass","Package":"github.com/wlproj/wlproj/verify","Test":"TestV","Elapsed":30}`+"\n"+
			`{"Action":"pass","Package":"github.com/wlproj/wlproj/verify","Elapsed":31}`+"\n"), 0o644))

	var out strings.Builder
	require.NoError(t, run(&out, 2, []string{es7, os2}))
	text := out.String()
	require.Regexp(t, `elasticsearch-7\s+1\s+1\s+1\s+20\n`, text)
	require.Regexp(t, `opensearch-2-engine-facing\s+1\s+0\s+0\s+31\n`, text)
	require.Contains(t, text, "FAILED on elasticsearch-7: e2e TestB\n")
	require.Contains(t, text, "FAILED on elasticsearch-7: cli (the package)\n")
	require.Regexp(t, `slowest tests:\n\s+30\.0s\s+opensearch-2-engine-facing\s+verify TestV\n\s+12\.5s\s+elasticsearch-7\s+e2e TestA\n$`, text)

	require.Error(t, run(&out, 2, nil))
}
