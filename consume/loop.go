package consume

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/wlproj/wlproj/classify"
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

	mu       sync.Mutex
	inflight map[int64]struct{}
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
		latestNames: slices.Sorted(maps.Keys(latest)), order: newOrder(),
		log: log.With().Str("service", "consume").Logger(), inflight: map[int64]struct{}{}}, nil
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
	return l.handle(ctx, epoch, f)
}

// handle processes a claimed batch once the batches ahead of it that share
// a document are done, and lets the ones behind it go on.
func (l *Loop) handle(ctx context.Context, epoch int64, f *flight) (BatchResult, error) {
	defer l.order.finish(f)
	if err := l.order.wait(ctx, f); err != nil {
		return BatchResult{}, err
	}
	return l.process(ctx, epoch, f.events), nil
}

// claim takes the next batch, in order with the batches of this term.
func (l *Loop) claim(ctx context.Context, epoch int64) (*flight, error) {
	f, err := l.order.claim(func() ([]outbox.Event, error) {
		start := time.Now()
		events, err := l.store.Claim(ctx, epoch, l.cfg.BulkSize, l.cfg.Lease, l.latestNames)
		claimDuration.Observe(time.Since(start).Seconds())
		return events, err
	})
	if f != nil {
		l.track(f.events)
	}
	return f, err
}

// Run drains the outbox as leader of epoch until ctx is cancelled
// (leadership lost: stop at once, write nothing more) or drain is closed
// (shutdown: stop claiming, let in-flight bulks finish within the grace
// period, put the rest back to pending without counting an attempt).
func (l *Loop) Run(ctx context.Context, epoch int64, drain <-chan struct{}) {
	l.order = newOrder()
	wake := make(chan struct{}, 1)
	listenCtx, stopListen := context.WithCancel(ctx)
	defer stopListen()
	go l.listen(listenCtx, wake)

	workCtx, cancelWork := context.WithCancel(ctx)
	defer cancelWork()
	slots := make(chan struct{}, l.cfg.Concurrency)
	var wg sync.WaitGroup
	poll := time.NewTimer(0)
	defer poll.Stop()

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
		// Claim before waiting for a free bulk slot: the next batch is ready
		// the moment a bulk returns, so the engine never waits on Postgres.
		// At most one batch waits so, within its lease like the others.
		f, err := l.claim(ctx, epoch)
		if f != nil {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				continue // stops above; the next leader reclaims the batch
			case <-drain:
				continue // stops above; the drain releases the tracked batch
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-slots }()
				_, _ = l.handle(workCtx, epoch, f) // the batch logs and counts its own result
			}()
			if len(f.events) < l.cfg.BulkSize {
				l.cooldown(ctx, drain)
			}
			continue
		}
		if err != nil && ctx.Err() == nil {
			l.log.Error().Err(err).Msg("claim failed")
		}
		l.idle(ctx, poll, wake, drain)
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
func (l *Loop) idle(ctx context.Context, poll *time.Timer, wake <-chan struct{}, drain <-chan struct{}) {
	if !poll.Stop() {
		select {
		case <-poll.C:
		default:
		}
	}
	poll.Reset(l.cfg.PollInterval)
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
	ids := l.untrackAll()
	if len(ids) == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, releaseTimeout)
	defer cancel()
	released, err := l.store.Release(rctx, epoch, ids)
	l.log.Info().Int("released", len(released)).Int("unfinished", len(ids)).Err(err).Msg("returned unfinished events to pending")
}

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

// BatchResult summarises one processed batch.
type BatchResult struct {
	Done, Superseded, Retried, Failed, Fenced int
}

// outcome is what a batch's results mean for its rows, before any write.
type outcome struct {
	done []int64
	// superseded holds the cause of every done row that changed nothing:
	// causeLedger (never sent) or causeProjection (the handler said so).
	superseded map[int64]string
	failures   []outbox.Failure
}

// Causes of a superseded event, the label of outbox_superseded_total.
const (
	causeLedger     = "ledger"
	causeProjection = "projection"
)

// applied is the done rows that changed the projection: the ledger moves
// forward for these.
func (o outcome) applied() []int64 {
	ids := make([]int64, 0, len(o.done))
	for _, id := range o.done {
		if o.superseded[id] == "" {
			ids = append(ids, id)
		}
	}
	return ids
}

