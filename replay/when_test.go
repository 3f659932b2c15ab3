package replay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseTime(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 6, 10, 12, 0, 0, 0, time.UTC)
	for v, want := range map[string]time.Time{
		"":                     {},
		"24h":                  now.Add(-24 * time.Hour),
		"7d":                   now.Add(-7 * 24 * time.Hour),
		"2025-06-01":           time.Date(2025, 6, 1, 0, 0, 0, 0, time.UTC),
		"2025-06-01T10:00:00Z": time.Date(2025, 6, 1, 10, 0, 0, 0, time.UTC),
	} {
		got, err := ParseTime(v, now)
		require.NoError(t, err, v)
		require.True(t, want.Equal(got), "%s: %s", v, got)
	}
	for _, v := range []string{"yesterday", "-1h", "10x", "2025-13-01"} {
		_, err := ParseTime(v, now)
		require.ErrorContains(t, err, "is neither an RFC3339 time", v)
	}
}
