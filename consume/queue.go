package consume

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
)

// checkpointEvery bounds how often a projection's position is written: once
// a second whatever the rate, so the position row keeps a few thousand
// versions an hour while someone holds the horizon, and a new leader sends
// again at most about a second of events (the engine's external versions
// make that a no-op).
const checkpointEvery = time.Second

// queues follows each projection's position through the batches it has in
// flight. The position saved is always a prefix: a batch confirmed before
// an earlier one waits for it.
type queues struct {
	mu sync.Mutex
	// origin is where a projection without a saved position starts; nil
	// before migration 00018 (no row is queued then).
	origin *outbox.Position
	byName map[string]*queue
	names  []string
	next   int
	// listed is set once the projections producers name were listed this
	// term (refreshQueues); Run's goroutine's.
	listed bool
	// saving serializes checkpoints; savedAt is the last one's time.
	saving  sync.Mutex
	savedAt time.Time
}

// queue is one projection's position.
type queue struct {
	done, claimed outbox.Position
	// resumed is set for a position a predecessor saved, until the term's
	// first read of it that found events (resumedRead).
	resumed bool
	flights []*queueFlight
	// generation changes when the queue rewinds: flights of an earlier one
	// confirm nothing.
	generation int
	doneEvents int64
	dirty      bool
}

// queueFlight is one read in flight, known by its events' first element:
// a read again after a rewind starts at the same row and must not be
// confirmed by the earlier read's acks, nor the earlier by its.
type queueFlight struct {
	head   *outbox.Event
	to     outbox.Position
	since  time.Time
	events int
	acked  bool
}

func newQueues(origin *outbox.Position, saved map[string]outbox.Position) *queues {
	qs := &queues{origin: origin, byName: map[string]*queue{}}
	for name, p := range saved {
		qs.add(name, p)
		qs.byName[name].resumed = true
	}
	return qs
}

// resumedRead reports whether name's read that found events is the term's
// first from a position its predecessor saved, and clears it.
func (qs *queues) resumedRead(name string) bool {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	q := qs.byName[name]
	was := q.resumed
	q.resumed = false
	return was
}

// ready reports whether rows can be queued at all.
func (qs *queues) ready() bool {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	return qs.origin != nil
}

// know adds a position at the origin for each name without one.
func (qs *queues) know(names []string) {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	for _, name := range names {
		if qs.byName[name] == nil && qs.origin != nil {
			qs.add(name, *qs.origin)
		}
	}
}

func (qs *queues) add(name string, p outbox.Position) {
	qs.byName[name] = &queue{done: p, claimed: p}
	qs.names = append(qs.names, name)
	slices.Sort(qs.names)
}

// rotation is the names in the order the next read tries them, starting
// after the one that last gave events.
func (qs *queues) rotation() []string {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	n := len(qs.names)
	out := make([]string, 0, n)
	for i := range n {
		out = append(out, qs.names[(qs.next+i)%n])
	}
	return out
}

// from is where the next read of name starts, with the queue's generation.
func (qs *queues) from(name string) (outbox.Position, int) {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	q := qs.byName[name]
	return q.claimed, q.generation
}

// read records a read of name from generation gen that reached to with
// these events. A read that found none ends its batch as if confirmed at
// once; one that took a new snapshot and found nothing moves nothing, so
// an idle leader writes no position (the next batch starts from the older
// snapshot, which costs nothing: no row lies between).
func (qs *queues) read(name string, gen int, to outbox.Position, events []outbox.Event, at time.Time) {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	q := qs.byName[name]
	if q.generation != gen || len(events) == 0 && q.claimed.Drained() == q.claimed {
		return
	}
	q.claimed = to
	if len(events) == 0 {
		q.flights = append(q.flights, &queueFlight{to: to, acked: true})
		q.settle()
		return
	}
	qs.next = (slices.Index(qs.names, name) + 1) % len(qs.names)
	q.flights = append(q.flights, &queueFlight{head: &events[0], to: to, since: at, events: len(events)})
}

// confirm marks the flight of exactly this read (the same events, not
// another read of the same rows) acked, and moves the confirmed position
// over every acked flight at the front. A read from before a rewind has
// no flight any more and confirms nothing.
func (qs *queues) confirm(events []outbox.Event) {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	q := qs.byName[events[0].Projection]
	if q == nil {
		return
	}
	for _, f := range q.flights {
		if f.head == &events[0] {
			f.acked = true
		}
	}
	q.settle()
}

// settle moves done over the acked flights at the front.
func (q *queue) settle() {
	for len(q.flights) > 0 && q.flights[0].acked {
		f := q.flights[0]
		q.dirty = q.dirty || q.done != f.to
		q.done, q.doneEvents = f.to, q.doneEvents+int64(f.events)
		q.flights = q.flights[1:]
	}
}

