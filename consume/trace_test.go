package consume

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/outbox"
)

// A batch's span links to each well-formed producer traceparent, ignores
// malformed ones, and has the claim as a child spanning the claim's time.
// Not parallel: it records the spans of the package's tracer (recordSpans).
func TestStartBatchLinksProducerTraces(t *testing.T) {
	rec := recordSpans(t)

	const good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	events := []outbox.Event{
		{ID: 1, Claim: 9, Traceparent: good},
		{ID: 2, Claim: 9},
		{ID: 3, Claim: 9, Traceparent: "not-a-traceparent"},
		{ID: 4, Claim: 9, Traceparent: "00-00000000000000000000000000000000-00f067aa0ba902b7-01"}, // zero trace id
	}
	start := time.Now().Add(-time.Second)
	span := startBatch(context.Background(), 7, events, start, start.Add(time.Millisecond))
	span.End()

	ended := rec.Ended()
	require.Len(t, ended, 2)
	claim, batch := ended[0], ended[1]
	require.Equal(t, spanClaim, claim.Name())
	require.Equal(t, spanBatch, batch.Name())
	require.Equal(t, batch.SpanContext().SpanID(), claim.Parent().SpanID())
	require.Equal(t, start, batch.StartTime(), "back-dated to the claim")
	require.Equal(t, start.Add(time.Millisecond), claim.EndTime())

	links := batch.Links()
	require.Len(t, links, 1, "only the well-formed traceparent")
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", links[0].SpanContext.TraceID().String())
	require.Equal(t, "00f067aa0ba902b7", links[0].SpanContext.SpanID().String())
	require.Equal(t, attrEventID.Int64(1), links[0].Attributes[0])
}
