// Package serviceutil holds what the daemon's long-running loops (leader
// services, the rebuild, the test harness's polls) share.
package serviceutil

import (
	"context"
	"time"
)

// Sleep pauses for d, or until ctx ends and returns its error. Unlike
// time.After in a select, it releases its timer at once when ctx ends.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
