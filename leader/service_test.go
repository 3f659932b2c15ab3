package leader

import (
	"context"
	"errors"
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
	third := make(chan struct{})
	p := &Periodic{ServiceName: "tick", Interval: time.Millisecond, Log: zerolog.Nop(),
		Once: func(context.Context, int64) error {
			if rounds.Add(1) == 3 {
				close(third)
			}
			return nil
		}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.Run(ctx, 1, make(chan struct{})) }()
	waitFor(t, third, "three rounds")
	cancel()
	waitFor(t, done, "Run to return once the context ended")
}

func TestRunAllWaitsForEveryService(t *testing.T) {
	t.Parallel()
	var finished atomic.Int32
	release, fastDone := make(chan struct{}), make(chan struct{})
	slow := ServiceFunc("slow", func(context.Context, int64, <-chan struct{}) {
		<-release
		finished.Add(1)
	})
	fast := ServiceFunc("fast", func(context.Context, int64, <-chan struct{}) { finished.Add(1); close(fastDone) })
	returned := make(chan struct{})
	var atReturn int32
	go func() {
		defer close(returned)
		runAll(context.Background(), 1, nil, []Service{slow, fast})
		atReturn = finished.Load()
	}()
	waitFor(t, fastDone, "the fast service")
	select {
	case <-returned:
		t.Fatal("runAll returned while a service still ran")
	default:
	}
	close(release)
	waitFor(t, returned, "runAll to return")
	require.Equal(t, int32(2), atReturn, "both services had finished when runAll returned")
}

// waitFor fails the test unless ch closes within 5 s.
func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}