// rewindAll sends every projection's reads back to its confirmed
// position: at the end of a drain, what is still unconfirmed is the next
// leader's, and the last checkpoint must not show it in flight.
func (qs *queues) rewindAll() {
	qs.mu.Lock()
	names := slices.Clone(qs.names)
	qs.mu.Unlock()
	for _, name := range names {
		qs.rewind(name)
	}
}

// rewind sends name's reads back to its confirmed position: a flight whose
// ack failed is read again, and so is every flight after it (their events
// go again; external versions make that a no-op).
func (qs *queues) rewind(name string) {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	if q := qs.byName[name]; q != nil {
		// A checkpoint may have shown the flights: the next one clears them.
		q.dirty = q.dirty || len(q.flights) > 0
		q.claimed, q.flights = q.done, nil
		q.generation++
	}
}

// checkpoints are the positions to save at now: those that moved or have
// batches in flight, once the last save is older than checkpointEvery (at
// once when force).
func (qs *queues) checkpoints(now time.Time, force bool) []outbox.Checkpoint {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	if !force && now.Sub(qs.savedAt) < checkpointEvery {
		return nil
	}
	var cps []outbox.Checkpoint
	for _, name := range qs.names {
		q := qs.byName[name]
		if !q.dirty && len(q.flights) == 0 {
			continue
		}
		cp := outbox.Checkpoint{Projection: name, Done: q.done, Claimed: q.claimed, DoneEvents: q.doneEvents}
		if len(q.flights) > 0 {
			cp.InFlightSince = q.flights[0].since
		}
		cps = append(cps, cp)
	}
	return cps
}

// saved clears what cps wrote.
func (qs *queues) saved(cps []outbox.Checkpoint, at time.Time) {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	qs.savedAt = at
	for _, cp := range cps {
		q := qs.byName[cp.Projection]
		q.doneEvents -= cp.DoneEvents
		q.dirty = q.done != cp.Done
	}
}

// checkpoint saves the positions that moved, once checkpointEvery has
// passed (or at once when force). One save at a time; a save already
// running covers this call's positions at the next one.
func (l *Loop) checkpoint(ctx context.Context, epoch int64, force bool) {
	qs := l.queues
	if qs == nil || !qs.saving.TryLock() {
		return
	}
	defer qs.saving.Unlock()
	now := time.Now()
	cps := qs.checkpoints(now, force)
	if len(cps) == 0 {
		return
	}
	if _, err := l.store.SaveCheckpoints(ctx, epoch, l.cfg.Lease, cps); err != nil {
		countError(ctx, ackErrorsTotal, err)
		l.log.Error().Err(err).Msg("saving positions failed; the next checkpoint saves them")
		return
	}
	qs.saved(cps, now)
}

// refreshQueues loads the term's positions at its first claim, and finds
// the origin (once migration 00018 ran) and projections producers started
// naming every PollInterval. A failure leaves the queues as they were: the
// next refresh tries again.
func (l *Loop) refreshQueues(ctx context.Context) {
	if l.queues == nil {
		origin, saved, err := l.store.LoadQueue(ctx)
		if l.queueError(ctx, l.takeLedger(ctx, err), "taking the ledger failed: nothing is claimed or read until it is taken") ||
			l.queueError(ctx, err, "taking the ledger and reading the positions failed") {
			return
		}
		// The term's first read waits for this: the projections producers
		// name beside the loop's own are listed at its next claim, once the
		// first batch is on its way (3 to 10 ms on the takeover path).
		l.queues = newQueues(origin, saved)
		l.queues.know(l.names)
		return
	}
	l.queues.listed = true
	if !l.queues.ready() {
		origin, err := l.store.Origin(ctx)
		if l.queueError(ctx, err, "reading the queue's origin failed") || origin == nil {
			return
		}
		l.queues.setOrigin(*origin)
	}
	names, err := l.store.QueuedProjections(ctx)
	if l.queueError(ctx, err, "listing queued projections failed") {
		return
	}
	l.queues.know(append(names, l.names...))
}

// takeLedger notes whether the term has taken the ledger, after LoadQueue
// returned loadErr: a batch of statements fails whole when one of its
// reads cannot be prepared (a grant missing), so the ledger is then taken
// alone. It returns that take's error, which the caller counts instead of
// LoadQueue's: one failed turn, one claim error.
func (l *Loop) takeLedger(ctx context.Context, loadErr error) error {
	if l.ledgerTaken {
		return nil
	}
	err := loadErr
	if errors.Is(loadErr, outbox.ErrLedgerNotTaken) {
		if err = l.store.TakeLedger(ctx); err != nil {
			l.ledgerTaken = false
			return err
		}
	}
	l.ledgerTaken = err == nil
	return nil
}

