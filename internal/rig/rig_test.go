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
	var ticks, total atomic.Int64
	// 250/s in 10ms ticks is 2.5 a tick: the fraction carries over.
	Pace(ctx, 250, 10*time.Millisecond, func(n int) {
		require.Contains(t, []int{2, 3}, n)
		ticks.Add(1)
		total.Add(int64(n))
	})
	require.Positive(t, ticks.Load())
	require.InDelta(t, 2.5*float64(ticks.Load()), total.Load(), 1)
}

func TestRepoRoot(t *testing.T) {
	root, err := RepoRoot()
	require.NoError(t, err)
	require.FileExists(t, root+"/go.mod")
	require.Len(t, RandomHex(4), 8)
}
