package main

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

const (
	// produceTick batches the rate into small inserts, as an application
	// writing its outbox rows in its own transactions would.
	produceTick = 50 * time.Millisecond
	// deleteShare of the events are deletes; the next upsert of the same
	// book brings it back at a higher version.
	deleteShare = 0.02
	// lateShare of the versions are written late: the version after goes
	// first and this one up to lateTicksMax inserts after it, as
	// transactions that commit out of order would. A late event lands in the
	// same batch as the newer one, in a batch in flight beside it, or after
	// its ack, when the ledger drops it unsent.
	lateShare    = 0.05
	lateTicksMax = 20
	// unversionedBooks are written with a null event_version, the outbox id
	// ordering them, by a producer of their own at unversionedPerMille of
	// the rate (at least one event a second).
	unversionedBooks    = 20
	unversionedPerMille = 50
	// insertTimeout keeps a Postgres restart from stalling the producer
	// beyond one tick's worth of lost events.
	insertTimeout = 2 * time.Second
)

// books writes the drill's versioned events: versions of entities books in
// a random order, some late, as the admin writes them (producers are the
// application, not wlproj). A failed insert skips the versions it used,
// which is allowed: only their order matters. next is called by one
// producer at a time.
type books struct {
	versions []int64 // newest version handed out per book
	late     []lateEvent
	inserts  int
	body     string
	// lateWritten counts the late events handed out.
	lateWritten atomic.Int64
}

// lateEvent is a version held back until the insert due.
type lateEvent struct {
	due int
	ev  harness.Event
}

func newBooks(entities int) *books {
	return &books{versions: make([]int64, entities), body: strings.Repeat("lorem ipsum ", 10)}
}

// next returns n events: the late ones now due, then new versions.
func (b *books) next(n int) []harness.Event {
	b.inserts++
	events := make([]harness.Event, 0, n)
	waiting := b.late[:0]
	for _, l := range b.late {
		if l.due <= b.inserts && len(events) < n {
			events = append(events, l.ev)
			b.lateWritten.Add(1)
		} else {
			waiting = append(waiting, l)
		}
	}
	b.late = waiting
	for len(events) < n {
		e := rand.IntN(len(b.versions))
		b.versions[e]++
		if rand.Float64() < lateShare {
			b.late = append(b.late, lateEvent{due: b.inserts + 1 + rand.IntN(lateTicksMax), ev: b.event(e, b.versions[e])})
			b.versions[e]++
		}
		events = append(events, b.event(e, b.versions[e]))
	}
	return events
}

// event is version v of book e: an upsert, or now and then a delete.
func (b *books) event(e int, v int64) harness.Event {
	id, lib := strconv.Itoa(e), "lib-"+strconv.Itoa(e%7)
	ev := harness.Event{EntityType: "book", EntityID: id, Op: "upsert", Version: v, ScopeKey: lib}
	if rand.Float64() < deleteShare {
		ev.Op, ev.Payload = "delete", json.RawMessage(`{}`)
		return ev
	}
	ev.Payload, _ = json.Marshal(book(id, "v"+strconv.FormatInt(v, 10), lib, v, b.body))
	return ev
}

// book is a document with the fields of testdata/mapping.json, whose
// dynamic: strict refuses anything else.
func book(id, rev, lib string, position int64, body string) map[string]any {
	return map[string]any{
		"kind": "book", "title": "Book " + id + " " + rev, "body": body,
		"library_id": lib, "position": position, "updated_at": time.Now().UTC().Format(time.RFC3339Nano),
	}
}

// unversionedSQL is an application that does not version its events: the
// outbox id orders them.
const unversionedSQL = `
INSERT INTO outbox_events (entity_type, entity_id, op, payload, scope_key) VALUES ('book', $1, $2, $3, $4)`

// unversioned writes upserts and deletes of a few books of their own
// without an event_version, one at a time, until stopped. harness.Event
// always carries a version, hence a producer of its own.
type unversioned struct {
	cancel    context.CancelFunc
	done      chan struct{}
	committed atomic.Int64
	failed    atomic.Int64
}

func produceUnversioned(ctx context.Context, db harness.Execer, perSecond int) *unversioned {
	ctx, cancel := context.WithCancel(ctx)
	u := &unversioned{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(u.done)
		t := time.NewTicker(time.Second / time.Duration(perSecond))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			id := "u" + strconv.Itoa(rand.IntN(unversionedBooks))
			op, payload := "upsert", any(book(id, "unversioned", "lib-u", 0, ""))
			if rand.Float64() < 4*deleteShare {
				op, payload = "delete", json.RawMessage(`{}`)
			}
			ictx, cancelInsert := context.WithTimeout(context.WithoutCancel(ctx), insertTimeout)
			if _, err := db.Exec(ictx, unversionedSQL, id, op, payload, "lib-u"); err != nil {
				u.failed.Add(1)
			} else {
				u.committed.Add(1)
			}
			cancelInsert()
		}
	}()
	return u
}

func (u *unversioned) stop() {
	u.cancel()
	<-u.done
}

// producers are the drill's two writers. pause and resume keep the books'
// versions and the counts, so a pause is a gap in the stream, nothing more.
type producers struct {
	ctx     context.Context
	db      harness.Execer
	rate    int
	books   *books
	main    *harness.Producer
	side    *unversioned
	running bool
	// Of the writers stopped so far.
	committed, failedInserts, unversionedCommitted int64
}

func newProducers(ctx context.Context, db harness.Execer, rate, entities int) *producers {
	return &producers{ctx: ctx, db: db, rate: rate, books: newBooks(entities)}
}

func (p *producers) resume() {
	if p.running {
		return
	}
	p.running = true
	p.main = harness.Produce(p.ctx, p.db, harness.ProducerConfig{
		Rate: p.rate, Tick: produceTick, InsertTimeout: insertTimeout, Next: p.books.next})
	p.side = produceUnversioned(p.ctx, p.db, max(1, p.rate*unversionedPerMille/1000))
}

// pause stops both writers and waits for their last inserts; it may be
// called more than once.
func (p *producers) pause() {
	if !p.running {
		return
	}
	p.running = false
	p.main.Stop()
	p.side.stop()
	p.committed += p.main.Committed() + p.side.committed.Load()
	p.failedInserts += p.main.FailedInserts() + p.side.failed.Load()
	p.unversionedCommitted += p.side.committed.Load()
}

// Counts once paused: events committed, of which unversioned, inserts that
// failed, late versions.
func (p *producers) counts() (committed, unversioned, failedInserts, late int64) {
	return p.committed, p.unversionedCommitted, p.failedInserts, p.books.lateWritten.Load()
}

// setRate runs the writers at rate from now on: a pause and a resume, so
// the books' versions and the counts carry on.
func (p *producers) setRate(rate int) {
	p.pause()
	p.rate = rate
	p.resume()
}