// ledgerEvents are the events of ids the ack actually changed.
func ledgerEvents(byID map[int64]outbox.Event, acked map[int64]float64, ids []int64) []outbox.Event {
	events := make([]outbox.Event, 0, len(ids))
	for _, id := range ids {
		if _, ok := acked[id]; ok {
			events = append(events, byID[id])
		}
	}
	return events
}

// ledgerIDs is the subset of applied of the projections that keep a ledger.
func (l *Loop) ledgerIDs(byID map[int64]outbox.Event, applied []int64) []int64 {
	ids := applied[:0:0]
	for _, id := range applied {
		if l.latest[byID[id].Projection] {
			ids = append(ids, id)
		}
	}
	return ids
}

// splitStale separates the events the ledger already holds a version of
// (or a newer one) from those to send, and fails those that reuse the
// ledger's version from another event. Only projections in latest keep one
// version per document; the events of the others are all sent.
func splitStale(events []outbox.Event, latest map[string]bool) (fresh []outbox.Event, stale []int64, reused []projection.Result) {
	fresh = events[:0:0]
	for _, e := range events {
		switch {
		case !latest[e.Projection]:
			fresh = append(fresh, e)
		case e.ReusesVersion():
			reused = append(reused, projection.Result{ID: e.ID, Err: projection.VersionReused(e, e.Applied.EventID)})
		case e.Stale():
			stale = append(stale, e.ID)
		default:
			fresh = append(fresh, e)
		}
	}
	return fresh, stale, reused
}

// process projects one claimed batch and records every outcome.
func (l *Loop) process(ctx context.Context, epoch int64, events []outbox.Event) BatchResult {
	start := time.Now()
	fresh, stale, reused := splitStale(events, l.latest)
	results := append(l.project(ctx, fresh), reused...)
	if ctx.Err() != nil {
		// Cancelled mid-flight: leadership lost or grace over. The rows stay
		// tracked; the drain or the next leader puts them back.
		return BatchResult{}
	}
	byID := make(map[int64]outbox.Event, len(events))
	for _, e := range events {
		byID[e.ID] = e
	}
	out := decide(byID, results, l.cfg)
	for _, id := range stale {
		out.done = append(out.done, id)
		out.superseded[id] = causeLedger
	}
	var res BatchResult
	claim := events[0].Claim // a batch is one claim
	l.ackDone(ctx, epoch, claim, byID, out, &res)
	l.ackFailed(ctx, epoch, claim, byID, out.failures, &res)
	fencedAcksTotal.Add(res.Fenced)
	elapsed := time.Since(start)
	batchDuration.Observe(elapsed.Seconds())
	l.log.Info().Int64("epoch", epoch).Int("events", len(events)).Int("done", res.Done).
		Int("superseded", res.Superseded).Int("retried", res.Retried).Int("failed", res.Failed).
		Int("fenced", res.Fenced).Float64("duration_ms", float64(elapsed.Microseconds())/1000).Msg("batch")
	return res
}

// decide turns each result into done, or a failure with its class, reason
// and next step: deterministic errors and the last attempt are terminal,
// the rest retry after a backoff.
func decide(byID map[int64]outbox.Event, results []projection.Result, cfg Config) outcome {
	out := outcome{superseded: map[int64]string{}}
	for _, r := range results {
		if r.Err == nil {
			out.done = append(out.done, r.ID)
			if r.Superseded {
				out.superseded[r.ID] = causeProjection
			}
			continue
		}
		ev := byID[r.ID]
		ce := classify.Classify(r.Err)
		f := outbox.Failure{ID: r.ID, Class: string(ce.Class), Reason: ce.Reason, Message: ce.Message}
		f.Terminal = ce.Class == classify.Deterministic || ev.Attempts+1 >= cfg.MaxAttempts
		if !f.Terminal {
			f.RetryIn = classify.Backoff(ev.Attempts, cfg.BaseBackoff, cfg.MaxBackoff, ce.RetryAfter)
		}
		out.failures = append(out.failures, f)
	}
	return out
}

