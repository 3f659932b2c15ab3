package consume

import (
	"context"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
)

// releaseTimeout bounds the drain's final write.
const releaseTimeout = 5 * time.Second

// Loop claims, projects and acks. One Loop serves one replica; Run is called
// each time the replica becomes leader.
type Loop struct {
	cfg      Config
	store    *outbox.Store
	pool     *pgxpool.Pool
	handlers projection.Registry
	// latest names the projections that opt in to the ledger
	// (projection.LatestOnly): only their events are dropped as stale, and
	// only their applied events move the ledger.
	latest map[string]bool
	// latestNames is latest as the claim takes it: the ledger is read for
	// these projections' events only.
	latestNames []string
	log         zerolog.Logger
	// order is the current term's; Run starts a new one.
	order *order
	// names are the projections the loop has handlers for, which claims
	// past the cursor read.
	names []string
	// cursor is where the term's next claim starts, past the last row it
	// claimed; headAt is when it last claimed from the head instead, which
	// it does every PollInterval for the rows that fall due behind the
	// cursor. Both belong to Run's goroutine.
	cursor *outbox.Cursor
	headAt time.Time
	// headNext is set after a claim from the head that came back full: the
	// head has more, so the next claim starts there too. Run's goroutine's.
	headNext bool
	// queues are the term's positions among queued rows, loaded at its
	// first claim; claimedLast says the last batch was claimed rows, so
	// the next tries queued ones first. Run's goroutine's.
	queues      *queues
	claimedLast bool
	// ledgerTaken says the term's LoadQueue got past taking the ledger, and
	// its barrier: no claim or read comes before. Run's goroutine's.
	ledgerTaken bool
	// unknownUntil is, for each projection whose events the loop left
	// unread for not knowing them (unknownWaits), when the newest of them
	// read is UnknownWait old: it neither reads them again before then
	// (each read would fetch the same batch to leave it again) nor warns
	// again. Run's goroutine's.
	unknownUntil map[string]time.Time
	// readRest says the last batch was the rest of older work (readQueued):
	// queued rows read on in an older snapshot's batch, where fewer than a
	// full batch means that batch ended, not the queue; or a term's first
	// read from its predecessor's saved position, mostly events the
	// predecessor sent already (up to a checkpoint's second of them),
	// which the ledger drops. The loop reads on without its cooldown: the
	// events written since the takeover waited 50 ms behind it (make drill:
	// 8 of 40 takeovers at about 90 ms where the others took 30; since,
	// p99 38 and 50 ms over 40 kills). Run's goroutine's.
	readRest bool
	// emptyAt is, for each projection whose last read of queued rows found
	// none, when: it is read after the others until emptyRecheck has
	// passed (readOrder). Run's goroutine's; kept across terms.
	emptyAt map[string]time.Time
	// headWanted is set by the listener when someone asks for a claim
	// from the head at once (outbox.HeadChannel: a resume, a repair).
	headWanted atomic.Bool
	// prepared is closed once the term's preparation (TermStart.Prepare)
	// is done; no batch goes to a projection before. started reports the
	// term's first batch (TermStart.Started). Both are set by RunWith
	// before the term's first claim and read by the batches' goroutines;
	// a nil prepared is ready.
	prepared <-chan struct{}
	started  func()

	mu       sync.Mutex
	inflight map[int64]struct{}

	// slotWait, set by tests, hears (without blocking) each time the loop
	// has a batch claimed ahead for every bulk lane (pipeline): it then
	// claims nothing more until one of them gets its lanes, which tests
	// wait for instead of sleeping.
	slotWait chan<- struct{}
	// beforeListen, set by tests, runs in the listener before each LISTEN:
	// what it inserts sends its NOTIFY to nobody.
	beforeListen func()
}

// NewLoop validates cfg (after defaults) and builds a loop.
func NewLoop(cfg Config, store *outbox.Store, handlers projection.Registry, log zerolog.Logger) (*Loop, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	names := make([]string, 0, len(handlers))
	for name := range handlers {
		names = append(names, name)
	}
	initCounters(names)
	latest := handlers.LatestOnly()
	return &Loop{cfg: cfg, store: store, pool: store.Pool, handlers: handlers, latest: latest,
		latestNames: slices.Sorted(maps.Keys(latest)), names: slices.Sorted(slices.Values(names)), order: newOrder(),
		log: log.With().Str("service", "consume").Logger(), inflight: map[int64]struct{}{}, unknownUntil: map[string]time.Time{}, emptyAt: map[string]time.Time{}}, nil
}

