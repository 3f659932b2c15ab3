// Package testkit holds what tests and tools (the bench, the drill) use to
// drive wlproj: the harness (stack, databases, replicas, waits) and the
// proxies that put faults between a replica and its servers. No product
// package imports it, and the wlproj binary links none of it.
package testkit

import (
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"
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

// ListenFor listens on a free loopback port for a proxy to target
// (host:port); name prefixes its errors.
func ListenFor(name, target string) (net.Listener, error) {
	if _, _, err := net.SplitHostPort(target); err != nil {
		return nil, fmt.Errorf("%s: target %q: %w", name, target, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("%s: listen: %w", name, err)
	}
	return ln, nil
}

// Accept waits for a proxy's next connection, retrying transient errors;
// false once ln is closed.
func Accept(ln net.Listener) (net.Conn, bool) {
	for {
		conn, err := ln.Accept()
		if err == nil {
			return conn, true
		}
		if errors.Is(err, net.ErrClosed) {
			return nil, false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Reset closes conn with an RST (SO_LINGER 0), as a crashed or partitioned
// peer's kernel would, instead of a FIN.
func Reset(conn net.Conn) {
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}
