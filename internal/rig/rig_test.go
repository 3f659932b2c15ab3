package rig

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestNewStats(t *testing.T) {
	require.Nil(t, NewStats(nil))
	s := NewStats([]float64{0.3, 0.1, 0.2, 0.4})
	require.Equal(t, &Stats{Min: 0.1, Median: 0.25, Max: 0.4, Samples: []float64{0.3, 0.1, 0.2, 0.4}}, s)
	require.Equal(t, 0.2, NewStats([]float64{0.3, 0.1, 0.2}).Median)
	require.Equal(t, 1.235, Round3(1.23456))
}

func TestPaceAsksForTheRate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var total atomic.Int64
	start := time.Now()
	slow := true
	Pace(ctx, 1000, 10*time.Millisecond, func(n int) {
		total.Add(int64(n))
		if slow {
			// A stalled insert: the ticks it misses are made up for.
			slow = false
			time.Sleep(100 * time.Millisecond)
		}
	})
	elapsed := time.Since(start).Seconds()
	require.InDelta(t, 1000*elapsed, total.Load(), 25, "1000/s over %.3fs", elapsed)
}

func TestRepoRoot(t *testing.T) {
	root, err := RepoRoot()
	require.NoError(t, err)
	require.FileExists(t, root+"/go.mod")
	require.Len(t, RandomHex(4), 8)
}