// Config returns the effective configuration.
func (l *Loop) Config() Config { return l.cfg }

// Name implements leader.Service.
func (l *Loop) Name() string { return "consume" }

// runOnce claims one batch and processes it before returning: the loop's
// work without its pipelining, for tests.
func (l *Loop) runOnce(ctx context.Context, epoch int64) (BatchResult, error) {
	f, err := l.claim(ctx, epoch)
	if err != nil || f == nil {
		return BatchResult{}, err
	}
	l.showInFlight(ctx, epoch, f)
	res, err := l.handle(ctx, epoch, f)
	l.checkpoint(ctx, epoch, true) // what Run does once a second, at once
	return res, err
}

// handle processes a claimed batch once the batches ahead of it that share
// a document are done, and lets the ones behind it go on.
func (l *Loop) handle(ctx context.Context, epoch int64, f *flight) (BatchResult, error) {
	defer l.order.finish(f)
	if f.span != nil {
		defer f.span.End()
		ctx = trace.ContextWithSpan(ctx, f.span)
	}
	if err := l.order.wait(ctx, f); err != nil {
		return BatchResult{}, err
	}
	if err := awaitPrepared(ctx, l.prepared); err != nil {
		return BatchResult{}, err
	}
	if l.started != nil {
		defer l.started()
	}
	return l.process(ctx, epoch, f), nil
}

// claim takes the next batch, in order with the batches of this term.
func (l *Loop) claim(ctx context.Context, epoch int64) (*flight, error) {
	var start, end time.Time
	f, err := l.order.claim(func() ([]outbox.Event, error) {
		start = time.Now()
		events, err := l.next(ctx, epoch, start)
		end = time.Now()
		claimDuration.Observe(end.Sub(start).Seconds())
		return events, err
	})
	if f != nil {
		l.track(f.events)
		f.readStart, f.readEnd = start, end
		f.span = startBatch(ctx, epoch, f.events, start, end)
	}
	return f, err
}

// showInFlight saves the positions once a second at most, so that a
// checkpoint shows f's read in flight. The caller does it once f is on
// its way to its projection: a term's first read always saves (no save
// yet), and that write must not delay the term's first bulk.
func (l *Loop) showInFlight(ctx context.Context, epoch int64, f *flight) {
	if f.events[0].Queued {
		l.checkpoint(ctx, epoch, false)
	}
}

// next takes queued rows by position, or claims rows that need a claim
// (retries, replays, resumed or repaired rows, rows from before migration
// 00018): those are claimed once every PollInterval from the head, at
// once when asked, and in turns with queued reads while both have work,
// so neither starves the other.
func (l *Loop) next(ctx context.Context, epoch int64, now time.Time) ([]outbox.Event, error) {
	l.readRest = false
	rowsDue := l.headWanted.Load() || l.headNext || now.Sub(l.headAt) >= l.cfg.PollInterval
	if l.queues == nil || rowsDue || !l.queues.listed {
		l.refreshQueues(ctx)
	}
	if !l.ledgerTaken {
		// The term has not taken the ledger yet (its barrier waits for the
		// last term's ledger writes, migration 00029): nothing read before
		// it may be judged by the ledger. The next turn tries again.
		return nil, nil
	}
	usable := l.queues != nil && l.queues.ready()
	queuedFirst := usable && (!rowsDue || l.claimedLast)
	if queuedFirst {
		if events, err := l.readQueued(ctx, now); err != nil || len(events) > 0 {
			l.claimedLast = false
			return events, err
		}
	}
	events, err := l.claimRows(ctx, epoch, now, l.fromHead(now))
	l.claimedLast = len(events) > 0
	if err != nil || len(events) > 0 || !usable || queuedFirst {
		return events, err
	}
	return l.readQueued(ctx, now)
}

