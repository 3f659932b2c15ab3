package consume

import (
	"context"
	"time"
)

// A claim that fails (a schema the leader's SQL does not fit, during a
// rollback; a revoked grant; Postgres restarting) fails the same way on
// the next try, and every NOTIFY would bring that try at once: 133 tries
// and as many error lines in one second were seen. So a failed claim
// waits, longer after each failure in a row, before the next; a claim that
// succeeds (even an empty one) resets it.
const (
	claimBackoffFirst = 100 * time.Millisecond
	claimBackoffMax   = 2 * time.Second
)

// claimBackoff is the wait before the next claim after failures in a row.
type claimBackoff struct {
	failures int
}

// next counts a failure and returns how long to wait before trying again:
// 100 ms, doubled per failure in a row, at most 2 s: under a fault that
// ends (Postgres restarting under a leader that keeps its lock) the claim
// after it comes at most 2 s late.
func (b *claimBackoff) next() time.Duration {
	d := claimBackoffFirst << min(b.failures, 16)
	b.failures++
	return min(d, claimBackoffMax)
}

// reset forgets the failures: the last claim succeeded.
func (b *claimBackoff) reset() { b.failures = 0 }

// waitAfterFailedClaim waits d, ignoring wake-ups (they are what made the
// tries as frequent as the inserts), until ctx ends or drain closes.
func waitAfterFailedClaim(ctx context.Context, d time.Duration, drain <-chan struct{}) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	case <-drain:
	}
}
