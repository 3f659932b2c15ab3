package console

import (
	"net/http"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/wlproj/wlproj/policy"
)

var tracer = otel.Tracer("github.com/wlproj/wlproj/console")

// traced runs h inside a span of the request, named for its route, with
// the actor and the request id: the id the audit row and the log lines
// carry, so that one finds the others. With tracing off (package tracing)
// the provider is the no-op one.
func traced(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		a := policy.From(r.Context())
		if a == nil {
			h(w, r)
			return
		}
		ctx, span := tracer.Start(r.Context(), "wlproj.console "+r.Pattern, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("wlproj.request_id", a.RequestID), attribute.String("wlproj.user", a.User),
				attribute.String("wlproj.auth", a.Auth), attribute.StringSlice("wlproj.roles", a.Roles)))
		defer span.End()
		h(w, r.WithContext(ctx))
	}
}
