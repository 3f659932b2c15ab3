package consume

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/wlproj/wlproj/classify"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
)

// A claimed batch, once its turn comes: the events the ledger already holds
// a newer version of are set aside, the rest go to their projections'
// handlers, and each result becomes an outcome (done, retry, failed) that
// ack.go writes.

// BatchResult summarises one processed batch.
type BatchResult struct {
	Done, Superseded, Retried, Failed, Fenced int
	// AckErrors counts the acks that could not be written: the batch's
	// events come back (a lease, or a queue's rewind).
	AckErrors int
	// Unqueued counts queued rows that left the queue between the read and
	// its ack (see countMissing): they are the claim path's now.
	Unqueued int
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
	fresh, stale = liveInBatch(fresh, stale, latest)
	return fresh, stale, reused
}

// liveInBatch sets aside, as stale, each repair delete whose document the
// batch also upserts by a producer's event at the delete's version or a
// newer one: once that upsert is acked the ledger says the document is
// live at that version, which a repair delete must never undo
// (outbox.Event.Stale), and the handler would send the repair first, as it
// does any repair of its version.
func liveInBatch(fresh []outbox.Event, stale []int64, latest map[string]bool) ([]outbox.Event, []int64) {
	upserted := map[docKey]int64{}
	for _, e := range fresh {
		if v, seen := upserted[keyOf(e)]; latest[e.Projection] && !e.Repair && e.Op == outbox.OpUpsert && (!seen || e.Version() > v) {
			upserted[keyOf(e)] = e.Version()
		}
	}
	if len(upserted) == 0 {
		return fresh, stale
	}
	kept := fresh[:0]
	for _, e := range fresh {
		if v, seen := upserted[keyOf(e)]; seen && e.Repair && e.Op == outbox.OpDelete && v >= e.Version() {
			stale = append(stale, e.ID)
			continue
		}
		kept = append(kept, e)
	}
	return kept, stale
}

// process projects one claimed batch and records every outcome.
func (l *Loop) process(ctx context.Context, epoch int64, f *flight) BatchResult {
	start := time.Now()
	events, projected := f.events, f.projected
	fresh, stale, reused := splitStale(events, l.latest)
	results := append(l.project(ctx, fresh), reused...)
	if projected != nil {
		projected()
	}
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
	claim := events[0].Claim // a batch is one claim, or one read of queued rows
	ackCtx, ack := tracer.Start(ctx, spanAck)
	l.ackDone(ackCtx, epoch, claim, byID, out, &res)
	l.ackFailed(ackCtx, epoch, claim, byID, out.failures, &res)
	if events[0].Queued {
		l.settleQueued(ackCtx, epoch, events, res)
	}
	ack.SetAttributes(resultAttributes(res)...)
	ack.End()
	trace.SpanFromContext(ctx).SetAttributes(resultAttributes(res)...)
	fencedAcksTotal.Add(res.Fenced)
	elapsed := time.Since(start)
	batchDuration.Observe(elapsed.Seconds())
	l.logBatch(epoch, f, res, start, elapsed)
	return res
}

// logBatch logs a processed batch with where its time went: the read that
// took it (read_ms), the wait from then to its processing (waited_ms:
// lanes, an earlier batch of its documents, the term's preparation), and
// how old its oldest event was when read (age_at_read_ms). A lag that is
// already there at the read is the loop's reading or the producer's
// commit; one that grows after it is the batch's.
func (l *Loop) logBatch(epoch int64, f *flight, res BatchResult, start time.Time, elapsed time.Duration) {
	oldest := f.events[0].CreatedAt
	for _, e := range f.events[1:] {
		if e.CreatedAt.Before(oldest) {
			oldest = e.CreatedAt
		}
	}
	l.log.Info().Int64("epoch", epoch).Int("events", len(f.events)).Int("done", res.Done).
		Int("superseded", res.Superseded).Int("retried", res.Retried).Int("failed", res.Failed).
		Int("fenced", res.Fenced).Int("unqueued", res.Unqueued).Float64("duration_ms", ms(elapsed)).
		Float64("read_ms", ms(f.readEnd.Sub(f.readStart))).Float64("waited_ms", ms(start.Sub(f.readEnd))).
		Float64("age_at_read_ms", ms(f.readEnd.Sub(oldest))).Msg("batch")
}

// ms is d in milliseconds, to the microsecond.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

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
		// Masked here, where the text is made, so that neither the row,
		// its history, the log line nor a span ever holds a masked value
		// an engine quoted (a mapping error quotes the refused value).
		message := cfg.Masks[ev.Projection].Text(ev.Payload, ce.Message)
		f := outbox.Failure{ID: r.ID, Class: string(ce.Class), Reason: ce.Reason, Message: message}
		f.Terminal = ce.Class == classify.Deterministic || ev.Attempts+1 >= cfg.MaxAttempts
		if !f.Terminal {
			f.RetryIn = classify.Backoff(ev.Attempts, cfg.BaseBackoff, cfg.MaxBackoff, ce.RetryAfter)
		}
		out.failures = append(out.failures, f)
	}
	return out
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
		bulkCtx, span := startBulk(ctx, name, len(group))
		rs := complete(group, h.Handle(bulkCtx, group))
		endBulk(span, rs)
		results = append(results, rs...)
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