// claimRows claims rows from the head (head) or past the cursor.
func (l *Loop) claimRows(ctx context.Context, epoch int64, now time.Time, head bool) ([]outbox.Event, error) {
	after := l.cursor
	names, someWait := l.takingEvents()
	if head {
		after, l.headAt = nil, now
		l.headWanted.Store(false)
		if someWait {
			// The claim from the head takes every projection's rows; past
			// the start of time, the claim takes those of names only.
			after = &outbox.Cursor{}
		}
	}
	events, err := l.store.ClaimAfter(ctx, epoch, l.cfg.BulkSize, l.cfg.Lease, l.latestNames, after, names)
	l.headNext = head && len(events) >= l.cfg.BulkSize
	countError(ctx, claimErrorsTotal, err)
	if c := outbox.CursorOf(events); c != nil && (l.cursor == nil || c.After(*l.cursor)) {
		l.cursor = c
	}
	return events, err
}

// takingEvents are the projections whose events the loop claims now: all it
// has handlers for but those that wait (projection.Waits), and whether any
// waits. The rows of one that waits stay pending, unclaimed and without an
// attempt counted, and the next claim from the head after it stops waiting
// (within PollInterval) takes them.
func (l *Loop) takingEvents() ([]string, bool) {
	waits := func(name string) bool { return projection.WaitingFor(l.handlers[name]) != "" }
	if !slices.ContainsFunc(l.names, waits) {
		return l.names, false
	}
	return slices.DeleteFunc(slices.Clone(l.names), waits), true
}

// fromHead reports whether the claim starting now starts from the head
// rather than past the cursor: at the start of a term, once every
// PollInterval (rows that fell due behind the cursor: a producer's
// transaction that committed late, a released row), when asked
// (headWanted), and for as long as the head returns full batches, so that
// a backlog behind the cursor drains at the loop's full rate.
func (l *Loop) fromHead(now time.Time) bool {
	return l.cursor == nil || l.headWanted.Load() || l.headNext || now.Sub(l.headAt) >= l.cfg.PollInterval
}

// Run drains the outbox as leader of epoch until ctx is cancelled
// (leadership lost: stop at once, write nothing more) or drain is closed
// (shutdown: stop claiming, let in-flight bulks finish within the grace
// period, put the rest back to pending without counting an attempt).
func (l *Loop) Run(ctx context.Context, epoch int64, drain <-chan struct{}) {
	l.RunWith(ctx, epoch, drain, TermStart{})
}

// TermStart is what a term's start has besides the loop's own work.
type TermStart struct {
	// Prepare, if set, runs at the start of the term beside the loop's
	// first reads, and the term's first batch goes to its projection once
	// it has returned: a new leader's first event waits for the longer of
	// the two, not for their sum (a search index's set-up is a round trip
	// to the engine, as long as the loop's first reads).
	Prepare func(context.Context)
	// Started, if set, is called once in the term, when its first batch
	// has been processed or its first claim found nothing (or failed).
	Started func()
}

// RunWith is Run with start's preparation and report.
func (l *Loop) RunWith(ctx context.Context, epoch int64, drain <-chan struct{}, start TermStart) {
	l.beginTerm(ctx, start)
	wake := make(chan struct{}, 1)
	listenCtx, stopListen := context.WithCancel(ctx)
	defer stopListen()
	listening := newListening()
	go l.listen(listenCtx, listening, wake)

	workCtx, cancelWork := context.WithCancel(ctx)
	defer cancelWork()
	var wg sync.WaitGroup
	p := l.startDispatcher(ctx, workCtx, epoch, &wg, drain)
	poll := time.NewTimer(0)
	defer poll.Stop()
	var backoff claimBackoff

	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return
		case <-drain:
			l.drain(ctx, epoch, &wg, cancelWork)
			return
		default:
		}
		// Claim while earlier batches are in flight, up to one waiting
		// batch per bulk lane: the next batches are ready the moment bulks
		// return, so the engine never waits on Postgres.
		if !l.roomAhead(ctx, p, drain) {
			continue
		}
		f, err := l.claim(ctx, epoch)
		if err == nil {
			backoff.reset()
		}
		if f != nil {
			if len(f.events) >= quietAfter {
				listening.set(false) // claiming after each cooldown anyway
			}
			l.send(ctx, epoch, f, p, drain)
			continue
		}
		<-p.ahead // nothing claimed: the room is free again
		l.started()
		if err != nil && ctx.Err() == nil {
			// Counted as a claim error where it failed; logged once per
			// step of the backoff, which the next success resets.
			wait := backoff.next()
			l.log.Error().Err(err).Int("failures_in_a_row", backoff.failures).Dur("retry_in", wait).Msg("claim failed")
			l.checkpoint(ctx, epoch, false)
			waitAfterFailedClaim(ctx, wait, drain)
			continue
		}
		listening.set(true) // a wake-up follows LISTEN: rows inserted meanwhile are claimed
		l.checkpoint(ctx, epoch, false)
		l.idle(ctx, poll, l.idleFor(), wake, drain)
	}
}

