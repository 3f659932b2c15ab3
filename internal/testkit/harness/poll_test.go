package harness

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPollReturnsAsSoonAsCondHolds(t *testing.T) {
	t.Parallel()
	calls := 0
	start := time.Now()
	err := Poll(context.Background(), time.Minute, "the third call", func(context.Context) (bool, error) {
		calls++
		return calls == 3, nil
	})
	require.NoError(t, err)
	require.Equal(t, 3, calls)
	require.Less(t, time.Since(start), 2*PollEvery+200*time.Millisecond, "two pauses, not the timeout")
}

func TestPollTimesOutNamingWhatAndTheLastError(t *testing.T) {
	t.Parallel()
	start := time.Now()
	err := Poll(context.Background(), 100*time.Millisecond, "godot", func(context.Context) (bool, error) {
		return false, errors.New("connection refused")
	})
	require.EqualError(t, err, "timed out after 100ms waiting for godot (last error: connection refused)")
	require.GreaterOrEqual(t, time.Since(start), 100*time.Millisecond)

	err = Poll(context.Background(), 50*time.Millisecond, "godot", func(context.Context) (bool, error) { return false, nil })
	require.EqualError(t, err, "timed out after 50ms waiting for godot")
}

func TestPollStopsAtAFatalErrorAndAtCtx(t *testing.T) {
	t.Parallel()
	gone := errors.New("replica exited")
	calls := 0
	err := Poll(context.Background(), time.Minute, "x", func(context.Context) (bool, error) {
		calls++
		return false, Fatal(gone)
	})
	require.ErrorIs(t, err, gone)
	require.Equal(t, 1, calls)

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err = Poll(ctx, time.Minute, "x", func(context.Context) (bool, error) { return false, nil })
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, Sleep(ctx, time.Minute), context.DeadlineExceeded)
}

// fakeTB records what Eventually fails with, instead of failing this test.
type fakeTB struct {
	testing.TB
	failed string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Fatal(args ...any) {
	f.failed = fmt.Sprint(args...)
	runtime.Goexit()
}

func TestEventuallyFailsWithTheMessage(t *testing.T) {
	t.Parallel()
	f := &fakeTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Eventually(f, 60*time.Millisecond, "the cows to come home", func() bool { return false })
	}()
	<-done
	require.Equal(t, "timed out after 60ms waiting for the cows to come home", f.failed)

	Eventually(t, time.Second, "true", func() bool { return true })
}

func TestEventuallyOneWantsExactlyOne(t *testing.T) {
	t.Parallel()
	require.Equal(t, 3, EventuallyOne(t, time.Second, "one odd", []int{2, 3, 4}, func(n int) bool { return n%2 == 1 }))
	_, err := PollOne(context.Background(), 50*time.Millisecond, "one even", func() []int { return []int{2, 3, 4} },
		func(n int) bool { return n%2 == 0 })
	require.EqualError(t, err, "timed out after 50ms waiting for one even")
}
