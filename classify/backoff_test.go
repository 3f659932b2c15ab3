package classify

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestBackoffGrowsWithJitterAndHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	base, max := 100*time.Millisecond, 2*time.Second
	for attempts, want := range []time.Duration{100, 200, 400, 800, 1600, 2000, 2000} {
		want *= time.Millisecond
		if attempts == 6 {
			attempts = 40 // no overflow far past the cap
		}
		for range 50 {
			d := Backoff(attempts, base, max, 0)
			require.GreaterOrEqual(t, d, want/2)
			require.LessOrEqual(t, d, want)
		}
	}
	seen := map[time.Duration]bool{}
	for range 50 {
		seen[Backoff(3, base, max, 0)] = true
	}
	require.Greater(t, len(seen), 10, "jitter spreads retries")
	require.Equal(t, 30*time.Second, Backoff(0, base, max, 30*time.Second), "Retry-After is a floor")
}