// send hands a claimed batch to the dispatcher and, after less than a
// full batch of new work, cools down so that a trickle is claimed in
// batches.
func (l *Loop) send(ctx context.Context, epoch int64, f *flight, p pipeline, drain <-chan struct{}) {
	p.handoff <- f // never blocks: p.ahead holds f's place
	l.showInFlight(ctx, epoch, f)
	if len(f.events) < l.cfg.BulkSize && !l.readRest {
		l.cooldown(ctx, drain)
	}
}

// beginTerm resets the loop's state for a new term and starts its
// preparation.
func (l *Loop) beginTerm(ctx context.Context, start TermStart) {
	l.prepared = startPreparing(ctx, start.Prepare)
	l.started = func() {}
	if start.Started != nil {
		l.started = sync.OnceFunc(start.Started)
	}
	l.order, l.cursor, l.headNext, l.headAt, l.queues, l.ledgerTaken = newOrder(), nil, false, time.Time{}, nil, false
	// The term's first claim reads queued rows first, as after a claim of
	// rows: a takeover under load finds its events there, and the claim
	// from the head every new term makes comes next, a few ms later.
	l.claimedLast = true
}

// startPreparing runs prepare aside with ctx and returns a channel closed
// once it has returned; a closed one for no prepare.
func startPreparing(ctx context.Context, prepare func(context.Context)) <-chan struct{} {
	done := make(chan struct{})
	if prepare == nil {
		close(done)
		return done
	}
	go func() {
		defer close(done)
		prepare(ctx)
	}()
	return done
}

