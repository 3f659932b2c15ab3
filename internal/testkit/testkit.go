// Package testkit holds what tests and tools (the bench, the drill) use to
// drive wlproj: the harness (stack, databases, replicas, waits) and the
// proxies that put faults between a replica and its servers. No product
// package imports it, and the wlproj binary links none of it.
package testkit

import (
	"io"
	"testing"
)

// Closing fails t on err, or else closes v when the test ends and returns
// it: the test form of a constructor, as in
// testkit.Closing(t)(New(target)).
func Closing[T io.Closer](t testing.TB) func(v T, err error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = v.Close() })
		return v
	}
}
