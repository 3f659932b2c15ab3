package serviceutil

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSleep(t *testing.T) {
	t.Parallel()
	start := time.Now()
	require.NoError(t, Sleep(context.Background(), 20*time.Millisecond))
	require.GreaterOrEqual(t, time.Since(start), 20*time.Millisecond)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start = time.Now()
	require.ErrorIs(t, Sleep(ctx, time.Hour), context.Canceled)
	require.Less(t, time.Since(start), time.Minute, "an ended context stops the sleep")
}
