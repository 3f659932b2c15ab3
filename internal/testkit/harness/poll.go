package harness

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/wlproj/wlproj/internal/serviceutil"
)

const (
	// PollEvery is the pause between two checks of a condition.
	PollEvery = 20 * time.Millisecond
	// attemptTimeout bounds one check, so a query stuck on a restarting
	// Postgres costs one attempt, not the whole wait.
	attemptTimeout = 2 * time.Second
)

// fatal marks an error that ends a Poll at once.
type fatal struct{ error }

func (f fatal) Unwrap() error { return f.error }

// Fatal wraps err so that Poll returns it at once instead of retrying (the
// replica waited for has exited, say).
func Fatal(err error) error { return fatal{err} }

// Poll checks cond until it holds and returns nil; or returns an error
// naming what when timeout passes or ctx ends. An error from cond is
// retried (Postgres may be restarting) and quoted if the wait times out,
// unless it is wrapped by Fatal.
func Poll(ctx context.Context, timeout time.Duration, what string, cond func(ctx context.Context) (bool, error)) error {
	return PollAt(ctx, PollEvery, timeout, what, cond)
}

// PollAt is Poll checking every every: slower, where a check costs what is
// being measured (a scrape of the leader under a benchmark).
func PollAt(ctx context.Context, every, timeout time.Duration, what string, cond func(ctx context.Context) (bool, error)) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		ok, err := cond(actx)
		cancel()
		if ok {
			return nil
		}
		var f fatal
		if errors.As(err, &f) {
			return f.error
		}
		if err != nil {
			last = err
		}
		if time.Now().After(deadline) {
			if last != nil {
				return fmt.Errorf("timed out after %s waiting for %s (last error: %w)", timeout, what, last)
			}
			return fmt.Errorf("timed out after %s waiting for %s", timeout, what)
		}
		if err := Sleep(ctx, every); err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
	}
}

// Sleep pauses for d, or until ctx ends and returns its error.
var Sleep = serviceutil.Sleep

// Eventually is Poll for tests. cond may fail the test itself (require):
// it runs on the test's goroutine.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	err := Poll(context.Background(), timeout, what, func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		t.Fatal(err)
	}
}

// PollOne polls until exactly one of items() satisfies is, and returns it.
func PollOne[T any](ctx context.Context, timeout time.Duration, what string, items func() []T, is func(T) bool) (T, error) {
	var one T
	err := Poll(ctx, timeout, what, func(context.Context) (bool, error) {
		n := 0
		for _, it := range items() {
			if is(it) {
				one = it
				n++
			}
		}
		return n == 1, nil
	})
	return one, err
}

// EventuallyOne is PollOne for tests, over a fixed set of items.
func EventuallyOne[T any](t testing.TB, timeout time.Duration, what string, items []T, is func(T) bool) T {
	t.Helper()
	one, err := PollOne(context.Background(), timeout, what, func() []T { return items }, is)
	if err != nil {
		t.Fatal(err)
	}
	return one
}
