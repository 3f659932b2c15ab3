package consume

import (
	"context"
	"time"

	"github.com/wlproj/wlproj/outbox"
)

// listen turns NOTIFYs from the insert trigger into wake-ups; polling covers
// the gaps while it reconnects.
func (l *Loop) listen(ctx context.Context, wake chan<- struct{}) {
	for ctx.Err() == nil {
		err := func() error {
			conn, err := l.pool.Acquire(ctx)
			if err != nil {
				return err
			}
			defer conn.Release()
			if _, err := conn.Exec(ctx, "LISTEN "+outbox.NotifyChannel); err != nil {
				return err
			}
			// A connection that was LISTENing must not go back to the pool.
			defer conn.Conn().Close(context.Background())
			for {
				if _, err := conn.Conn().WaitForNotification(ctx); err != nil {
					return err
				}
				select {
				case wake <- struct{}{}:
				default:
				}
			}
		}()
		if ctx.Err() != nil {
			return
		}
		l.log.Warn().Err(err).Msg("listen failed; relying on polling until it reconnects")
		select {
		case <-ctx.Done():
		case <-time.After(l.cfg.PollInterval):
		}
	}
}
