package harness

import (
	"cmp"
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Event is one outbox row as an application writes it.
type Event struct {
	EntityType string
	EntityID   string
	Op         string
	Version    int64
	Payload    json.RawMessage
	ScopeKey   string
}

// Execer is a pool, a connection or a transaction.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

const insertSQL = `
INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload, scope_key)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::jsonb[], $6::text[])`

// Insert writes events in one statement, as one application transaction.
func Insert(ctx context.Context, db Execer, events []Event) error {
	types, ids, ops := make([]string, len(events)), make([]string, len(events)), make([]string, len(events))
	versions, payloads, scopes := make([]int64, len(events)), make([]json.RawMessage, len(events)), make([]string, len(events))
	for i, e := range events {
		types[i], ids[i], ops[i], versions[i], payloads[i], scopes[i] = e.EntityType, e.EntityID, e.Op, e.Version, e.Payload, e.ScopeKey
	}
	_, err := db.Exec(ctx, insertSQL, types, ids, ops, versions, payloads, scopes)
	return err
}

// ProducerConfig says what a Producer writes and how fast.
type ProducerConfig struct {
	// Rate is the events per second asked for.
	Rate int
	// Tick spreads the rate over small inserts, as an application writing
	// its rows in its own transactions would. Defaults to 10ms.
	Tick time.Duration
	// InsertTimeout bounds one insert. Defaults to 10s.
	InsertTimeout time.Duration
	// Writers, when not zero, writes each event in a transaction of its
	// own, this many connections at a time: an application that commits
	// each change alone, as pgbench's one-insert script does, makes the
	// outbox see one transaction (and one xid) per event instead of one
	// per tick. Defaults to 0: each tick's events in one insert.
	Writers int
	// Next returns the next n events to write.
	Next func(n int) []Event
}

// Producer writes events at a steady rate until stopped.
type Producer struct {
	committed atomic.Int64
	failed    atomic.Int64
	mu        sync.Mutex
	err       error
	cancel    context.CancelFunc
	done      chan struct{}
}

// Produce starts a producer. A failed insert (Postgres restarting, say)
// loses its events, as the application's transaction would have failed,
// and is counted; the producer goes on.
func Produce(ctx context.Context, db Execer, cfg ProducerConfig) *Producer {
	ctx, cancel := context.WithCancel(ctx)
	p := &Producer{cancel: cancel, done: make(chan struct{})}
	timeout := cmp.Or(cfg.InsertTimeout, 10*time.Second)
	insert := func(events []Event) {
		// Not cancelled by Stop: the count of committed events is exact.
		ictx, cancelInsert := context.WithTimeout(context.WithoutCancel(ctx), timeout)
		defer cancelInsert()
		if err := Insert(ictx, db, events); err != nil {
			p.failed.Add(1)
			p.mu.Lock()
			p.err = err
			p.mu.Unlock()
			return
		}
		p.committed.Add(int64(len(events)))
	}
	go func() {
		defer close(p.done)
		pace(ctx, cfg.Rate, cmp.Or(cfg.Tick, 10*time.Millisecond), func(n int) {
			events := cfg.Next(n)
			if cfg.Writers == 0 {
				insert(events)
				return
			}
			oneByOne(events, cfg.Writers, insert)
		})
	}()
	return p
}

// oneByOne inserts each event alone, writers at a time (each takes every
// writers-th event), and returns when all are written.
func oneByOne(events []Event, writers int, insert func([]Event)) {
	var wg sync.WaitGroup
	for w := range min(writers, len(events)) {
		wg.Go(func() {
			for i := w; i < len(events); i += writers {
				insert(events[i : i+1])
			}
		})
	}
	wg.Wait()
}

// Stop ends the producer and waits for its last insert; it may be called
// more than once.
func (p *Producer) Stop() {
	p.cancel()
	<-p.done
}

// Committed is the number of events written.
func (p *Producer) Committed() int64 { return p.committed.Load() }

// FailedInserts is the number of inserts that wrote nothing.
func (p *Producer) FailedInserts() int64 { return p.failed.Load() }

// Err is the last insert's error, nil if none failed.
func (p *Producer) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// pace calls insert every tick with the number of events due, so that rate
// events a second are asked for since the start; a late tick (a busy
// machine) asks for what the ticks it missed would have, until ctx ends.
func pace(ctx context.Context, rate int, tick time.Duration, insert func(n int)) {
	t := time.NewTicker(tick)
	defer t.Stop()
	start := time.Now()
	var asked int64
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			due := int64(float64(rate) * now.Sub(start).Seconds())
			if n := due - asked; n > 0 {
				asked = due
				insert(int(n))
			}
		}
	}
}