// queueError counts and logs a failed read of the queue's state as a claim
// error: queued rows go unread while it lasts (a missing grant, a schema
// behind), and only the claim errors' alert would say so.
func (l *Loop) queueError(ctx context.Context, err error, msg string) bool {
	if err == nil {
		return false
	}
	countError(ctx, claimErrorsTotal, err)
	if ctx.Err() == nil {
		l.log.Error().Err(err).Msg(msg)
	}
	return true
}

// emptyRecheck is how long a projection whose last read found no queued
// row is read after the others: with the default search and chronicle
// projections and only search written to, every read first read the empty
// chronicle, a round trip per batch (2 to 7 ms, the new leader's first
// read included). An event of it then waits at most this long while the
// others keep the loop busy.
const emptyRecheck = 100 * time.Millisecond

// readOrder is the rotation with the projections read empty within
// emptyRecheck moved to its end, in their order.
func (l *Loop) readOrder(now time.Time) []string {
	names := l.queues.rotation()
	recent := func(name string) int {
		if at, ok := l.emptyAt[name]; ok && now.Sub(at) < emptyRecheck {
			return 1
		}
		return 0
	}
	slices.SortStableFunc(names, func(a, b string) int { return recent(a) - recent(b) })
	return names
}

// readQueued reads the next queued rows of the first projection in
// readOrder that has some.
func (l *Loop) readQueued(ctx context.Context, now time.Time) ([]outbox.Event, error) {
	for _, name := range l.readOrder(now) {
		if now.Before(l.unknownUntil[name]) {
			continue // its events wait unread: the same batch until then
		}
		if projection.WaitingFor(l.handlers[name]) != "" {
			continue // read from the same position once it stops waiting
		}
		from, gen := l.queues.from(name)
		events, to, err := l.store.ReadQueued(ctx, name, from, l.cfg.BulkSize, l.latest[name])
		countError(ctx, claimErrorsTotal, err)
		if err != nil {
			return nil, err
		}
		if l.unknownWaits(name, events, now) {
			continue // read again from the same position once unknownUntil passes
		}
		l.queues.read(name, gen, to, events, now)
		if len(events) > 0 {
			delete(l.emptyAt, name)
			l.readRest = l.queues.resumedRead(name) || from.InBatch()
			return events, nil
		}
		l.emptyAt[name] = now
	}
	return nil, nil
}

// unknownWaits is true while events name a projection this replica has no
// handler for and the newest of them is younger than UnknownWait: they are
// left unread, for a leader that knows the projection (a rolling restart
// adding it), and fail as unknown_projection only after that.
func (l *Loop) unknownWaits(name string, events []outbox.Event, now time.Time) bool {
	if _, known := l.handlers[name]; known || len(events) == 0 {
		return false
	}
	if now.Sub(events[len(events)-1].CreatedAt) >= l.cfg.UnknownWait {
		return false
	}
	if _, warned := l.unknownUntil[name]; !warned {
		l.log.Warn().Str("projection", name).Dur("wait", l.cfg.UnknownWait).
			Msg("events name a projection this replica does not know; they wait for a leader that knows it, then fail as unknown_projection")
	}
	l.unknownUntil[name] = events[len(events)-1].CreatedAt.Add(l.cfg.UnknownWait)
	return true
}

func (qs *queues) setOrigin(origin outbox.Position) {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	qs.origin = &origin
}

// settleQueued confirms a read of queued rows once its acks are written,
// and saves positions when a checkpoint is due. A read whose ack failed is
// read again, with every read after it; a fenced one is the next leader's.
func (l *Loop) settleQueued(ctx context.Context, epoch int64, events []outbox.Event, res BatchResult) {
	if res.AckErrors > 0 {
		l.queues.rewind(events[0].Projection)
		return
	}
	if res.Fenced > 0 {
		return
	}
	l.queues.confirm(events)
	l.checkpoint(ctx, epoch, false)
}

// idleFor is how long the loop waits for work: the poll interval, or
// until the checkpoint it still owes is due, so that an idle leader saves
// the position it reached within about a second.
func (l *Loop) idleFor() time.Duration {
	if l.queues == nil || !l.queues.unsaved() {
		return l.cfg.PollInterval
	}
	return min(l.cfg.PollInterval, checkpointEvery)
}

// unsaved reports whether a position moved since the last checkpoint, or
// will once a read in flight is confirmed: an idle loop whose batch was
// still on its way when it went idle slept its whole PollInterval before
// saving what that batch confirmed (a minute in a test; the row showed
// processing all that time).
func (qs *queues) unsaved() bool {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	for _, q := range qs.byName {
		if q.dirty || len(q.flights) > 0 {
			return true
		}
	}
	return false
}