// awaitPrepared waits for the term's preparation (nil: none), or ctx.
func awaitPrepared(ctx context.Context, prepared <-chan struct{}) error {
	if prepared == nil {
		return nil
	}
	select {
	case <-prepared:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// lanes bound a term's batches in flight: bulks, the projection writes in
// flight at once (Concurrency), and batches, those and as many again past
// their writes, acking. A batch frees its bulk lane when its writes return,
// not after its acks: held through them, the engine waited on every
// batch's Postgres round trips (end to end was 0.80 of the engine's raw
// _bulk, the engine idle 17% of the run).
type lanes struct{ bulks, batches chan struct{} }

// pipeline is a term's lanes and the batches claimed ahead of them: ahead
// holds a place for each batch claimed and not yet in its lanes, one per
// bulk lane at most, and handoff carries them, in claim order, to the
// dispatcher. One batch ahead was not enough: two bulks that share the
// engine finish together, and the second lane then waited for the next
// read (the engine, pinned to a core, idle 21% of the end-to-end run).
type pipeline struct {
	lanes
	ahead   chan struct{}
	handoff chan *flight
}

func newPipeline(concurrency int) pipeline {
	return pipeline{lanes: lanes{bulks: make(chan struct{}, concurrency), batches: make(chan struct{}, 2*concurrency)},
		ahead: make(chan struct{}, concurrency), handoff: make(chan *flight, concurrency)}
}

// roomAhead takes a place for the next claim; false if ctx ends or the
// drain starts first. A test's slotWait hears when every place is taken:
// the loop then claims nothing more until a batch gets its lanes.
func (l *Loop) roomAhead(ctx context.Context, p pipeline, drain <-chan struct{}) bool {
	if len(p.ahead) == cap(p.ahead) {
		l.signal(l.slotWait)
	}
	return acquire(ctx, drain, p.ahead)
}

// take waits for a batch lane, then a bulk lane; false if ctx ends or the
// drain starts first.
func (s lanes) take(ctx context.Context, drain <-chan struct{}) bool {
	if !acquire(ctx, drain, s.batches) {
		return false
	}
	if !acquire(ctx, drain, s.bulks) {
		<-s.batches
		return false
	}
	return true
}

func acquire(ctx context.Context, drain <-chan struct{}, lane chan struct{}) bool {
	select {
	case lane <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	case <-drain:
		return false
	}
}

// startDispatcher starts the term's dispatcher, counted in wg, and returns
// the pipeline it serves.
func (l *Loop) startDispatcher(ctx, workCtx context.Context, epoch int64, wg *sync.WaitGroup, drain <-chan struct{}) pipeline {
	p := newPipeline(l.cfg.Concurrency)
	wg.Add(1)
	go l.dispatchInOrder(ctx, workCtx, epoch, p, wg, drain)
	return p
}

// dispatchInOrder runs each batch handed off, in claim order, in a
// goroutine of its own once it has its lanes: in order, so that a batch
// waiting for an earlier one of its documents (order.wait) never holds the
// lane that earlier one waits for. It returns when ctx ends or the drain
// starts; the batches it leaves were tracked when claimed, and the drain
// or the next leader puts them back.
func (l *Loop) dispatchInOrder(ctx, workCtx context.Context, epoch int64, p pipeline, wg *sync.WaitGroup, drain <-chan struct{}) {
	defer wg.Done()
	for {
		var f *flight
		select {
		case f = <-p.handoff:
		case <-ctx.Done():
			return
		case <-drain:
			return
		}
		if !p.take(ctx, drain) {
			return
		}
		<-p.ahead
		wg.Add(1) // while this goroutine's own count holds wg above zero
		f.projected = sync.OnceFunc(func() { <-p.bulks })
		go func() {
			defer wg.Done()
			defer func() { <-p.batches }()
			defer f.projected()
			_, _ = l.handle(workCtx, epoch, f) // the batch logs and counts its own result
		}()
	}
}

// signal tells a test's channel, if any, without ever blocking the loop.
func (l *Loop) signal(ch chan<- struct{}) {
	if ch == nil {
		return
	}
	select {
	case ch <- struct{}{}:
	default:
	}
}

// cooldown lets events accumulate after a claim that found less than a
// full batch: the next claim then takes what arrived meanwhile in one go.
func (l *Loop) cooldown(ctx context.Context, drain <-chan struct{}) {
	t := time.NewTimer(l.cfg.ClaimCooldown)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	case <-drain:
	}
}

// idle waits for a NOTIFY, the poll interval, or the end of the term.
func (l *Loop) idle(ctx context.Context, poll *time.Timer, wait time.Duration, wake <-chan struct{}, drain <-chan struct{}) {
	if !poll.Stop() {
		select {
		case <-poll.C:
		default:
		}
	}
	poll.Reset(wait)
	select {
	case <-wake:
	case <-poll.C:
	case <-ctx.Done():
	case <-drain:
	}
}

func (l *Loop) drain(ctx context.Context, epoch int64, wg *sync.WaitGroup, cancelWork context.CancelFunc) {
	l.log.Info().Dur("grace", l.cfg.ShutdownGrace).Msg("draining: stopped claiming")
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-ctx.Done():
	case <-time.After(l.cfg.ShutdownGrace):
		l.log.Warn().Msg("grace period over; cancelling in-flight bulks")
	}
	cancelWork()
	<-finished
	if ctx.Err() != nil {
		return // not leader anymore: the next leader reclaims what is left
	}
	if l.queues != nil {
		l.queues.rewindAll()
	}
	l.checkpoint(ctx, epoch, true)
	ids := l.untrackAll()
	if len(ids) == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, releaseTimeout)
	defer cancel()
	released, err := l.store.Release(rctx, epoch, ids)
	l.log.Info().Int("released", len(released)).Int("unfinished", len(ids)).Err(err).Msg("returned unfinished events to pending")
}

func (l *Loop) track(events []outbox.Event) {
	l.mu.Lock()
	for _, e := range events {
		l.inflight[e.ID] = struct{}{}
	}
	l.mu.Unlock()
}

func (l *Loop) untrack(ids []int64) {
	l.mu.Lock()
	for _, id := range ids {
		delete(l.inflight, id)
	}
	l.mu.Unlock()
}

func (l *Loop) untrackAll() []int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	ids := make([]int64, 0, len(l.inflight))
	for id := range l.inflight {
		ids = append(ids, id)
	}
	clear(l.inflight)
	return ids
}
