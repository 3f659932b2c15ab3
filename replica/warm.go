package replica

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wlproj/wlproj/leader"
)

// warmEvery is how often a standby tops its pool's open connections up.
const warmEvery = 30 * time.Second

// warmConns is how many open connections a standby keeps: the new leader's
// first reads, its listener and the read of its rebuild view run at once,
// then an ack per bulk in flight.
func (r *Replica) warmConns() int { return r.cfg.Consume.Concurrency + 2 }

// keepWarm keeps warmConns connections of the pool open while the replica
// stands by, so that a takeover runs its first statements on connections
// already open: a new one costs a handshake and authentication, about 10 ms
// here under load, as much as the rest of the first reads (four
// statements at once on a pool of two idle connections took 18 ms, one
// after the other on one 4 ms). The split check's statement on every idle
// connection, every half ServerCheckInterval, keeps them from going idle
// for long; the pool closes them only past its lifetime (an hour), after
// which this opens new ones.
func (r *Replica) keepWarm(ctx context.Context) {
	ticker := time.NewTicker(warmEvery)
	defer ticker.Stop()
	for {
		if r.elector.State().Role == leader.RoleStandby {
			warmPool(ctx, r.pool, r.warmConns())
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// warmPool opens connections until n are open, if the pool has fewer idle
// ones, and leaves them idle.
func warmPool(ctx context.Context, pool *pgxpool.Pool, n int) {
	if int(pool.Stat().IdleConns()) >= n {
		return
	}
	conns := make([]*pgxpool.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range n {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return // the database is away: the next round tries again
		}
		conns = append(conns, c)
	}
}
