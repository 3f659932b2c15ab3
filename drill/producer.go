package main

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wlproj/wlproj/internal/rig"
)

const (
	// produceTick batches the rate into small inserts, as an application
	// writing its outbox rows in its own transactions would.
	produceTick = 50 * time.Millisecond
	// deleteShare of the events are deletes; the next upsert of the same
	// book brings it back at a higher version.
	deleteShare = 0.02
	// insertTimeout keeps a Postgres restart from stalling the producer
	// beyond one tick's worth of lost events.
	insertTimeout = 2 * time.Second
)

// The payload fits testdata/mapping.json, whose dynamic: strict refuses
// anything else.
const produceSQL = `
INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload, scope_key)
SELECT 'book', u.e, u.op, u.v,
       CASE WHEN u.op = 'delete' THEN '{}'::jsonb ELSE
       jsonb_build_object('kind', 'book', 'title', 'Book ' || u.e || ' v' || u.v,
                          'body', repeat('lorem ipsum ', 10), 'library_id', 'lib-' || (u.e::int % 7),
                          'position', u.v, 'updated_at', now()) END,
       'lib-' || (u.e::int % 7)
  FROM unnest($1::text[], $2::text[], $3::bigint[]) AS u(e, op, v)`

// producer writes events at a steady rate, several versions per book, as
// the admin role (producers are the application, not wlproj).
type producer struct {
	pool     *pgxpool.Pool
	rate     int
	versions []int64 // newest version handed out per book

	committed atomic.Int64
	errors    atomic.Int64
	cancel    context.CancelFunc
	done      chan struct{}
}

func startProducer(ctx context.Context, pool *pgxpool.Pool, rate, entities int) *producer {
	ctx, cancel := context.WithCancel(ctx)
	p := &producer{pool: pool, rate: rate, versions: make([]int64, entities), cancel: cancel, done: make(chan struct{})}
	go p.run(ctx)
	return p
}

func (p *producer) run(ctx context.Context) {
	defer close(p.done)
	rig.Pace(ctx, p.rate, produceTick, func(n int) { p.insert(ctx, n) })
}

func (p *producer) insert(ctx context.Context, n int) {
	ids, ops, vers := make([]string, n), make([]string, n), make([]int64, n)
	for i := range n {
		e := rand.IntN(len(p.versions))
		p.versions[e]++
		ids[i], vers[i], ops[i] = strconv.Itoa(e), p.versions[e], "upsert"
		if rand.Float64() < deleteShare {
			ops[i] = "delete"
		}
	}
	ictx, cancel := context.WithTimeout(ctx, insertTimeout)
	defer cancel()
	// A failed insert (Postgres restarting) loses its events, as the
	// application's transaction would have failed; the versions it used are
	// skipped, which is allowed: only their order matters.
	if _, err := p.pool.Exec(ictx, produceSQL, ids, ops, vers); err != nil {
		p.errors.Add(1)
		return
	}
	p.committed.Add(int64(n))
}

// stop ends the producer and waits for its last insert.
func (p *producer) stop() {
	p.cancel()
	<-p.done
}
