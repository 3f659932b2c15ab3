package leader

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

func TestPeriodicRunsAtOnceThenEveryIntervalUntilDrain(t *testing.T) {
	t.Parallel()
	var rounds atomic.Int32
	first := make(chan int64, 1)
	p := &Periodic{ServiceName: "count", Interval: time.Hour, Log: zerolog.Nop(),
		Once: func(_ context.Context, epoch int64) error {
			if rounds.Add(1) == 1 {
				first <- epoch
			}
			return errors.New("an error does not stop the service")
		}}
	drain := make(chan struct{})
	done := make(chan struct{})
	go func() { defer close(done); p.Run(context.Background(), 7, drain) }()
	require.Equal(t, int64(7), <-first, "the first round runs at once, with the term's epoch")
	close(drain)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after drain")
	}
	require.Equal(t, int32(1), rounds.Load(), "an hour's interval leaves one round")
}

func TestPeriodicStopsWhenLeadershipIsLost(t *testing.T) {
	t.Parallel()
	var rounds atomic.Int32
	p := &Periodic{ServiceName: "tick", Interval: time.Millisecond, Log: zerolog.Nop(),
		Once: func(context.Context, int64) error { rounds.Add(1); return nil }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.Run(ctx, 1, make(chan struct{})) }()
	for rounds.Load() < 3 {
		runtime.Gosched()
	}
	cancel()
	<-done
	n := rounds.Load()
	time.Sleep(20 * time.Millisecond)
	require.Equal(t, n, rounds.Load(), "no round after the context ended")
}

func TestRunAllWaitsForEveryService(t *testing.T) {
	t.Parallel()
	var finished atomic.Int32
	slow := ServiceFunc("slow", func(context.Context, int64, <-chan struct{}) {
		time.Sleep(50 * time.Millisecond)
		finished.Add(1)
	})
	fast := ServiceFunc("fast", func(context.Context, int64, <-chan struct{}) { finished.Add(1) })
	runAll(context.Background(), 1, nil, []Service{slow, fast})
	require.Equal(t, int32(2), finished.Load())
	require.Equal(t, "slow", slow.Name())
}
