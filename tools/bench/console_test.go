package main

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// The console step runs end to end on a small table; its times are the
// bench's business, not a test's.
func TestBenchConsoleRuns(t *testing.T) {
	t.Parallel()
	db := harness.NewDatabase(t)
	rep, err := benchConsole(context.Background(), db.Pool, ConsoleBenchConfig{Rows: 2000, Samples: 2})
	require.NoError(t, err)
	require.Equal(t, 2000, rep.FailedRows)
	for _, name := range []string{"first_screen", "filter_reason", "filter_scope", "filter_text", "last_page", "overview"} {
		require.Positive(t, rep.Pages[name].MedianMs, name)
	}
}
