package consume

import (
	"context"
	"sync"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// The package's tracer is bound to the first global provider a test
// installs (OpenTelemetry's global delegates once), so the tests install
// one provider, once, whose processor hands each span to the recorder of
// the test running now. Tests that record spans are not parallel.
var (
	installSpans sync.Once
	spanSink     = &switchProcessor{}
)

type switchProcessor struct {
	mu  sync.Mutex
	rec *tracetest.SpanRecorder
}

func (p *switchProcessor) current() *tracetest.SpanRecorder {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rec
}

func (p *switchProcessor) OnStart(ctx context.Context, s sdktrace.ReadWriteSpan) {
	if r := p.current(); r != nil {
		r.OnStart(ctx, s)
	}
}

func (p *switchProcessor) OnEnd(s sdktrace.ReadOnlySpan) {
	if r := p.current(); r != nil {
		r.OnEnd(s)
	}
}

func (p *switchProcessor) Shutdown(context.Context) error   { return nil }
func (p *switchProcessor) ForceFlush(context.Context) error { return nil }

// recordSpans returns a recorder of the spans this test ends.
func recordSpans(t *testing.T) *tracetest.SpanRecorder {
	installSpans.Do(func() { otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spanSink))) })
	rec := tracetest.NewSpanRecorder()
	spanSink.mu.Lock()
	spanSink.rec = rec
	spanSink.mu.Unlock()
	t.Cleanup(func() {
		spanSink.mu.Lock()
		spanSink.rec = nil
		spanSink.mu.Unlock()
	})
	return rec
}
