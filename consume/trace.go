package consume

import (
	"context"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
)

// A batch's trace: one span from the claim to the last ack, with the claim,
// each handler's bulk and the ack as children and the counts as attributes,
// linked to the producers' traces (outbox_events.traceparent). With tracing
// off (package tracing) the global provider is OpenTelemetry's no-op one:
// a few span starts per batch that record nothing, and nothing per event.

// Span names.
const (
	spanBatch = "wlproj.batch"
	spanClaim = "wlproj.claim"
	spanBulk  = "wlproj.bulk"
	spanAck   = "wlproj.ack"
)

// Attribute keys.
const (
	attrEvents     = attribute.Key("wlproj.events")
	attrEpoch      = attribute.Key("wlproj.epoch")
	attrClaim      = attribute.Key("wlproj.claim")
	attrProjection = attribute.Key("wlproj.projection")
	attrErrors     = attribute.Key("wlproj.errors")
	attrDone       = attribute.Key("wlproj.done")
	attrSuperseded = attribute.Key("wlproj.superseded")
	attrRetried    = attribute.Key("wlproj.retried")
	attrFailed     = attribute.Key("wlproj.failed")
	attrFenced     = attribute.Key("wlproj.fenced")
	attrEventID    = attribute.Key("wlproj.event_id")
)

var tracer = otel.Tracer("github.com/wlproj/wlproj/consume")

// startBatch starts a claimed batch's span, back-dated to the claim's
// start, with the claim as its first child and a link to each producer's
// trace. The SDK keeps the first 128 links of a span (OTEL_SPAN_LINK_COUNT_LIMIT).
func startBatch(ctx context.Context, epoch int64, events []outbox.Event, claimStart, claimEnd time.Time) trace.Span {
	ctx, span := tracer.Start(ctx, spanBatch, trace.WithTimestamp(claimStart), trace.WithSpanKind(trace.SpanKindConsumer))
	if !span.IsRecording() {
		return span
	}
	span.SetAttributes(attrEpoch.Int64(epoch), attrClaim.Int64(events[0].Claim), attrEvents.Int(len(events)))
	_, claim := tracer.Start(ctx, spanClaim, trace.WithTimestamp(claimStart))
	claim.SetAttributes(attrEvents.Int(len(events)))
	claim.End(trace.WithTimestamp(claimEnd))
	var tc propagation.TraceContext
	for _, e := range events {
		if e.Traceparent == "" {
			continue
		}
		sc := trace.SpanContextFromContext(tc.Extract(context.Background(), propagation.MapCarrier{"traceparent": e.Traceparent}))
		if sc.IsValid() {
			span.AddLink(trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{attrEventID.Int64(e.ID)}})
		}
	}
	return span
}

// startBulk starts the span of one handler call.
func startBulk(ctx context.Context, projection string, events int) (context.Context, trace.Span) {
	return tracer.Start(ctx, spanBulk, trace.WithAttributes(attrProjection.String(projection), attrEvents.Int(events)))
}

// endBulk ends a handler call's span with its count of failed events.
func endBulk(span trace.Span, results []projection.Result) {
	if span.IsRecording() {
		errs := 0
		for _, r := range results {
			if r.Err != nil {
				errs++
			}
		}
		span.SetAttributes(attrErrors.Int(errs))
	}
	span.End()
}

// resultAttributes are a batch's (or its ack's) counts.
func resultAttributes(res BatchResult) []attribute.KeyValue {
	return []attribute.KeyValue{attrDone.Int(res.Done), attrSuperseded.Int(res.Superseded), attrRetried.Int(res.Retried),
		attrFailed.Int(res.Failed), attrFenced.Int(res.Fenced)}
}
