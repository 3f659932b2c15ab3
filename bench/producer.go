package main

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"time"

	"github.com/wlproj/wlproj/internal/rig"
)

// produceTick spreads the rate over small inserts, as an application
// writing its outbox rows in its own transactions would.
const produceTick = 10 * time.Millisecond

// producer inserts upserts of new books at a steady rate.
type producer struct {
	committed atomic.Int64
	err       error
	cancel    context.CancelFunc
	done      chan struct{}
}

// startProducer writes rate events per second of books numbered from first.
func (b *bench) startProducer(ctx context.Context, rate, first int) *producer {
	ctx, cancel := context.WithCancel(ctx)
	p := &producer{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		next := first
		rig.Pace(ctx, rate, produceTick, func(n int) {
			if p.err != nil {
				return
			}
			ids, payloads := make([]string, n), make([]json.RawMessage, n)
			for i := range n {
				ids[i], payloads[i] = entityID(next), doc(next, b.cfg.DocBytes)
				next++
			}
			// Not cancelled by stop: the count of committed events must be exact.
			ictx, cancelInsert := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancelInsert()
			if _, err := b.pool.Exec(ictx, `
				INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload, scope_key)
				SELECT 'book', u.id, 'upsert', 1, u.payload, 'lib-' || (u.id::int % 97)
				  FROM unnest($1::text[], $2::jsonb[]) AS u(id, payload)`, ids, payloads); err != nil {
				p.err = err
				return
			}
			p.committed.Add(int64(n))
		})
	}()
	return p
}

// stop ends the producer and returns how many events it committed.
func (p *producer) stop() (int64, error) {
	p.cancel()
	<-p.done
	return p.committed.Load(), p.err
}
