package leader

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// While the database cannot be reached the elector keeps ticking: /healthz
// (and the systemd watchdog, and a kubelet's liveness probe) hang off its
// ticks, and a database outage must not get the replica restarted.
func TestElectorTicksWhileTheDatabaseIsDown(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close()) // a port nothing listens on: connections refused
	e, err := New(Config{DatabaseURL: "postgres://u@" + addr + "/db?connect_timeout=1", WorkerID: "a",
		TickInterval: 50 * time.Millisecond, RetryInterval: 100 * time.Millisecond}, zerolog.Nop())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	first := e.LastTick()
	harness.Eventually(t, 3*time.Second, "a tick after failed connection attempts", func() bool {
		return e.LastTick().After(first.Add(500 * time.Millisecond))
	})
}