// ackDone marks the done rows and counts them; a row the fencing guard
// refused counts as fenced. On a write error the lease brings them back.
func (l *Loop) ackDone(ctx context.Context, epoch, claim int64, byID map[int64]outbox.Event, out outcome, res *BatchResult) {
	ledger := l.ledgerIDs(byID, out.applied())
	acked, err := l.store.AckDone(ctx, epoch, claim, out.done, ledger)
	if err != nil {
		l.log.Error().Err(err).Int("events", len(out.done)).Msg("ack done failed; the lease will bring them back")
		return
	}
	l.untrack(out.done)
	l.order.record(ledgerEvents(byID, acked, ledger))
	for _, id := range out.done {
		ev := byID[id]
		secs, ok := acked[id]
		if !ok {
			res.Fenced++
			continue
		}
		res.Done++
		processedTotal(ev.Projection).Inc()
		eventLatency.Observe(secs)
		cause := out.superseded[id]
		if cause != "" {
			res.Superseded++
			supersededTotal(ev.Projection, cause).Inc()
		}
		if e := l.log.Debug(); e.Enabled() {
			logEvent(e, ev, ev.Attempts).Float64("latency_ms", secs*1000).Str("superseded", cause).Msg("event done")
		}
	}
}

// ackFailed records the failures (retry or terminal) and counts them.
func (l *Loop) ackFailed(ctx context.Context, epoch, claim int64, byID map[int64]outbox.Event, failures []outbox.Failure, res *BatchResult) {
	changed, err := l.store.AckFailed(ctx, epoch, claim, failures)
	if err != nil {
		l.log.Error().Err(err).Int("events", len(failures)).Msg("ack failed failed; the lease will bring them back")
		return
	}
	ok := make(map[int64]bool, len(changed))
	for _, id := range changed {
		ok[id] = true
	}
	ids := make([]int64, len(failures))
	for i, f := range failures {
		ids[i] = f.ID
		ev := byID[f.ID]
		if !ok[f.ID] {
			res.Fenced++
			continue
		}
		failedTotal(ev.Projection, f.Reason).Inc()
		if f.Terminal {
			res.Failed++
			terminalFailedTotal(ev.Projection, f.Reason).Inc()
		} else {
			res.Retried++
			retryScheduledTotal(ev.Projection, f.Reason).Inc()
		}
		logEvent(l.log.Warn(), ev, ev.Attempts+1).
			Str("error_class", f.Class).Str("error_reason", f.Reason).Str("error", f.Message).
			Bool("terminal", f.Terminal).Dur("retry_in", f.RetryIn).
			Float64("latency_ms", float64(time.Since(ev.CreatedAt).Microseconds())/1000).
			Msg("event failed")
	}
	l.untrack(ids)
}

// project groups the batch by projection and calls each handler once.
// Every event gets exactly one result.
func (l *Loop) project(ctx context.Context, events []outbox.Event) []projection.Result {
	groups := map[string][]outbox.Event{}
	var order []string
	for _, e := range events {
		if _, ok := groups[e.Projection]; !ok {
			order = append(order, e.Projection)
		}
		groups[e.Projection] = append(groups[e.Projection], e)
	}
	results := make([]projection.Result, 0, len(events))
	for _, name := range order {
		group := groups[name]
		h, ok := l.handlers[name]
		if !ok {
			err := classify.New(classify.UnknownProjection, fmt.Sprintf("no handler registered for projection %q", name))
			for _, e := range group {
				results = append(results, projection.Result{ID: e.ID, Err: err})
			}
			continue
		}
		results = append(results, complete(group, h.Handle(ctx, group))...)
	}
	return results
}

// complete guards against a handler that forgets an event: the missing ones
// fail as unknown (transient) rather than sit in processing until the lease.
func complete(group []outbox.Event, results []projection.Result) []projection.Result {
	seen := make(map[int64]bool, len(results))
	for _, r := range results {
		seen[r.ID] = true
	}
	for _, e := range group {
		if !seen[e.ID] {
			results = append(results, projection.Result{ID: e.ID, Err: errors.New("handler returned no result for this event")})
		}
	}
	return results
}

func logEvent(e *zerolog.Event, ev outbox.Event, attempts int) *zerolog.Event {
	e = e.Int64("event_id", ev.ID).Str("projection", ev.Projection).Str("entity_type", ev.EntityType).
		Str("entity_id", ev.EntityID).Str("op", ev.Op).Int("attempts", attempts)
	if ev.EventVersion != nil {
		e = e.Int64("event_version", *ev.EventVersion)
	}
	return e
}
