package consume

import (
	"context"
	"errors"
	"time"

	"github.com/wlproj/wlproj/outbox"
)

// The acks of a processed batch: the done rows, with the ledger moved for
// the applied ones, and the failures, each under the fencing guard of the
// claim it came from.

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

// ledgerIDs is the subset of applied of the projections that keep a ledger,
// less the events not above the entry the batch knows (a repair of the
// ledger's own version): a document's entries are then written in order,
// each newer than those before it, which the lookup of the newest
// partition relies on (migration 00029). The event was still sent.
func (l *Loop) ledgerIDs(byID map[int64]outbox.Event, applied []int64) []int64 {
	ids := applied[:0:0]
	for _, id := range applied {
		e := byID[id]
		if l.latest[e.Projection] && above(outbox.Applied{Version: e.Version(), EventID: e.ID}, e.Applied) {
			ids = append(ids, id)
		}
	}
	return ids
}

// ackDone marks the done rows and counts them; a row the fencing guard
// refused counts as fenced. On a write error the lease brings them back.
func (l *Loop) ackDone(ctx context.Context, epoch, claim int64, byID map[int64]outbox.Event, out outcome, res *BatchResult) {
	ledger := l.ledgerIDs(byID, out.applied())
	ackDone := l.store.AckDone
	if claim == 0 {
		ackDone = func(ctx context.Context, epoch, _ int64, ids, applied []int64) (map[int64]float64, error) {
			return l.store.AckQueuedDone(ctx, epoch, ids, applied)
		}
	}
	acked, err := ackDone(ctx, epoch, claim, out.done, ledger)
	if errors.Is(err, outbox.ErrDeposed) {
		res.Fenced += len(out.done)
		return
	}
	if err != nil {
		res.AckErrors++
		countError(ctx, ackErrorsTotal, err)
		l.log.Error().Err(err).Int("events", len(out.done)).Msg("ack done failed; the lease will bring them back")
		return
	}
	l.untrack(out.done)
	l.order.record(ledgerEvents(byID, acked, ledger))
	// Counted per projection once per ack: naming the counter per event
	// (a Sprintf and a lookup under the metrics set's lock) was 4% of the
	// loop's CPU in the bench's Postgres path.
	processed := map[string]int{}
	defer func() {
		for p, n := range processed {
			processedTotal(p).Add(n)
		}
	}()
	for _, id := range out.done {
		ev := byID[id]
		secs, ok := acked[id]
		if !ok {
			res.countMissing(claim)
			continue
		}
		res.Done++
		processed[ev.Projection]++
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
	ackFailed := l.store.AckFailed
	if claim == 0 {
		ackFailed = func(ctx context.Context, epoch, _ int64, failures []outbox.Failure) ([]int64, error) {
			return l.store.AckQueuedFailed(ctx, epoch, failures)
		}
	}
	changed, err := ackFailed(ctx, epoch, claim, failures)
	if errors.Is(err, outbox.ErrDeposed) {
		res.Fenced += len(failures)
		return
	}
	if err != nil {
		res.AckErrors++
		countError(ctx, ackErrorsTotal, err)
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
			res.countMissing(claim)
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

// countMissing counts a row its ack did not change. A claimed row (claim
// set) is fenced: another claim or epoch owns it. A queued row's ack that
// the fencing guard let through (a refused one returns outbox.ErrDeposed)
// misses only rows that left the queue meanwhile: an earlier read's
// failure made one pending after this read took it (a rewind re-read it),
// or an operator discarded it. The claim path has them now, so the read
// is confirmed all the same.
func (r *BatchResult) countMissing(claim int64) {
	if claim == 0 {
		r.Unqueued++
		return
	}
	r.Fenced++
}
